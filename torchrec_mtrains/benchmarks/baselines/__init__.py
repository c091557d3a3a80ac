"""Baselines of the store benchmark, one module each: ``rocksdb``, ``fio``, ``memmap``.

Every baseline returns :class:`~torchrec_mtrains.benchmarks.types.PhaseResult` values
keyed by phase name, or raises :class:`~torchrec_mtrains.benchmarks.types.BaselineUnavailable`
with the reason when it cannot run here (the benchmark then reports it as skipped).
"""

__all__: list[str] = []
