"""Benchmark scripts, each run from the checkout's root as ``python -m benchmarks.NAME`` (see benchmarks/README.md)."""
