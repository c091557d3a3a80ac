"""TieredEmbeddingBagCollectionSharder and TieredEmbeddingCollectionSharder: pass them to
DistributedModelParallel."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from torchrec_mtrains.sharding import torchrec_planner  # noqa: F401  (TorchRec's planner on the CPU)
from torchrec_mtrains.sharding.key_value import as_tiered_plan
from torchrec_mtrains.sharding.lookup import TIERED_SHARDINGS
from torchrec_mtrains.sharding.sharded_ebc import ShardedTieredEmbeddingBagCollection
from torchrec_mtrains.sharding.sharded_ec import ShardedTieredEmbeddingCollection
from torchrec_mtrains.sharding.virtual_tables import VIRTUAL_KERNELS

__all__ = ["TieredEmbeddingBagCollectionSharder", "TieredEmbeddingCollectionSharder"]

_CPU_KERNELS = (EmbeddingComputeKernel.CUSTOMIZED_KERNEL, EmbeddingComputeKernel.KEY_VALUE)
# TorchRec's virtual-table kernels (virtual_tables.py), offered for row-wise sharding only:
# their buckets are rows of a row-wise plan.
_VIRTUAL_SHARDINGS = (ShardingType.ROW_WISE.value,)


class _TieredKernels:
    """The kernels and sharding types a tiered sharder offers besides TorchRec's own."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        # TorchRec lists no row-wise sharding for CPU; the tiered sharders train it there
        # (tiered and FUSED tables alike: tests/sharding/test_sharding_dmp.py), so planners
        # may propose it.
        types = list(super().sharding_types(compute_device_type))
        return types + [t for t in TIERED_SHARDINGS if t not in types]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        kernels = list(super().compute_kernels(sharding_type, compute_device_type))
        if sharding_type in TIERED_SHARDINGS and compute_device_type == "cpu":
            # KEY_VALUE is TorchRec's word for an SSD table; on the CPU it runs on our kernel.
            kernels += [k.value for k in _CPU_KERNELS if k.value not in kernels]
            if sharding_type in _VIRTUAL_SHARDINGS:  # virtual tables: TorchRec's CUDA-only kernels
                kernels += [k for k in VIRTUAL_KERNELS if k not in kernels]
        return kernels


class TieredEmbeddingBagCollectionSharder(_TieredKernels, EmbeddingBagCollectionSharder):
    """TorchRec's EBC sharder that also offers the tiered kernel (``CUSTOMIZED_KERNEL``)
    for table-wise, row-wise and column-wise sharding; plain tables keep FBGEMM's kernels.
    On the CPU it offers TorchRec's ``KEY_VALUE`` kernel too, and trains such tables on the
    block store (Tier.SSD) behind the tiered kernel, set by their plan entry's
    ``KeyValueParams`` and ``CacheParams`` (see ``key_value.py`` and docs/sharding.md); and
    for row-wise sharding the virtual-table kernels (``dram_virtual_table``,
    ``ssd_virtual_table``, ``dram_ssd_virtual_table``: ``virtual_tables.py`` and
    docs/virtual-tables.md).

    ``fused_params`` are TorchRec's (optimizer, learning_rate, eps, ...) and apply to
    tiered and plain tables alike, at FBGEMM's defaults where they are silent (EXACT_SGD);
    a key a tiered table cannot honour is refused naming it (``fused_params.py``). The tier
    settings of each table come from its plan entry (``TieredParameterSharding``: see
    ``tiered_sharding_plan`` and the planner).
    """

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> ShardedTieredEmbeddingBagCollection:
        configs = module.embedding_bag_configs()
        data_types = {c.name: c.data_type for c in configs}
        virtual = {c.name: bool(c.use_virtual_table) for c in configs}
        return ShardedTieredEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=as_tiered_plan(params, data_types, virtual=virtual),
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
        )

    @property
    def sharded_module_type(self):
        return ShardedTieredEmbeddingBagCollection


class TieredEmbeddingCollectionSharder(_TieredKernels, EmbeddingCollectionSharder):
    """TorchRec's EmbeddingCollection sharder (a row per id: sequence models) with the same
    tiered, ``key_value`` and virtual-table kernels as ``TieredEmbeddingBagCollectionSharder``,
    for table-wise, row-wise and column-wise sharding on the CPU; the cached rows are looked
    up by FBGEMM's TBE with ``PoolingMode.NONE``. A kernel holds tables of one dim (as
    FBGEMM's sequence TBE does).
    """

    def shard(
        self,
        module: EmbeddingCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> ShardedTieredEmbeddingCollection:
        configs = module.embedding_configs()
        data_types = {c.name: c.data_type for c in configs}
        virtual = {c.name: bool(c.use_virtual_table) for c in configs}
        return ShardedTieredEmbeddingCollection(
            module,
            as_tiered_plan(params, data_types, virtual=virtual),
            env,
            self.fused_params,
            device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            use_index_dedup=self._use_index_dedup,
            module_fqn=module_fqn,
        )

    @property
    def sharded_module_type(self):
        return ShardedTieredEmbeddingCollection
