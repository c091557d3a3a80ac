"""Side-by-side benchmarks of torchrec_mtrains against baselines measured in the same run.

Each benchmark is a module with ``main(argv)`` (``mtrains bench <name>`` calls it):

- :mod:`torchrec_mtrains.benchmarks.store`: the block store (``BlockStore``) vs RocksDB
  through its C++ API, ``numpy.memmap`` and fio's device limits.
"""

__all__: list[str] = []
