"""Benchmarks that print figures; none passes or fails on time."""
