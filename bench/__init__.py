"""crihook benchmarks: a fake runtime, a closed-loop load generator and the side-by-side runner.

Run from the repository root: ``python -m bench.run`` (see bench/README.md).
"""
