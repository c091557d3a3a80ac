"""The tiered sharders as TorchRec's model-parallel harness takes its test sharders
(tests/support/torchrec_harness.py).

TorchRec's test sharders (``TestEBCSharder`` built by ``create_test_sharder``, and
``TestEmbeddingCollectionSharder``) are its sharders restricted to one sharding type and
one compute kernel, with ``fused_params={"learning_rate": 0.1}`` and the qcomm codecs of a
``QCommsConfig``. These are the same over ``TieredEmbeddingBagCollectionSharder`` and
``TieredEmbeddingCollectionSharder``: one sharding type; FUSED, plus the kernels only our
sharders offer on the CPU (``key_value``, ``customized_kernel``), which TorchRec's planner
uses only for tables whose constraints name them. They also carry the ``TieredParams`` of
chosen tables: those tables are planned as FUSED ones, and ``shard()`` hands our sharder
their plan entries as ``TieredParameterSharding`` (``customized_kernel``) with the planner's
sharding type, ranks and shards kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.fbgemm_qcomm_codec import QCommsConfig, get_qcomm_codecs_registry
from torchrec.distributed.types import ParameterSharding

from torchrec_mtrains.sharding import (
    TieredEmbeddingBagCollectionSharder,
    TieredEmbeddingCollectionSharder,
    TieredParameterSharding,
    TieredParams,
)

__all__ = ["tiered_test_sharder"]

_FUSED = EmbeddingComputeKernel.FUSED.value
_CUSTOM = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
_OURS_ONLY = (EmbeddingComputeKernel.KEY_VALUE.value, _CUSTOM)


class _HarnessSharder:
    """What TorchRec's test sharders do to theirs, and the tier entries of chosen tables."""

    _sharding_type: str
    _tiers: Dict[str, TieredParams]
    tiered_shards: Set[Tuple[str, str]]  # (table, tier name) of this rank's tiered shards

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [self._sharding_type]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        offered = super().compute_kernels(sharding_type, compute_device_type)  # type: ignore[misc]
        return [_FUSED] + [k for k in offered if k in _OURS_ONLY]

    def shard(self, module: Any, params: Dict[str, ParameterSharding], *args: Any, **kwargs: Any) -> Any:
        sharded = super().shard(module, self._with_tiers(params), *args, **kwargs)  # type: ignore[misc]
        # What went where on this rank: (table, tier) of every local shard of a tiered kernel.
        for kernel in sharded.tiered_kernels():
            for t, table in kernel.shards():
                self.tiered_shards.add((table.name, kernel.table_params[t].tier.name))
        return sharded

    def _with_tiers(self, params: Mapping[str, ParameterSharding]) -> Dict[str, ParameterSharding]:
        out = dict(params)
        for table, tier in self._tiers.items():
            if table not in out:
                continue  # a table of another collection of the model (e.g. the weighted one)
            planned = out[table]
            if planned.compute_kernel != _FUSED:
                raise ValueError(f"table {table}: planned on {planned.compute_kernel!r}; a tier takes a FUSED entry")
            fields = {f.name: getattr(planned, f.name) for f in dataclasses.fields(ParameterSharding)}
            out[table] = TieredParameterSharding(**{**fields, "compute_kernel": _CUSTOM}, tiered=tier)
        return out


class HarnessTieredEBCSharder(_HarnessSharder, TieredEmbeddingBagCollectionSharder):
    def __init__(self, sharding_type: str, tiers: Mapping[str, TieredParams], fused_params: Dict[str, Any],
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        self._sharding_type = sharding_type
        self._tiers = dict(tiers)
        self.tiered_shards = set()
        super().__init__(fused_params, qcomm_codecs_registry)


class HarnessTieredECSharder(_HarnessSharder, TieredEmbeddingCollectionSharder):
    def __init__(self, sharding_type: str, tiers: Mapping[str, TieredParams], fused_params: Dict[str, Any],
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        self._sharding_type = sharding_type
        self._tiers = dict(tiers)
        self.tiered_shards = set()
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)


def tiered_test_sharder(collection: str, sharding_type: str, tiers: Mapping[str, TieredParams],
                        qcomms_config: Optional[QCommsConfig] = None):
    """Our sharder of ``collection`` ("ebc" or "ec") as TorchRec's harness builds its own
    (``create_test_sharder`` for bags, ``TestEmbeddingCollectionSharder`` for sequences):
    the same fused_params and qcomm codecs."""
    if collection == "ebc":
        registry = get_qcomm_codecs_registry(qcomms_config, device=torch.device("cpu")) if qcomms_config else {}
        return HarnessTieredEBCSharder(sharding_type, tiers, {"learning_rate": 0.1}, registry)
    if collection == "ec":
        registry = get_qcomm_codecs_registry(qcomms_config) if qcomms_config else {}
        return HarnessTieredECSharder(sharding_type, tiers, {"learning_rate": 0.1}, registry)
    raise ValueError(f"collection={collection!r} must be 'ebc' or 'ec'")
