"""Tiered tables inside TorchRec: sharder, plan helpers, train pipeline, checkpoints.

    sharder = TieredEmbeddingBagCollectionSharder()
    plan = tiered_sharding_plan(ebc, {"t0": TieredParams(Tier.SSD, cache_load_factor=0.1,
                                      storage_dir="/nvme/emb"), "t1": None}, world_size)
    model = DistributedModelParallel(model, plan=ShardingPlan({"sparse.ebc": plan}),
                                     sharders=[sharder])

``TieredEmbeddingCollectionSharder`` does the same for an EmbeddingCollection (a row per id:
sequence models). On the CPU the sharders also train TorchRec's ``key_value`` tables (ParameterConstraints with
KeyValueParams / CacheParams, planned by TorchRec's planner or ours) on the SSD tier: see
``key_value``.
"""

from torchrec_mtrains.sharding.kernel import (
    TieredBatchedEmbeddingBag,
    TieredFusedOptimizer,
)
from torchrec_mtrains.sharding.pipeline import TieredTrainPipeline
from torchrec_mtrains.sharding.plan import tiered_sharding_plan
from torchrec_mtrains.sharding.sharded_ebc import ShardedTieredEmbeddingBagCollection
from torchrec_mtrains.sharding.sharded_ec import ShardedTieredEmbeddingCollection
from torchrec_mtrains.sharding.sharder import TieredEmbeddingBagCollectionSharder, TieredEmbeddingCollectionSharder
from torchrec_mtrains.sharding.types import TieredParameterSharding, TieredParams

# What a user imports from here (pinned by tests/package/test_package.py). The kernel and
# its fused optimizer stay importable from here and from sharding.kernel.
__all__ = [
    "ShardedTieredEmbeddingBagCollection",
    "ShardedTieredEmbeddingCollection",
    "TieredEmbeddingBagCollectionSharder",
    "TieredEmbeddingCollectionSharder",
    "TieredParameterSharding",
    "TieredParams",
    "TieredTrainPipeline",
    "tiered_sharding_plan",
]
