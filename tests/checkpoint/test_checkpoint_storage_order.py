"""Copied SSD rows are saved in the block store's log order: each chunk holds the rows of a
stretch of the log (ids ascending, row ranges overlapping other chunks'), the SCM and
FUSED rows stay in id order, and restore and export give the model back bit for bit."""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch

from tests.checkpoint.test_checkpoint_chain import _chunk_ids, _manifest, assert_equal, build, full_state, train
from tests.support import dmp_harness as harness
from torchrec_mtrains.checkpoint import DifferentialCheckpointer
from torchrec_mtrains.checkpoint.export import export_full_checkpoint
from torchrec_mtrains.checkpoint.row_io import StepReader

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
