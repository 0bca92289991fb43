"""What tests and benchmarks share: free ports, test audio, and waits on a real signal."""
