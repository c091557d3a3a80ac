"""Copied SSD rows are saved in the block store's log order: each chunk holds the rows of a
stretch of the log (ids ascending, row ranges overlapping other chunks'), the SCM and
FUSED rows stay in id order, and restore and export give the model back bit for bit."""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch

from tests.checkpoint.test_checkpoint_chain import _chunk_ids, _manifest, assert_equal, build, full_state, train
from tests.support import dmp_harness as harness
from torchrec_mtrains.checkpoint import DifferentialCheckpointer, row_io
from torchrec_mtrains.checkpoint.export import export_full_checkpoint
from torchrec_mtrains.checkpoint.row_io import StepReader
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.types import PieceSpec
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.storage import BlockStore

TIERS = {"ssd_a": "ssd", "ssd_b": "ssd", "scm_c": "scm", "plain_d": None}
SAVES = [2, 4, 6]  # a full step, then two deltas
CHUNK_MB = 0.002  # a few dozen rows a chunk: many chunks per shard


@pytest.fixture(scope="module")
def chain(process_group, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("order")
    torch.save(harness.initial_weights(), tmp / "init.pt")
    dmp, opt = build(tmp, "trained", TIERS)
    ckpt = DifferentialCheckpointer(str(tmp / "ckpt"), full_every=10, max_chain_fraction=100.0,
                                    link_ssd_tables=False, chunk_mb=CHUNK_MB)
    records, states = {}, {}

    def save(step: int) -> None:
        if step in SAVES:
            records[step] = ckpt.save(step, dmp, None, {"at": step})
            states[step] = full_state(dmp)

    touched = train(dmp, opt, range(6), save)
    return tmp, records, states, touched


def _chunks_of(path: str) -> Dict[str, List[List[int]]]:
    """{table: [each chunk's ids]} of a step (rank 0's shards)."""
    out: Dict[str, List[List[int]]] = {}
    reader = StepReader(path, None)
    for piece in _manifest(path).pieces:
        out[piece.spec.table] = [
            list(range(c.row_lo, c.row_hi)) if c.dense else reader.read([f"{c.key}/ids"])[f"{c.key}/ids"].tolist()
            for c in piece.chunks
        ]
    return out


def test_ssd_chunks_follow_the_log_and_the_others_the_ids(chain) -> None:
    _, records, _, touched = chain
    overlapping = 0
    for n, step in enumerate(SAVES):
        path = records[step].path
        manifest = {p.spec.table: p for p in _manifest(path).pieces}
        for table, chunks in _chunks_of(path).items():
            ids = [i for c in chunks for i in c]
            assert len(ids) == len(set(ids)), (step, table)  # every row once
            assert set(ids) == set(_chunk_ids(path, manifest[table])), (step, table)
            for c, spec in zip(chunks, manifest[table].chunks):
                assert c == sorted(c) and spec.count == len(c), (step, table)  # ids ascending in a chunk
                assert spec.row_lo == c[0] and spec.row_hi == c[-1] + 1, (step, table)
            ranges = [(s.row_lo, s.row_hi) for s in manifest[table].chunks]
            disjoint = all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
            if TIERS[table] == "ssd":
                overlapping += not disjoint
            else:
                assert disjoint, (step, table)  # SCM and FUSED rows: in id order
        if n:  # a delta holds exactly the rows trained since the previous save
            rows = set().union(*touched[SAVES[n - 1]:step])
            saved = {(t, i) for t, chunks in _chunks_of(path).items() for c in chunks for i in c}
            assert saved == rows
    # Training appended its rows at the log's end, after the initial ones: a full step's
    # chunks and the deltas' (rows scattered over the ids) interleave in id.
    assert overlapping >= 3


@pytest.mark.parametrize("upto", SAVES)
def test_restore_gives_the_state_of_each_step(chain, upto: int) -> None:
    tmp, records, states, _ = chain
    dmp, _ = build(tmp, f"restored_{upto}", tiers={"ssd_a": "dram", "ssd_b": "ssd", "scm_c": "ssd", "plain_d": None})
    trainer = DifferentialCheckpointer(str(tmp / "ckpt")).restore(dmp, None, path=records[upto].path)
    assert trainer == {"at": upto, "step": upto}
    assert_equal(full_state(dmp), states[upto])


def test_export_puts_storage_order_back_in_id_order(chain) -> None:
    tmp, records, states, _ = chain
    destination = str(tmp / "exported")
    export_full_checkpoint(records[6].path, destination, block_rows=100)
    assert sorted(p.name for p in tmp.iterdir() if "export" in p.name) == ["exported"]  # no spill left
    dmp, _ = build(tmp, "from_export", tiers={"ssd_a": None, "ssd_b": "ssd", "scm_c": "dram", "plain_d": None})
    DifferentialCheckpointer(str(tmp / "ck_export")).restore(dmp, None, path=destination)
    assert_equal(full_state(dmp), states[6])


def test_windows_put_every_row_in_log_order_once(tmp_path, monkeypatch) -> None:
    """Planning in windows: every selected row in exactly one chunk; within a window the
    chunks follow the log; a window's ids are dropped once its chunks are written."""
    monkeypatch.setattr(row_io, "_SCAN_ROWS", 1000)
    monkeypatch.setattr(row_io, "_ORDER_ROWS", 3000)
    rows = 10_000
    store = BlockStore(str(tmp_path / "t.bin"), rows, 4, dram_cache_mb=0)
    g = torch.Generator().manual_seed(0)
    written = torch.randperm(rows, generator=g)[:8000]  # in this order; 2,000 rows never written
    store.write(written, torch.rand(written.numel(), 5, generator=g))
    store.pin_snapshot(1)
    ids, locations = store.snapshot_entries(1, 0, rows)
    place = torch.zeros(rows, dtype=torch.int64)
    place[ids] = locations
    selected = DirtyRows(rows)
    selected.mark(torch.randperm(rows, generator=g)[:7000])
    spec = PieceSpec(table="t", module="", row_offset=0, col_offset=0, rows=rows, cols=4, table_rows=rows,
                     table_cols=4, dtype="float32", state_values=1, seed=0, init_range=[-0.01, 0.01])
    chunks = row_io.plan_chunks(LocalPiece(None, 0, spec), lambda lo, hi: selected.ids(lo, hi), 700, "f",
                                order=store.storage_order)
    windows = list(dict.fromkeys(c.window for c in chunks))
    assert len(windows) == 3 and all(w.count <= 3000 + 1000 for w in windows)
    seen = []
    for w in windows:
        mine = [c for c in chunks if c.window is w]
        parts = [w.ids(c.index, "t") for c in mine]
        assert [p.numel() for p in parts] == [c.count for c in mine]
        for a, b in zip(parts, parts[1:]):  # chunk by chunk along the log (never-written rows first)
            assert int(place[a].max()) <= int(place[b].min())
        assert all(bool((p[1:] > p[:-1]).all()) for p in parts)  # ids ascending in a chunk
        seen += [i for p in parts for i in p.tolist()]
        for _ in mine:
            w.done()
        assert w._ordered is None
    assert sorted(seen) == selected.ids().tolist()
    store.close()
