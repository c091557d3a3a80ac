"""TorchRec's own words for an SSD table -- ParameterConstraints(compute_kernels=["key_value"],
key_value_params=KeyValueParams(...), cache_params=CacheParams(...)), a CPU Topology with
ssd_cap, EmbeddingShardingPlanner (or the same constraints given to the StorageAwarePlanner)
-- trained by DMP with the tiered sharder on 2 gloo ranks: the same losses and weights as
all-FUSED training, each rank's files under its own ``ssd_storage_directory``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import dmp_harness as harness

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

TOL = 1e-4  # max abs diff allowed against all-FUSED training
STEPS = 10
KEY_VALUE = {"ssd_a": "key_value", "ssd_b": "key_value", "scm_c": None, "plain_d": "key_value"}


def _compare(a: str, b: str) -> None:
    la, lb = harness.read_losses(a), harness.read_losses(b)
    assert len(la) == len(lb) == STEPS
    assert max(abs(x - y) for x, y in zip(la, lb)) <= TOL
    fa, fb = harness.read_final(a), harness.read_final(b)
    assert set(fa) == set(fb)
    assert any(".momentum1" in k for k in fa)  # optimizer state is compared too
    for key in fa:
        assert fa[key].shape == fb[key].shape, key
        assert (fa[key] - fb[key]).abs().max().item() <= TOL, key


def test_key_value_tables_of_both_planners_train_like_fused(tmp_path: Path) -> None:
    torch.save(harness.initial_weights(), tmp_path / "init.pt")
    common = dict(world_size=2, steps=STEPS, init_file=str(tmp_path / "init.pt"))
    specs = []
    for name, tiers, planner in (("fused", {t: None for t in harness.TABLES}, ""),
                                 ("torchrec", KEY_VALUE, "torchrec"), ("storage_aware", KEY_VALUE, "storage_aware")):
        (tmp_path / name).mkdir()
        specs.append(harness.RunSpec(out_dir=str(tmp_path / name), storage_dir=str(tmp_path / f"storage_{name}"),
                                     tiers=tiers, planner=planner,
                                     table_sharding={"ssd_b": "row_wise"} if planner else {}, **common))
    assert harness.launch_many(specs) == [0, 0]
    for spec in specs[1:]:
        _check_key_value_run(specs[0].out_dir, spec.out_dir, Path(spec.storage_dir))


def _check_key_value_run(fused: str, kv: str, storage: Path) -> None:
    _compare(fused, kv)
    # The key_value tables ran on the tiered kernel, on the SSD tier.
    kernels = harness.read_kernel_tiers(kv, 2)
    assert kernels and all(tiers == ["SSD"] for rank in kernels for tiers in rank), kernels
    # Each rank's table files lie under its own ssd_storage_directory (emb@local_rank).
    assert sorted(p.name for p in storage.iterdir()) == ["emb0", "emb1"]
    for local_rank in (0, 1):
        files = [f.name for f in (storage / f"emb{local_rank}").rglob("*") if f.is_file()]
        assert files and all(f.endswith(".blk") for f in files), files
    # ssd_b is row-wise: a shard on each rank; the others lie whole on one rank.
    names = [f.name for f in storage.rglob("*.blk")]
    assert sum(n.startswith("ssd_b.") for n in names) == 2
    assert sum(n.startswith(("ssd_a.", "plain_d.")) for n in names) == 2
