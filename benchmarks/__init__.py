"""kingen's benchmark suites; run them with ``python -m benchmarks SUITE`` (see README.md)."""
