"""Virtual tables in differential checkpoints (checkpoint/virtual_pieces.py): live ids, rows,
optimizer state and eviction metadata saved in the chain; a restore gives back exactly the
state of its step, onto another tier, and training goes on bit-identically (the model of
tests/support/virtual_dmp.py, one rank in this process, with TorchRec's prefetching
pipeline, so steps are pending when a save is taken)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from tests.support import virtual_dmp
from torchrec_mtrains.checkpoint import ChainError, DifferentialCheckpointer
from torchrec_mtrains.checkpoint.types import StepManifest

SAVES = (4, 6, 8)  # a full step, then two deltas
STEPS = 12
TRIGGER = 400  # live ids before an eviction pass: passes within the run, hot ids kept


def _spec(tmp: Path, name: str, kernel: str = "dram_virtual_table", cache: float = 0.0) -> virtual_dmp.VirtualRun:
    return virtual_dmp.VirtualRun(out_dir=str(tmp), world_size=1, kernel=kernel, trigger=TRIGGER,
                                  storage_dir=str(tmp / f"storage_{name}"), cache_load_factor=cache)


def _world():
    return torch.distributed.GroupMember.WORLD


def _kernel(dmp):
    (emb,) = [e for e in virtual_dmp.tiered_kernels(dmp) if "virt.r0.c0" in e.table_names]
    return emb, emb.table_names.index("virt.r0.c0")


def virtual_state(dmp) -> Dict[str, torch.Tensor]:
    """Live ids (ascending), their weights, optimizer state and access counts."""
    emb, t = _kernel(dmp)
    ids, rows = emb.virtual_ids(t)
    order = torch.argsort(ids)
    ids, rows = ids[order], rows[order]
    weights, state = emb.read_ids(t, ids)
    state_now = emb.virtual_state(t)
    by_row = dict(zip(state_now["rows"].tolist(), state_now["counts"].tolist()))
    counts = torch.tensor([by_row[r] for r in rows.tolist()])
    return {"ids": ids, "weights": weights, "state": state, "counts": counts}


def assert_same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    for k in a:
        assert torch.equal(a[k], b[k]), k


def train(dmp, steps: range, on_step=None) -> List[float]:
    from torchrec_mtrains.sharding import TieredTrainPipeline

    opt = torch.optim.SGD([p for p in dmp.parameters() if p.requires_grad], lr=0.0)  # the head stays fixed
    pipeline = TieredTrainPipeline(dmp, opt, torch.device("cpu"))
    batches = iter([virtual_dmp.pipeline_batch(s, 0, 1) for s in steps])
    losses = []
    for s in steps:
        loss = pipeline.progress(batches)
        losses.append(float(loss))
        if on_step is not None:
            on_step(s + 1)
    pipeline.detach()
    return losses


@pytest.fixture(scope="module")
def chain(process_group, tmp_path_factory):
    """A run of STEPS steps with saves after each of SAVES."""
    tmp = tmp_path_factory.mktemp("virtual_chain")
    dmp, _ = virtual_dmp.build(_spec(tmp, "trained"), _world(), pipelined=True)
    ckpt = DifferentialCheckpointer(str(tmp / "ckpt"), full_every=10, max_chain_fraction=100.0)
    states, records = {}, {}

    def save(step: int) -> None:
        if step in SAVES:
            records[step] = ckpt.save(step, dmp, None, {"step": step})
            states[step] = virtual_state(dmp)

    losses = train(dmp, range(STEPS), save)
    emb, _ = _kernel(dmp)
    stats = emb.cache_stats()["virt.r0.c0"]
    return tmp, ckpt, states, records, losses, stats


def _restored(tmp: Path, ckpt_dir: Path, step: int, name: str, kernel: str = "dram_virtual_table"):
    dmp, _ = virtual_dmp.build(_spec(tmp, name, kernel), _world(), pipelined=True)
    DifferentialCheckpointer(str(ckpt_dir)).restore(dmp, None, path=str(ckpt_dir / f"step_{step:08d}"))
    return dmp


def _saved_ids(ckpt: DifferentialCheckpointer, step: int) -> set:
    """The ids whose rows step ``step`` holds of the virtual table."""
    from torchrec_mtrains.checkpoint.chain import read_chain
    from torchrec_mtrains.checkpoint.restore import read_chunk

    last = read_chain(os.path.join(ckpt.directory, f"step_{step:08d}"))[-1]
    (record,) = [r for r in last.pieces() if r.spec.table == "virt"]
    return {int(i) for c in record.chunks for i in read_chunk(last, record, c)[0]}


def _batch_ids(step: int) -> set:
    return {int(i) for i in virtual_dmp.global_batch(step)[1]}


def test_the_run_evicts_and_saves_deltas(chain) -> None:
    _, ckpt, states, records, _, stats = chain
    assert stats["eviction_passes"] >= 2 and stats["ids_evicted"] > 0
    assert [records[s].kind for s in SAVES] == ["full", "delta", "delta"]
    assert _saved_ids(ckpt, 4) == set(states[4]["ids"].tolist())  # a full step: every live id's row
    for parent, step in ((4, 6), (6, 8)):
        live = set(states[step]["ids"].tolist())
        trained = set().union(*(_batch_ids(s) for s in range(parent, step)))
        saved = _saved_ids(ckpt, step)
        # The rows trained since the parent that are still live, and the rows made for the
        # ids of the step prefetched when it saved (their initial values); nothing else.
        assert trained & live <= saved <= live
        assert saved - trained <= _batch_ids(step)
        assert len(saved) < len(live)


@pytest.mark.parametrize("step", SAVES)
def test_restore_gives_each_steps_live_ids_rows_and_counts(chain, step: int) -> None:
    tmp, ckpt, states, _, _, _ = chain
    dmp = _restored(tmp, Path(ckpt.directory), step, f"at{step}")
    assert_same(virtual_state(dmp), states[step])


def test_restore_onto_the_ssd_tier(chain) -> None:
    tmp, ckpt, states, _, _, _ = chain
    dmp = _restored(tmp, Path(ckpt.directory), 8, "ssd", kernel="ssd_virtual_table")
    assert_same(virtual_state(dmp), states[8])


def test_training_after_a_restore_is_bit_identical(chain) -> None:
    """Steps were pending (prefetched) at each save: the restored run replays them without
    counting their ids twice, so its eviction passes and losses are the uninterrupted run's."""
    tmp, ckpt, _, _, losses, stats = chain
    dmp = _restored(tmp, Path(ckpt.directory), 6, "resumed")
    assert train(dmp, range(6, STEPS)) == losses[6:]
    emb, _ = _kernel(dmp)
    resumed = emb.cache_stats()["virt.r0.c0"]
    assert resumed["live_ids"] == stats["live_ids"]


def test_manifest_lists_live_ids_and_pending_steps(chain) -> None:
    _, ckpt, states, _, _, _ = chain
    path = Path(ckpt.directory) / "step_00000008" / "tiered.rank0.json"
    manifest = StepManifest.from_json(path.read_text(), str(path), 8)
    (piece,) = [p for p in manifest.pieces if p.spec.table == "virt"]
    assert piece.spec.virtual and piece.virtual is not None
    assert sum(c.count for c in piece.virtual.live) == states[8]["ids"].numel()
    assert piece.virtual.pending >= 1  # the pipeline had prefetched the next batch


def _copy(tmp: Path, ckpt: DifferentialCheckpointer, name: str) -> Path:
    import shutil

    out = tmp / name
    shutil.copytree(ckpt.directory, out)
    return out


def _edit_virtual_record(path: Path, change) -> None:
    """Changes the virtual table's record of a manifest and rewrites it with a valid
    checksum (as a hand or a bug could write it)."""
    import zlib

    body = json.loads(json.loads(path.read_text())["manifest"])
    change(next(p for p in body["pieces"] if p["spec"]["table"] == "virt"))
    text = json.dumps(body, sort_keys=True)
    path.write_text(json.dumps({"crc32": zlib.crc32(text.encode()), "manifest": text}))


def test_a_damaged_live_list_is_named_and_nothing_restored(chain) -> None:
    tmp, ckpt, _, _, _, _ = chain
    broken = _copy(tmp, ckpt, "damaged")
    def flip_crc(record) -> None:
        record["virtual"]["live"][0]["crc32"] ^= 1

    _edit_virtual_record(broken / "step_00000008" / "tiered.rank0.json", flip_crc)
    dmp, _ = virtual_dmp.build(_spec(tmp, "damaged"), _world(), pipelined=True)
    before = virtual_state(dmp)
    with pytest.raises(ChainError, match="live ids .* fails its checksum"):
        DifferentialCheckpointer(str(broken)).restore(dmp, None)
    assert_same(virtual_state(dmp), before)


def test_a_virtual_shard_without_its_live_ids_is_refused(chain) -> None:
    tmp, ckpt, _, _, _, _ = chain
    broken = _copy(tmp, ckpt, "was_dense")
    _edit_virtual_record(broken / "step_00000004" / "tiered.rank0.json", lambda record: record.update(virtual=None))
    dmp, _ = virtual_dmp.build(_spec(tmp, "was_dense"), _world(), pipelined=True)
    with pytest.raises(ChainError, match="lacks its live ids"):
        DifferentialCheckpointer(str(broken)).restore(dmp, None, path=str(broken / "step_00000004"))


def test_export_lists_ids_beside_rows(chain) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from torchrec_mtrains.checkpoint import export_full_checkpoint

    tmp, ckpt, states, _, _, _ = chain
    out = tmp / "export8"
    export_full_checkpoint(os.path.join(ckpt.directory, "step_00000008"), str(out))
    meta = FileSystemReader(str(out)).read_metadata().state_dict_metadata
    param = "ebc.embedding_bags.virt.weight"
    n = states[8]["ids"].numel()
    got = {"model": {param: torch.empty(n, virtual_dmp.DIM), f"{param}_id": torch.empty(n, dtype=torch.int64)},
           "optim": {"state": {param: {"virt.momentum1": torch.empty(meta[f"optim.state.{param}.virt.momentum1"].size)}}}}
    dcp.load(got, storage_reader=FileSystemReader(str(out)), no_dist=True)
    assert torch.equal(got["model"][f"{param}_id"], states[8]["ids"])
    assert torch.equal(got["model"][param], states[8]["weights"])
    assert torch.equal(got["optim"]["state"][param]["virt.momentum1"], states[8]["state"].reshape(-1))
    # The plain table is exported as TorchRec saves it.
    assert tuple(meta["model.ebc.embedding_bags.plain.weight"].size) == (50, virtual_dmp.DIM)
    assert not any("/live" in k for k in meta)


@pytest.mark.parametrize("kernel", ["dram_virtual_table", "ssd_virtual_table"])
def test_an_async_save_is_the_model_as_of_its_step_while_training_evicts(process_group, tmp_path, monkeypatch,
                                                                         kernel: str) -> None:
    """Training goes on for six steps -- eviction passes hand evicted ids' rows to new ids,
    the cache writes rows back -- while the save of step 6 is held before reading a row;
    the step restores exactly the state of step 6."""
    from tests.checkpoint.test_checkpoint_chain import _HeldWriter

    # A cache of 3% of the rows (a third of the live ids): training writes rows back all along.
    dmp, _ = virtual_dmp.build(_spec(tmp_path, "trained", kernel, cache=0.03), _world(), pipelined=True)
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"), full_every=10, max_chain_fraction=100.0)
    held = _HeldWriter(monkeypatch)
    pending, state = [], {}
    emb, _ = _kernel(dmp)

    def on_step(step: int) -> None:
        if step == 4:
            ckpt.save(4, dmp, None, {})
        elif step == 6:
            state.update(virtual_state(dmp))
            state["passes"] = emb.cache_stats()["virt.r0.c0"]["eviction_passes"]
            pending.append(ckpt.async_save(6, dmp, None, {"at": 6}))
            assert held.started.wait(60)
        elif step == STEPS:
            assert not pending[0].done()
            held.go.set()

    train(dmp, range(STEPS), on_step)
    record = pending[0].result(60)
    assert record.kind == "delta"
    assert emb.cache_stats()["virt.r0.c0"]["eviction_passes"] > state.pop("passes")  # rows went to other ids
    assert sum(held.stashed) > 0  # training rewrote rows the save had not read yet
    monkeypatch.undo()
    restored = _restored(tmp_path, Path(ckpt.directory), 6, "restored", kernel)
    assert_same(virtual_state(restored), state)
