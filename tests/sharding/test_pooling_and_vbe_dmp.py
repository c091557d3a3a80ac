"""A sharded EmbeddingBagCollection with tiered tables gives FUSED's numbers with MEAN pooling
under every sharding type (row-wise pools SUM in the kernel, TorchRec dividing after the
reduce) and with a variable batch per feature (VBE), tiered tables alone or mixed with FUSED
ones (world size 1, in this process; the 2-rank cases run in TorchRec's own harness)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from torchrec_mtrains import Tier
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan

FEATURES = ["f0", "f1", "f2"]
ROWS, DIM = 60, 8
FUSED_PARAMS = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}


def _ebc(pooling: PoolingType) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f],
                                   pooling=pooling) for i, f in enumerate(FEATURES)],
        device=torch.device("cpu"),
    )


def _dmp(pooling: PoolingType, tiered: Dict[str, Optional[TieredParams]], sharding_type: str):
    ebc = _ebc(pooling)
    plan = tiered_sharding_plan(ebc, tiered, 1, sharding_type=sharding_type)
    return DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), device=torch.device("cpu"),
                                    sharders=[TieredEmbeddingBagCollectionSharder(fused_params=FUSED_PARAMS)])


def _batch(step: int, variable: bool) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(step)
    strides = [2, 5, 1] if variable else [4, 4, 4]
    lengths = torch.randint(0, 4, (sum(strides),), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    if not variable:
        return KeyedJaggedTensor.from_lengths_sync(FEATURES, values, lengths)
    inverse = torch.stack([torch.randint(0, s, (4,), generator=g) for s in strides])
    return KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths,
                             stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(FEATURES, inverse))


def _train_both(tmp_path: Path, pooling: PoolingType, tiers: Dict[str, Tier], sharding_type: str,
                variable: bool) -> None:
    fused = _dmp(pooling, {}, sharding_type)
    tiered = _dmp(pooling, {name: TieredParams(tier, cache_rows=7, storage_dir=str(tmp_path))
                            for name, tier in tiers.items()}, sharding_type)
    tiered.load_state_dict(copy.deepcopy(fused.state_dict()))
    for step in range(6):
        want, got = fused(_batch(step, variable)), tiered(_batch(step, variable))
        assert torch.equal(got.values(), want.values()), f"step {step}"
        want.values().square().sum().backward()
        got.values().square().sum().backward()
    got_sd = tiered.state_dict()
    for key, want in fused.state_dict().items():
        assert torch.equal(got_sd[key].local_shards()[0].tensor, want.local_shards()[0].tensor), key


@pytest.mark.parametrize("sharding_type", ["table_wise", "row_wise", "column_wise"])
def test_mean_pooling_equals_fused(process_group, tmp_path: Path, sharding_type: str) -> None:
    _train_both(tmp_path, PoolingType.MEAN, {"t0": Tier.SSD, "t1": Tier.DRAM}, sharding_type, variable=False)


@pytest.mark.parametrize("tiers", [{"t0": Tier.SSD, "t1": Tier.SCM, "t2": Tier.DRAM}, {"t0": Tier.SSD, "t1": Tier.DRAM}],
                         ids=["tiered-only", "mixed-with-fused"])
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
def test_variable_batch_per_feature_equals_fused(process_group, tmp_path: Path, tiers, pooling) -> None:
    _train_both(tmp_path, pooling, tiers, "table_wise", variable=True)
