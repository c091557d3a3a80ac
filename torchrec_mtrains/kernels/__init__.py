"""Compute kernels: FBGEMM's TBE over a row cache backed by a DRAM, SCM or SSD tier."""

from torchrec_mtrains.kernels.tiered_embedding_bags import TieredEmbeddingBags

__all__ = ["TieredEmbeddingBags"]
