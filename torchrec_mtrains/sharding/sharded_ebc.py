"""ShardedTieredEmbeddingBagCollection: TorchRec's sharded EBC with tiered tables in it
(their state: ``tiered_state.py``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torchrec.distributed.embedding_sharding import (
    EmbeddingSharding,
    EmbeddingShardingInfo,
)
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.types import QuantizedCommCodecs, ShardingEnv, ShardingType

from torchrec_mtrains.sharding.lookup import TIERED_SHARDINGS
from torchrec_mtrains.sharding.tiered_state import TieredTablesState, join_tier_params, tiered_sharding_class

__all__ = ["ShardedTieredEmbeddingBagCollection"]


class ShardedTieredEmbeddingBagCollection(TieredTablesState, ShardedEmbeddingBagCollection):
    TABLES_ATTR = "embedding_bags"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_tiered_state()

    @classmethod
    def create_embedding_bag_sharding(
        cls,
        sharding_infos: List[EmbeddingShardingInfo],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        permute_embeddings: bool = False,
        qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
    ) -> EmbeddingSharding:
        tiered = join_tier_params(sharding_infos)
        if not tiered:
            return super().create_embedding_bag_sharding(
                sharding_infos, env, device, permute_embeddings, qcomm_codecs_registry
            )
        sharding_type = sharding_infos[0].param_sharding.sharding_type
        sharding_cls = tiered_sharding_class(TIERED_SHARDINGS, sharding_type, tiered)
        kwargs: Dict[str, Any] = {"qcomm_codecs_registry": qcomm_codecs_registry}
        if sharding_type == ShardingType.COLUMN_WISE.value:
            kwargs["permute_embeddings"] = permute_embeddings
        return sharding_cls(sharding_infos, env, device, **kwargs)
