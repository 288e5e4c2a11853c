"""Workloads, load drivers and benchmarks."""
