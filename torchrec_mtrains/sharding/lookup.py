"""The lookup and sharding classes that build tiered kernels for CUSTOMIZED_KERNEL tables,
pooled (EmbeddingBagCollection) and sequence (EmbeddingCollection) ones.

TorchRec has no kernel registry; its ``CUSTOMIZED_KERNEL`` slot passes plan validation and
reaches the lookup's ``_create_embedding_kernel``, which we override. Each sharding type
needs a sharding subclass whose ``create_lookup`` builds our lookup: ``TIERED_SHARDINGS``
maps the sharding type to it. Other kernels (FUSED, DENSE) in the same sharding keep
TorchRec's own kernels.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_lookup import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_sharding import EmbeddingSharding
from torchrec.distributed.embedding_types import (
    BaseEmbeddingLookup,
    BaseGroupedFeatureProcessor,
    EmbeddingComputeKernel,
    GroupedEmbeddingConfig,
)
from torchrec.distributed.sharding.cw_sequence_sharding import CwSequenceEmbeddingSharding
from torchrec.distributed.sharding.cw_sharding import CwPooledEmbeddingSharding
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.sharding.tw_sequence_sharding import TwSequenceEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingEnv, ShardingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains.sharding.kernel import TieredBatchedEmbeddingBag, place_vbe_output

__all__ = [
    "TIERED_SEQUENCE_SHARDINGS", "TIERED_SHARDINGS", "TieredGroupedEmbeddingsLookup",
    "TieredGroupedPooledEmbeddingsLookup",
]


class _TieredKernelsLookup:
    """Mixed into a TorchRec lookup: ``prefetch()`` reaches its tiered kernels too."""

    def prefetch(self, sparse_features: KeyedJaggedTensor, forward_stream: Optional[Any] = None) -> None:
        super().prefetch(sparse_features, forward_stream)  # TorchRec's own cached kernels
        if not self._emb_modules:
            return
        for emb, features in zip(self._emb_modules, sparse_features.split(self._feature_splits)):
            if isinstance(emb, TieredBatchedEmbeddingBag):
                emb.prefetch(features)

    def tiered_kernels(self):
        return [m for m in self._emb_modules if isinstance(m, TieredBatchedEmbeddingBag)]


class TieredGroupedPooledEmbeddingsLookup(_TieredKernelsLookup, GroupedPooledEmbeddingsLookup):
    """TorchRec's pooled lookup, with tiered kernels for CUSTOMIZED_KERNEL groups.

    With a variable batch per feature (VBE) and several kernels, TorchRec hands each kernel
    one preallocated output to fill in place, which FBGEMM's CPU TBE refuses; on the CPU each
    kernel's own VBE output is put in its place of the merged one instead."""

    def _forward_with_vbe_merging(self, features_by_group: List[KeyedJaggedTensor],
                                  device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return super()._forward_with_vbe_merging(features_by_group, device)
        vbe_output, vbe_offsets = self._create_vbe_output_and_offsets(self._vbe_splits(features_by_group), device)
        for config, emb_op, features, offsets in zip(self.grouped_configs, self._emb_modules, features_by_group,
                                                      vbe_offsets):
            features = self._apply_feature_processor_and_gradient_scaling(features, config)
            out = emb_op(features)
            vbe_output = place_vbe_output(out, features.stride_per_key_per_rank(), config.embedding_dims(),
                                          vbe_output, torch.tensor(offsets))
            if self.optim_state_tracker_fn is not None:
                self.optim_state_tracker_fn(features, vbe_output, emb_op)
        return vbe_output

    def _create_embedding_kernel(
        self,
        config: GroupedEmbeddingConfig,
        device: Optional[torch.device],
        pg: Optional[dist.ProcessGroup],
        sharding_type: Optional[ShardingType],
        env: Optional[ShardingEnv],
    ) -> BaseEmbedding:
        if config.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return TieredBatchedEmbeddingBag(config, pg=pg, device=device, sharding_type=sharding_type)
        return super()._create_embedding_kernel(config, device, pg, sharding_type, env)


class TieredGroupedEmbeddingsLookup(_TieredKernelsLookup, GroupedEmbeddingsLookup):
    """TorchRec's sequence lookup (EmbeddingCollection: a row per id), with tiered kernels
    (PoolingMode.NONE) for CUSTOMIZED_KERNEL groups."""

    def _create_embedding_kernel(
        self,
        config: GroupedEmbeddingConfig,
        pg: Optional[dist.ProcessGroup],
        device: Optional[torch.device],
        env: Optional[ShardingEnv] = None,
    ) -> BaseEmbedding:
        if config.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return TieredBatchedEmbeddingBag(config, pg=pg, device=device)
        return super()._create_embedding_kernel(config, pg, device, env)


def _with_lookup(base: Type[EmbeddingSharding], lookup: Type[BaseEmbeddingLookup],
                 **extra: Any) -> Type[EmbeddingSharding]:
    """``base`` whose ``create_lookup`` builds ``lookup`` (with ``extra`` arguments)."""
    pooled = lookup is TieredGroupedPooledEmbeddingsLookup

    def create_lookup(
        self,
        device: Optional[torch.device] = None,
        fused_params: Optional[Dict[str, Any]] = None,
        feature_processor: Optional[BaseGroupedFeatureProcessor] = None,
    ) -> BaseEmbeddingLookup:
        kwargs = {"feature_processor": feature_processor} if pooled else {}
        return lookup(grouped_configs=self._grouped_embedding_configs, pg=self._pg,
                      device=device if device is not None else self._device, env=self._env, **kwargs, **extra)

    return type(f"Tiered{base.__name__}", (base,), {"create_lookup": create_lookup, "__module__": __name__})


def _with_tiered_lookup(base: Type[EmbeddingSharding], sharding_type: Optional[ShardingType]) -> Type[EmbeddingSharding]:
    return _with_lookup(base, TieredGroupedPooledEmbeddingsLookup, sharding_type=sharding_type)


def _with_sequence_lookup(base: Type[EmbeddingSharding]) -> Type[EmbeddingSharding]:
    return _with_lookup(base, TieredGroupedEmbeddingsLookup)


TieredTwPooledEmbeddingSharding = _with_tiered_lookup(TwPooledEmbeddingSharding, None)
TieredRwPooledEmbeddingSharding = _with_tiered_lookup(RwPooledEmbeddingSharding, ShardingType.ROW_WISE)
TieredCwPooledEmbeddingSharding = _with_tiered_lookup(CwPooledEmbeddingSharding, None)

# Sharding type -> its sharding class with tiered lookups.
TIERED_SHARDINGS: Dict[str, Type[EmbeddingSharding]] = {
    ShardingType.TABLE_WISE.value: TieredTwPooledEmbeddingSharding,
    ShardingType.ROW_WISE.value: TieredRwPooledEmbeddingSharding,
    ShardingType.COLUMN_WISE.value: TieredCwPooledEmbeddingSharding,
}

# The same for an EmbeddingCollection's (sequence) shardings.
TIERED_SEQUENCE_SHARDINGS: Dict[str, Type[EmbeddingSharding]] = {
    ShardingType.TABLE_WISE.value: _with_sequence_lookup(TwSequenceEmbeddingSharding),
    ShardingType.ROW_WISE.value: _with_sequence_lookup(RwSequenceEmbeddingSharding),
    ShardingType.COLUMN_WISE.value: _with_sequence_lookup(CwSequenceEmbeddingSharding),
}
