"""SSD tables saved by linking their block-store files (world size 1): what a step holds,
restores by adopting the file or by reading it, resuming bit-identically, pins, damage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.checkpoint.test_checkpoint_chain import assert_equal, build, full_state, train
from tests.support import dmp_harness as harness
from torchrec_mtrains.checkpoint import ChainError, DifferentialCheckpointer, export_full_checkpoint
from torchrec_mtrains.checkpoint.store_links import read_map_chunk
from torchrec_mtrains.checkpoint.types import LINKS_DIR, MAP_ENTRY_BYTES, StepManifest
from torchrec_mtrains.checkpoint.tiered_parts import local_pieces

SAVES = [2, 4, 6]
SSD = ("ssd_a", "ssd_b")


def _manifest(path: str) -> StepManifest:
    with open(os.path.join(path, "tiered.rank0.json")) as f:
        return StepManifest.from_json(f.read(), path, None)


def _stores(dmp):
    return {p.spec.table: p.emb.linkable_store(p.t) for p in local_pieces(dmp)}


def _close(dmp) -> None:
    """Closes the model's tiered stores: a store file is owned by one open store, so a model
    adopts a linked file only once the store that wrote it (the same inode) is closed --
    as when a job restarts -- and gives it up for the next test by closing too."""
    for piece in local_pieces(dmp):
        piece.emb.close()


@pytest.fixture(scope="module")
def linked(process_group, tmp_path_factory):
    """A model trained 8 steps with linked saves after steps 2 (full), 4 and 6 (deltas)."""
    tmp = tmp_path_factory.mktemp("linked")
    torch.save(harness.initial_weights(), tmp / "init.pt")
    dmp, opt = build(tmp, "trained")
    ckpt = DifferentialCheckpointer(str(tmp / "ckpt"), full_every=10, max_chain_fraction=100.0)
    records, states = {}, {}

    def save(step: int) -> None:
        if step in SAVES:
            records[step] = ckpt.save(step, dmp, None, {"note": f"at {step}"})
            states[step] = full_state(dmp)

    train(dmp, opt, range(8), save)  # two steps past the last save overwrite linked rows
    states["end"] = full_state(dmp)
    return tmp, dmp, records, states


def test_a_step_links_the_ssd_files_and_saves_their_maps(linked) -> None:
    tmp, dmp, records, _ = linked
    stores = _stores(dmp)
    for step in SAVES:
        path = records[step].path
        by_table = {p.spec.table: p for p in _manifest(path).pieces}
        for table in SSD:
            record = by_table[table]
            assert record.snapshot is not None and record.snapshot.step == step
            link = os.path.join(path, LINKS_DIR, record.snapshot.file)
            assert os.stat(link).st_ino == os.stat(stores[table].path).st_ino  # the live store's file
            assert os.path.getsize(os.path.join(path, record.snapshot.map_file)) == \
                record.snapshot.entries * MAP_ENTRY_BYTES
            # Every row was written (the initial weights were loaded into every row).
            assert record.snapshot.entries == harness.TABLES[table][0]
        assert by_table["scm_c"].snapshot is None  # other tiers copy their rows
        assert records[step].rows_linked == sum(harness.TABLES[t][0] for t in SSD)
        assert records[step].map_bytes == records[step].rows_linked * MAP_ENTRY_BYTES
    # The step's bytes do not count the linked files.
    assert records[4].bytes < records[4].linked_row_bytes
    for table in SSD:
        assert sorted(stores[table].pin_tags()) == SAVES


@pytest.mark.parametrize("upto", SAVES)
def test_a_fresh_model_adopts_the_linked_file_and_gets_the_state_of_each_step(linked, upto: int) -> None:
    tmp, trained, records, states = linked
    _close(trained)
    dmp, _ = build(tmp, f"adopt_{upto}")
    try:
        DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[upto].path)
        assert_equal(full_state(dmp), states[upto])
        stores = _stores(dmp)
        record = {p.spec.table: p for p in _manifest(records[upto].path).pieces}["ssd_a"]
        link = os.path.join(records[upto].path, LINKS_DIR, record.snapshot.file)
        assert os.stat(stores["ssd_a"].path).st_ino == os.stat(link).st_ino  # adopted, not copied
        # The adopted store keeps every step on disk that links the same file.
        assert sorted(stores["ssd_a"].pin_tags()) == SAVES
    finally:
        _close(dmp)


def test_a_resume_from_a_linked_step_trains_bit_identically(linked, tmp_path) -> None:
    tmp, trained, records, states = linked
    _close(trained)
    dmp, opt = build(tmp, "resumed")
    try:
        DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[6].path)
        train(dmp, opt, range(6, 8))
        assert_equal(full_state(dmp), states["end"])
    finally:
        _close(dmp)


def test_other_tiers_read_the_rows_from_the_linked_file(linked) -> None:
    tmp, _, records, states = linked
    tiers = {"ssd_a": "scm", "ssd_b": None, "scm_c": "ssd", "plain_d": None}
    dmp, _ = build(tmp, "elsewhere", tiers=tiers)
    DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[4].path)
    assert_equal(full_state(dmp), states[4])


def test_the_export_of_a_linked_chain_loads_as_the_state(linked) -> None:
    tmp, _, records, states = linked
    dest = tmp / "export"
    export_full_checkpoint(records[6].path, str(dest))
    dmp, _ = build(tmp, "from_export", tiers={"ssd_a": "ssd", "ssd_b": None, "scm_c": "scm", "plain_d": None})
    DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=str(dest))
    assert_equal(full_state(dmp), states[6])


def _copy(tmp: Path, name: str) -> Path:
    """A copy of the chain whose links stay links (to the same files)."""
    dst = tmp / name
    shutil.copytree(tmp / "ckpt", dst, copy_function=os.link)
    return dst


@pytest.mark.parametrize("damage", ["map", "link"])
def test_a_damaged_map_or_a_missing_link_is_named_and_nothing_is_restored(linked, damage: str) -> None:
    tmp, _, records, _ = linked
    ckpt = _copy(tmp, f"damaged_{damage}")
    step_dir = ckpt / "step_00000006"
    record = {p.spec.table: p for p in _manifest(str(step_dir)).pieces}["ssd_b"]
    if damage == "map":
        target = step_dir / record.snapshot.map_file
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x10
        target.unlink()  # a new file: the original is linked into the other copies
        target.write_bytes(bytes(data))
    else:
        target = step_dir / LINKS_DIR / record.snapshot.file
        target.unlink()
    dmp, _ = build(tmp, f"damaged_{damage}")
    before = full_state(dmp)
    with pytest.raises(ChainError, match="step 6") as info:
        DifferentialCheckpointer(str(ckpt)).restore(dmp, None)
    assert str(target) in str(info.value) and info.value.step == 6
    assert_equal(full_state(dmp), before)


def test_a_map_chunk_names_its_file_when_short(linked, tmp_path) -> None:
    tmp, _, records, _ = linked
    ckpt = _copy(tmp, "short")
    step_dir = ckpt / "step_00000002"
    record = {p.spec.table: p for p in _manifest(str(step_dir)).pieces}["ssd_a"]
    target = step_dir / record.snapshot.map_file
    data = target.read_bytes()
    target.unlink()
    target.write_bytes(data[: len(data) // 2])
    with pytest.raises(ChainError, match="is short"):
        read_map_chunk(str(ckpt), record, record.chunks[-1])


def test_pins_go_with_their_steps(linked, tmp_path) -> None:
    tmp = linked[0]
    torch.save(harness.initial_weights(), tmp_path / "init.pt")
    dmp, opt = build(tmp_path, "pins")
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"), full_every=2, max_chain_fraction=100.0)
    kinds = []
    train(dmp, opt, range(6), lambda s: kinds.append(ckpt.save(s, dmp, None, {}).kind) if s % 2 == 0 else None)
    assert kinds == ["full", "delta", "full"]
    # The chain of steps 2 and 4 went once step 6 (a full step) was complete: so did its pins.
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step_00000006"]
    for store in _stores(dmp).values():
        if store is not None:
            assert store.pin_tags() == [6]


def test_restoring_a_step_of_an_older_chain_keeps_that_chain(linked, tmp_path) -> None:
    tmp = linked[0]
    torch.save(harness.initial_weights(), tmp_path / "init.pt")
    dmp, opt = build(tmp_path, "older")
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"), full_every=1, keep_chains=2)
    states = {}

    def save(step: int) -> None:
        if step in (2, 4):
            ckpt.save(step, dmp, None, {})
            states[step] = full_state(dmp)

    train(dmp, opt, range(4), save)
    _close(dmp)  # the job that saved is gone: its store files are free to adopt
    fresh, _ = build(tmp_path, "older_restored")
    # A checkpointer that keeps one chain would remove step 2's on its first use: not the
    # chain it is asked to restore.
    DifferentialCheckpointer(str(tmp_path / "ckpt"), keep_chains=1).restore(
        fresh, None, path=str(tmp_path / "ckpt" / "step_00000002"))
    assert_equal(full_state(fresh), states[2])
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step_00000002", "step_00000004"]
