"""Benchmarks (``./dev bench``): incremental refresh against full recompute."""
