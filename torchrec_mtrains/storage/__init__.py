"""Backing stores below the row cache: DRAM, SCM (mmap / NUMA) and the block-SSD store."""

from torchrec_mtrains.storage.block_store import BlockStore, StoreRuntimeConfig, TableConfig
from torchrec_mtrains.storage.types import CorruptionError, RowStore

__all__ = ["BlockStore", "CorruptionError", "RowStore", "StoreRuntimeConfig", "TableConfig"]
