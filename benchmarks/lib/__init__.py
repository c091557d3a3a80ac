"""Side-by-side benchmarks of torchrec_mtrains against baselines measured in the same run.

Each benchmark is a module with ``main(argv)`` (``mtrains bench <name>`` calls it):

- :mod:`benchmarks.lib.store`: the block store (``BlockStore``) vs RocksDB
  through its C++ API, ``numpy.memmap`` and fio's device limits.
- :mod:`benchmarks.lib.kernel`: ``TieredEmbeddingBags`` on the SCM and SSD
  tiers vs FBGEMM's TBE with the table in DRAM, fio's device limits, and LRU / LFU hit
  rates vs Belady's optimum.
"""

__all__: list[str] = []
