"""Tools for development, tests and benchmarks (not installed): the loopback LiveKit server."""
