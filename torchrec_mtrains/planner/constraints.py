"""TorchRec's ParameterConstraints in the StorageAwarePlanner: what they pin and how a
``key_value`` table's plan entry is written.

A table constrained to ``compute_kernels=["key_value"]`` stays on Tier.SSD, its cache the
``CacheParams.load_factor`` given (else sized by placement), its hit-rate curve from
``CacheParams.stats`` (a TorchRec ``CacheStatistics``) unless ``locality`` names the table;
its plan entry is TorchRec's (``compute_kernel="key_value"`` with its ``KeyValueParams`` and
``CacheParams``), which the tiered sharder turns into a tiered SSD table on each rank (so
``@local_rank`` is replaced there). A table constrained to FBGEMM's kernels only (``fused``,
``dense``, ...) stays whole in the compute tier. A virtual table constrained to one of
TorchRec's virtual-table kernels stays on that kernel's tier (``dram_virtual_table``:
Tier.DRAM; ``ssd_virtual_table``, ``dram_ssd_virtual_table``: Tier.SSD), its cache the
``CacheParams.load_factor`` of its live ids if given. ``sharding_types`` limit a table's
sharding options.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheParams, CacheStatistics, ParameterSharding

from torchrec_mtrains.planner.model.locality import LocalityCurve
from torchrec_mtrains.planner.model.model_spec import ModelTable
from torchrec_mtrains.sharding.virtual_tables import VIRTUAL_KERNELS
from torchrec_mtrains.types import Tier

__all__ = ["constrained_table", "is_key_value", "key_value_entry", "stats_locality"]

_KEY_VALUE = EmbeddingComputeKernel.KEY_VALUE.value
_TIERED = {_KEY_VALUE, EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value, *VIRTUAL_KERNELS}
_CURVE_POINTS = 64


def is_key_value(constraint: Optional[ParameterConstraints]) -> bool:
    """Whether the constraint keeps the table on TorchRec's KEY_VALUE kernel (Tier.SSD)."""
    kernels = set(getattr(constraint, "compute_kernels", None) or ())
    return _KEY_VALUE in kernels and EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value not in kernels


def stats_locality(stats: CacheStatistics, num_rows: int) -> LocalityCurve:
    """A hit-rate curve (LRU and LFU alike) from TorchRec's ``CacheStatistics`` of a table."""
    sizes = np.unique(np.geomspace(1, num_rows, _CURVE_POINTS).round())
    hits = np.maximum.accumulate(np.array([1.0 - stats.expected_miss_rate(s / num_rows) for s in sizes]))
    return LocalityCurve(float(stats.expected_lookups), sizes, hits, hits.copy())


def constrained_table(table: ModelTable, constraint: Optional[ParameterConstraints], compute_tier: Tier,
                      has_locality: bool) -> ModelTable:
    """``table`` with what ``constraint`` pins (tier, cache rows) and its curve from
    ``CacheParams.stats`` (unless ``has_locality``: the planner's ``locality`` names it)."""
    kernels = set(getattr(constraint, "compute_kernels", None) or ())
    if not kernels:
        return table
    cache: Optional[CacheParams] = constraint.cache_params
    changes: dict = {}
    virtual = sorted(kernels & set(VIRTUAL_KERNELS))
    if virtual and table.virtual:
        changes["pinned_tier"] = VIRTUAL_KERNELS[virtual[0]]
        if cache is not None and cache.load_factor is not None:
            changes["pinned_cache_rows"] = float(cache.load_factor) * table.num_embeddings
    elif is_key_value(constraint):
        changes["pinned_tier"] = Tier.SSD
        if cache is not None and cache.load_factor is not None:
            changes["pinned_cache_rows"] = float(cache.load_factor) * table.num_embeddings
        if cache is not None and cache.stats is not None and not has_locality:
            changes["locality"] = stats_locality(cache.stats, table.num_embeddings)
    elif not kernels & _TIERED:
        changes["pinned_tier"] = compute_tier  # FBGEMM's kernels: the table whole
    return dataclasses.replace(table, **changes)


def key_value_entry(ps: ParameterSharding, constraint: ParameterConstraints, cache_rows: float, num_rows: int,
                    algorithm: Any) -> ParameterSharding:
    """TorchRec's plan entry of a key_value table: ``ps``'s shards, the KEY_VALUE kernel,
    the constraint's KeyValueParams, its CacheParams with the placed cache's load factor
    (and ``algorithm`` where it names none)."""
    cache = constraint.cache_params or CacheParams()
    cache = dataclasses.replace(cache, load_factor=max(1.0, cache_rows) / num_rows,
                                algorithm=cache.algorithm if cache.algorithm is not None else algorithm)
    fields = {f.name: getattr(ps, f.name) for f in dataclasses.fields(ParameterSharding)}
    fields.update(compute_kernel=_KEY_VALUE, key_value_params=constraint.key_value_params, cache_params=cache)
    return ParameterSharding(**fields)
