"""The pieces of `python -m sglang.bench_serving`: request datasets, streaming HTTP clients per
backend, metrics of a run, and the comparison plot."""
