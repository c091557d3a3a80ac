"""Baselines of the store benchmark, one module each: ``rocksdb``, ``fio``, ``memmap``.

Every baseline returns :class:`~benchmarks.lib.types.PhaseResult` values
keyed by phase name, or raises :class:`~benchmarks.lib.types.BaselineUnavailable`
with the reason when it cannot run here (the benchmark then reports it as skipped).
"""

__all__: list[str] = []
