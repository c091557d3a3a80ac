"""ShardedTieredEmbeddingCollection: TorchRec's sharded EmbeddingCollection (a row per id,
as sequence models look ids up) with tiered tables in it (their state: ``tiered_state.py``)."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embedding_sharding import EmbeddingSharding, EmbeddingShardingInfo
from torchrec.distributed.types import QuantizedCommCodecs, ShardingEnv

from torchrec_mtrains.sharding.lookup import TIERED_SEQUENCE_SHARDINGS
from torchrec_mtrains.sharding.tiered_state import TieredTablesState, join_tier_params, tiered_sharding_class

__all__ = ["ShardedTieredEmbeddingCollection"]


class ShardedTieredEmbeddingCollection(TieredTablesState, ShardedEmbeddingCollection):
    TABLES_ATTR = "embeddings"
    CONFIGS_ATTR = "_embedding_configs"

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        # TorchRec's __init__ ends with load_state_dict(module.state_dict()) (the unsharded
        # module's weights, unless on the meta device): the tiered tables' placeholders and
        # hooks must be in place by then, so that their weights go to the tiers.
        super()._initialize_torch_state(skip_registering)
        self._register_placeholders()
        if not getattr(self, "_tiered_hooks", False):
            self._init_tiered_state()
            self._tiered_hooks = True

    @classmethod
    def create_embedding_sharding(
        cls,
        sharding_type: str,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> EmbeddingSharding:
        tiered = join_tier_params(sharding_infos)
        if not tiered:
            return super().create_embedding_sharding(sharding_type, sharding_infos, env, device,
                                                     qcomm_codecs_registry)
        sharding_cls = tiered_sharding_class(TIERED_SEQUENCE_SHARDINGS, sharding_type, tiered)
        return sharding_cls(sharding_infos=sharding_infos, env=env, device=device,
                            qcomm_codecs_registry=qcomm_codecs_registry)
