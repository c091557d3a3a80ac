"""TorchRec's EmbeddingCollection (a row per id) with tiered tables, sharded by DMP with the
TieredEmbeddingCollectionSharder on 2 gloo ranks (tests/support/ec_dmp.py): table-wise,
row-wise and column-wise, the losses, weights and optimizer state are bit-identical to an
all-FUSED EmbeddingCollection's; stock TorchRec code with ``key_value`` constraints on the
stock planner trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import ec_dmp

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

TIERED = {"seq_a": "ssd", "seq_b": "scm", "seq_c": None}
ALL_FUSED = {t: None for t in ec_dmp.TABLES}


def _run(tmp: Path, name: str, **kw) -> dict:
    out = tmp / name
    out.mkdir()
    spec = ec_dmp.SequenceRun(out_dir=str(out), world_size=2, storage_dir=str(tmp / f"storage_{name}"), **kw)
    assert ec_dmp.launch(spec) == [0, 0]
    return ec_dmp.read(str(out))


@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory) -> dict:
    """The all-FUSED run of each sharding type, once per module (several tests compare with it)."""
    done: dict = {}

    def get(sharding_type: str) -> dict:
        if sharding_type not in done:
            done[sharding_type] = _run(tmp_path_factory.mktemp("fused"), "fused", tiers=ALL_FUSED,
                                       sharding_type=sharding_type)
        return done[sharding_type]

    return get


@pytest.mark.parametrize("sharding_type", ["table_wise", "row_wise", "column_wise"])
def test_tiered_sequences_equal_fused_ones(tmp_path: Path, fused_runs, sharding_type: str) -> None:
    fused = fused_runs(sharding_type)
    tiered = _run(tmp_path, "tiered", tiers=TIERED, sharding_type=sharding_type)
    assert tiered["kernels"]["seq_a"] == "customized_kernel" and fused["kernels"]["seq_a"] == "fused"
    assert tiered["losses"] == fused["losses"]
    assert set(tiered["final"]) == set(fused["final"])
    assert any("momentum1" in k for k in fused["final"])  # the optimizer state is compared too
    for key, value in fused["final"].items():
        assert torch.equal(tiered["final"][key], value), key
    assert tiered["losses"][-1] < tiered["losses"][0]


def test_stock_planner_trains_key_value_sequences(tmp_path: Path, fused_runs) -> None:
    kv = _run(tmp_path, "kv", tiers={"seq_a": "ssd", "seq_b": "ssd", "seq_c": None}, sharding_type="row_wise",
              planner="key_value")
    fused = fused_runs("row_wise")
    assert kv["kernels"]["seq_a"] == "key_value"  # TorchRec's plan; the sharder runs it on the tiered kernel
    assert kv["losses"] == fused["losses"]
    assert list((tmp_path / "storage_kv").rglob("*.blk")), "key_value tables keep their rows in block stores"


def test_a_sequence_chain_restores_onto_one_rank_and_other_tiers(tmp_path: Path) -> None:
    """Saved by 2 ranks row-wise (SSD, SCM, FUSED), restored into 1 rank table-wise on other
    tiers: the same weights and optimizer state."""
    ckpt = tmp_path / "ckpt"
    saved = _run(tmp_path, "saved", tiers=TIERED, sharding_type="row_wise", steps=6, ckpt_dir=str(ckpt), save=True)
    out = tmp_path / "restored"
    out.mkdir()
    spec = ec_dmp.SequenceRun(out_dir=str(out), world_size=1, storage_dir=str(tmp_path / "storage_restored"),
                              tiers={"seq_a": "dram", "seq_b": "ssd", "seq_c": "scm"}, steps=6, start=6,
                              ckpt_dir=str(ckpt), restore=str(ckpt / "step_00000006"))
    assert ec_dmp.launch(spec) == [0]
    restored = ec_dmp.read(str(out))
    assert set(restored["final"]) == set(saved["final"])
    for key, value in saved["final"].items():
        assert torch.equal(restored["final"][key], value), key
