"""Ingest and query benchmarks for the profiling server (`./dev bench`, see docs/benchmarks.md)."""
