"""Tiered tables of an EmbeddingCollection (a row per id) in differential checkpoints, as bag
tables: a delta holds the rows trained since the previous save, a restore gives each step's
state back, onto other tiers and into an all-FUSED collection, and an export is the plain
DCP checkpoint of TorchRec's keys (the model of tests/support/ec_dmp.py, one rank in this
process, with TorchRec's prefetching pipeline)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint import FileSystemReader

from tests.support import ec_dmp
from torchrec_mtrains.checkpoint import DifferentialCheckpointer, export_full_checkpoint
from torchrec_mtrains.checkpoint.chain import read_chain
from torchrec_mtrains.checkpoint.restore import read_chunk

SAVES = (2, 4, 6)
STEPS = 8
TIERED = {"seq_a": "ssd", "seq_b": "scm", "seq_c": None}


def _build(tmp: Path, name: str, tiers=TIERED):
    spec = ec_dmp.SequenceRun(out_dir=str(tmp), world_size=1, storage_dir=str(tmp / f"storage_{name}"), tiers=tiers)
    dmp, _ = ec_dmp.build(spec, torch.distributed.GroupMember.WORLD)
    return dmp


def full_state(dmp) -> Dict[str, torch.Tensor]:
    """Every table's weights and the fused optimizer's state, whole."""
    out = {}
    for key, value in {**dmp.state_dict(), **_flat(dmp.fused_optimizer.state_dict()["state"])}.items():
        if isinstance(value, ShardedTensor):
            (shard,) = value.local_shards()
            out[key] = shard.tensor.clone()
        elif isinstance(value, torch.Tensor) and key.startswith(("ec.", "optim.")):
            out[key] = value.clone()
    return out


def _flat(state, prefix: str = "optim.") -> Dict[str, object]:
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def assert_equal(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def chain(process_group, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequence_chain")
    dmp = _build(tmp, "trained")
    ckpt = DifferentialCheckpointer(str(tmp / "ckpt"), full_every=10, max_chain_fraction=100.0,
                                    link_ssd_tables=False)
    states, records = {}, {}

    def save(step: int) -> None:
        if step in SAVES:
            records[step] = ckpt.save(step, dmp, None, {})
            states[step] = full_state(dmp)

    ec_dmp.train(dmp, range(STEPS), 0, 1, save)
    return tmp, ckpt, states, records


def _restored(tmp: Path, ckpt: DifferentialCheckpointer, step: int, name: str, tiers=TIERED):
    dmp = _build(tmp, name, tiers)
    DifferentialCheckpointer(ckpt.directory).restore(dmp, None, path=os.path.join(ckpt.directory, f"step_{step:08d}"))
    return dmp


def test_a_delta_holds_the_rows_trained_since_the_previous_save(chain) -> None:
    _, ckpt, _, records = chain
    assert [records[s].kind for s in SAVES] == ["full", "delta", "delta"]
    last = read_chain(os.path.join(ckpt.directory, "step_00000004"))[-1]
    (record,) = [r for r in last.pieces() if r.spec.table == "seq_a"]
    assert record.spec.tables_attr == "embeddings" and record.spec.key == "ec.embeddings.seq_a/r0_c0"
    saved = {int(i) for c in record.chunks for i in read_chunk(last, record, c)[0]}
    trained = set()
    for step in (2, 3):
        _, values = ec_dmp.global_batch(step)
        trained |= {int(i) for i in values["seq_a"]}
    assert saved == trained


@pytest.mark.parametrize("step", SAVES)
def test_restore_gives_each_steps_state(chain, step: int) -> None:
    tmp, ckpt, states, _ = chain
    assert_equal(full_state(_restored(tmp, ckpt, step, f"at{step}")), states[step])


@pytest.mark.parametrize("tiers", [{"seq_a": "dram", "seq_b": "ssd", "seq_c": "scm"},
                                   {t: None for t in ec_dmp.TABLES}], ids=["other_tiers", "all_fused"])
def test_restore_onto_other_tiers_and_into_fused_tables(chain, tiers) -> None:
    tmp, ckpt, states, _ = chain
    name = "fused" if tiers["seq_a"] is None else "tiers"
    assert_equal(full_state(_restored(tmp, ckpt, 6, name, tiers)), states[6])


def test_export_is_torchrecs_state_dict(chain) -> None:
    tmp, ckpt, states, _ = chain
    out = tmp / "export6"
    export_full_checkpoint(os.path.join(ckpt.directory, "step_00000006"), str(out))
    meta = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    got = {"model": {f"ec.embeddings.{t}.weight": torch.empty(rows, ec_dmp.DIM) for t, rows in ec_dmp.TABLES.items()}}
    dcp.load(got, storage_reader=FileSystemReader(str(out)), no_dist=True)
    for t in ec_dmp.TABLES:
        key = f"ec.embeddings.{t}.weight"
        assert torch.equal(got["model"][key], states[6][key]), key
    assert "optim.state.ec.embeddings.seq_a.weight.seq_a.momentum1" in meta
