"""Backing stores below the row cache: DRAM, SCM (memory-mapped file) and the block-SSD store."""

from torchrec_mtrains.storage.block_store import BlockStore, StoreRuntimeConfig, TableConfig
from torchrec_mtrains.storage.dram_store import DramStore
from torchrec_mtrains.storage.lazy_init import lazy_init_rows
from torchrec_mtrains.storage.scm_store import ScmStore
from torchrec_mtrains.storage.types import CorruptionError, RowStore

__all__ = [
    "BlockStore",
    "CorruptionError",
    "DramStore",
    "RowStore",
    "ScmStore",
    "StoreRuntimeConfig",
    "TableConfig",
    "lazy_init_rows",
]
