"""The benchmarks of a source checkout (not shipped with the package): entry points
``bench_*.py``, their implementations in ``benchmarks.lib``, configs in ``configs/``."""

__all__: list[str] = []
