"""Compute kernels: FBGEMM's TBE over a row cache backed by a DRAM, SCM or SSD tier."""

from torchrec_mtrains.kernels.config import DEFAULT_CACHE_LOAD_FACTOR, TieredConfig
from torchrec_mtrains.kernels.tiered_embedding_bags import TieredEmbeddingBags
from torchrec_mtrains.kernels.virtual_rows import EvictionSpec, VirtualTableFull, VirtualTableSpec

__all__ = ["DEFAULT_CACHE_LOAD_FACTOR", "EvictionSpec", "TieredConfig", "TieredEmbeddingBags", "VirtualTableFull",
           "VirtualTableSpec"]
