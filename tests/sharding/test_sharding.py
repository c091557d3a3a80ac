"""Fast tests of the sharding package: settings, plans, the kernel's feature map, staging,
and the errors a bad plan gets at sharding time (world size 1, in this process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.sharding import (
    TieredEmbeddingBagCollectionSharder,
    TieredParameterSharding,
    TieredParams,
    tiered_sharding_plan,
)
from torchrec_mtrains.sharding.staging import StagingArea


def _ebc(rows=(100, 200, 300), dim=8) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=r, embedding_dim=dim, feature_names=[f"f{i}"])
        for i, r in enumerate(rows)
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))


def _shard(ebc, tables, **kwargs):
    plan = tiered_sharding_plan(ebc, tables, 1, **kwargs)
    return DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}),
                                    sharders=[TieredEmbeddingBagCollectionSharder()], device=torch.device("cpu"))


# ------------------------------------------------------------------ TieredParams ----
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tier="ssd", storage_dir="/x"), "must be a torchrec_mtrains.Tier"),
        (dict(tier=Tier.SSD), "needs storage_dir"),
        (dict(tier=Tier.SCM), "needs storage_dir"),
        (dict(tier=Tier.DRAM, cache_rows=0), "cache_rows"),
        (dict(tier=Tier.DRAM, cache_load_factor=-1.0), "cache_load_factor"),
        (dict(tier=Tier.DRAM, cache_rows=5, cache_load_factor=0.1), "not both"),
        (dict(tier=Tier.DRAM, cache_algorithm="fifo"), "cache_algorithm"),
    ],
)
def test_tiered_params_reject_bad_settings(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        TieredParams(**kwargs)


def test_tiered_params_round_trip_through_fused_params() -> None:
    p = TieredParams(Tier.SSD, cache_rows=10, cache_algorithm="lfu", storage_dir="/data")
    assert TieredParams.from_fused_params({"learning_rate": 0.1, **p.to_fused_params()}) == p
    assert p.shard_cache_rows(50, 100) == 5
    assert TieredParams(Tier.DRAM, cache_load_factor=0.1).shard_cache_rows(50, 100) == 5
    with pytest.raises(ValueError, match="no tier settings"):
        TieredParams.from_fused_params({"learning_rate": 0.1})


# ----------------------------------------------------------------------- plans ----
def test_plan_marks_tiered_tables_and_spreads_ranks(tmp_path: Path) -> None:
    ebc = _ebc()
    params = TieredParams(Tier.SSD, cache_load_factor=0.1, storage_dir=str(tmp_path))
    plan = tiered_sharding_plan(ebc, {"t0": params, "t1": None}, world_size=2)
    assert isinstance(plan["t0"], TieredParameterSharding) and plan["t0"].tiered == params
    assert plan["t0"].compute_kernel == "customized_kernel"
    assert plan["t1"].compute_kernel == plan["t2"].compute_kernel == "fused"
    # Largest first onto the least loaded rank: t2 -> 0, t1 -> 1, t0 -> 1.
    assert [plan[t].ranks for t in ("t2", "t1", "t0")] == [[0], [1], [1]]
    cw = tiered_sharding_plan(ebc, {"t0": params}, world_size=2, sharding_type="column_wise")
    assert cw["t0"].ranks == [0, 1] and cw["t0"].sharding_type == "column_wise"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tables={"nope": None}, world_size=1), "not tables of the module"),
        (dict(tables={"t0": "ssd"}, world_size=1), "TieredParams or None"),
        (dict(tables={}, world_size=0), "world_size"),
        (dict(tables={}, world_size=1, sharding_type="data_parallel"), "sharding_type"),
    ],
)
def test_plan_rejects_bad_input(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        tiered_sharding_plan(_ebc(), **kwargs)


# ---------------------------------------------------- sharding-time failures ----
def test_missing_storage_space_fails_at_sharding_time(process_group, tmp_path: Path) -> None:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="huge", num_embeddings=10**12, embedding_dim=64, feature_names=["f"])],
        device=torch.device("meta"),
    )
    params = TieredParams(Tier.SSD, cache_rows=1000, storage_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"tables huge on tier SSD need .* MiB in .*rank_0"):
        _shard(ebc, {"huge": params})


def test_a_table_file_already_at_its_path_counts_as_free_space(process_group, tmp_path: Path, monkeypatch) -> None:
    # A resume adopts the file a checkpoint links, a fresh start replaces it: either way
    # its space is the table's. 12,100 rows of 260 bytes need 3 MiB; 1 MiB is free.
    import torchrec_mtrains.sharding.kernel as kernel

    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", num_embeddings=12_100, embedding_dim=64, feature_names=["f"])],
        device=torch.device("meta"),
    )
    params = TieredParams(Tier.SSD, cache_rows=100, storage_dir=str(tmp_path))
    real = kernel.shutil.disk_usage
    monkeypatch.setattr(kernel.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    with pytest.raises(ValueError, match=r"tables t on tier SSD need 3.0 MiB"):
        _shard(ebc, {"t": params})
    rank_dir = tmp_path / "rank_0"
    (rank_dir / "t.r0.c0.blk").write_bytes(os.urandom(4 << 20))  # 4 MiB allocated
    _shard(ebc, {"t": params})


def test_uncreatable_storage_dir_fails_naming_table_and_tier(process_group, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    params = TieredParams(Tier.SCM, cache_load_factor=0.5, storage_dir=str(blocker / "sub"))
    with pytest.raises(ValueError, match=r"tables t0 on tier SCM: cannot create"):
        _shard(_ebc(), {"t0": params})


def test_customized_table_without_tier_settings_is_refused(process_group) -> None:
    from torchrec.distributed.sharding_plan import (
        construct_module_sharding_plan,
        table_wise,
    )

    ebc = _ebc()
    plan = construct_module_sharding_plan(
        ebc, {t: table_wise(rank=0, compute_kernel="customized_kernel") for t in ("t0", "t1", "t2")},
        sharder=TieredEmbeddingBagCollectionSharder(), local_size=1, world_size=1, device_type="cpu",
    )
    with pytest.raises(ValueError, match="no tier settings"):
        DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}),
                                 sharders=[TieredEmbeddingBagCollectionSharder()], device=torch.device("cpu"))


def test_load_state_dict_takes_full_plain_tensors(process_group, tmp_path: Path) -> None:
    ebc = _ebc()
    params = TieredParams(Tier.SSD, cache_rows=7, storage_dir=str(tmp_path))
    model = _shard(ebc, {"t0": params, "t1": TieredParams(Tier.DRAM, cache_rows=3), "t2": None})
    full = {f"embedding_bags.t{i}.weight": torch.randn(r, 8) for i, r in enumerate((100, 200))}
    missing, unexpected = model.load_state_dict(full, strict=False)
    assert not unexpected
    sd = model.state_dict()
    for key, value in full.items():
        assert torch.equal(sd[key].local_shards()[0].tensor, value)
    with pytest.raises(ValueError, match="table t0: weights of shape"):
        model.load_state_dict({"embedding_bags.t0.weight": torch.randn(5, 8)}, strict=False)


# ---------------------------------------------------------------- kernel, staging ----
def test_kernel_feature_table_map_matches_fbgemm(tmp_path: Path) -> None:
    specs, ftm, batch = [(300, 8), (200, 4)], [0, 0, 1], 6
    kernel = TieredEmbeddingBags(specs, tier=Tier.SSD, cache_rows=16, storage_dir=str(tmp_path),
                                 feature_table_map=ftm, init_range=(-0.1, 0.1))
    ref = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in specs],
        feature_table_map=ftm, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01, eps=1e-8,
    )
    with torch.no_grad():
        for t, w in enumerate(kernel.split_embedding_weights()):
            ref.split_embedding_weights()[t].copy_(w)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(0, 4, (len(ftm) * batch,), generator=g)
        rows = torch.tensor([specs[ftm[i // batch]][0] for i in range(len(ftm) * batch)])
        indices = torch.cat([torch.randint(0, int(r), (int(n),), generator=g) for r, n in zip(rows, lengths)])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        out, expect = kernel(indices, offsets), ref(indices, offsets)
        assert (out - expect).abs().max() <= 1e-5
        out.sum().backward()
        expect.sum().backward()
    for a, b in zip(kernel.split_embedding_weights(), ref.split_embedding_weights()):
        assert (a - b).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="feature_table_map"):
        TieredEmbeddingBags(specs, tier=Tier.DRAM, feature_table_map=[1, 0])
    kernel.close()


def test_staging_puts_large_shards_in_unlinked_files(tmp_path: Path) -> None:
    area = StagingArea(ram_limit_bytes=1024, directory=str(tmp_path))
    small = area.empty((4, 4), torch.float32)
    big = area.empty((1000, 8), torch.float32)
    big.copy_(torch.arange(8000.0).view(1000, 8))
    assert area.files_used == 1 and small.shape == (4, 4)
    assert float(big[999, 7]) == 7999.0
    assert os.listdir(tmp_path) == []  # names are unlinked at once
