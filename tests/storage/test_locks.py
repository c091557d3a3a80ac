"""Exclusive ownership: a table file (block store, SCM), a rank's storage directory and a
checkpoint directory belong to one open / one job; a second is refused with an error
naming what it wanted and who holds it, and the first one's data stays intact. The locks
die with their process (a torchrun restart takes them again)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from torchrec_mtrains import Tier
from torchrec_mtrains.checkpoint import DifferentialCheckpointer
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan
from torchrec_mtrains.storage import BlockStore, ScmStore
from torchrec_mtrains.storage.file_lock import lock_directory, lock_file

# Run in a second process: each step is attempted and reported as one JSON line
# {"step": ..., "ok": bool, "errno": int, "message": str}; "hold" steps then keep what they
# opened and the process waits for stdin to close.
_CHILD = textwrap.dedent(
    """
    import json, sys
    import torch

    def report(step, fn):
        try:
            kept.append(fn())
            out = {"step": step, "ok": True}
        except OSError as e:
            out = {"step": step, "ok": False, "errno": e.errno, "message": str(e)}
        print(json.dumps(out), flush=True)

    kept = []
    steps = json.loads(sys.argv[1])
    for step, args in steps:
        if step == "open_block":
            from torchrec_mtrains.storage import BlockStore
            report(step, lambda: BlockStore.open(args))
        elif step == "create_block":
            from torchrec_mtrains.storage import BlockStore
            report(step, lambda: BlockStore(args, 64, 4, overwrite=True))
        elif step == "open_scm":
            from torchrec_mtrains.storage import ScmStore
            report(step, lambda: ScmStore.open(args))
        elif step == "create_scm":
            from torchrec_mtrains.storage import ScmStore
            report(step, lambda: ScmStore(args, 64, 4, overwrite=True))
        elif step == "claim_checkpoint":
            from torchrec_mtrains.checkpoint import DifferentialCheckpointer
            def claim():
                c = DifferentialCheckpointer(args)
                c.claim_directory()
                return c
            report(step, claim)
        elif step == "shard":
            import torch.distributed as dist
            from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
            from torchrec.distributed import DistributedModelParallel
            from torchrec.distributed.types import ShardingPlan
            from torchrec_mtrains import Tier
            from torchrec_mtrains.sharding import (TieredEmbeddingBagCollectionSharder, TieredParams,
                                                   tiered_sharding_plan)
            if not dist.is_initialized():
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
                name="t", num_embeddings=500, embedding_dim=8, feature_names=["f"])], device=torch.device("meta"))
            plan = tiered_sharding_plan(ebc, {"t": TieredParams(Tier.SSD, cache_rows=16, storage_dir=args)}, 1)
            report(step, lambda: DistributedModelParallel(
                ebc, plan=ShardingPlan({"": plan}), sharders=[TieredEmbeddingBagCollectionSharder()],
                device=torch.device("cpu")))
    print(json.dumps({"step": "done"}), flush=True)
    sys.stdin.read()  # hold what was kept until the parent closes stdin (or kills us)
    """
)


def _child(steps: List[list]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(steps)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _reports(proc: subprocess.Popen) -> Dict[str, dict]:
    """The child's reports, once it has run every step (it then keeps what it opened)."""
    out: Dict[str, dict] = {}
    for line in proc.stdout:
        r = json.loads(line)
        if r["step"] == "done":
            return out
        out[r["step"]] = r
    raise AssertionError(f"the child died: {proc.wait()} {proc.stderr.read()}")


def _run_child(steps: List[list]) -> Dict[str, dict]:
    proc = _child(steps)
    try:
        return _reports(proc)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def _refused(report: dict, *names: str) -> None:
    assert not report["ok"], report
    assert report["errno"] == errno.EWOULDBLOCK, report
    for name in names:
        assert name in report["message"], (name, report)


def _digest(directory: Path) -> Dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _shard(storage: Path) -> DistributedModelParallel:
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name="t", num_embeddings=500, embedding_dim=8, feature_names=["f"])],
        device=torch.device("meta"))
    plan = tiered_sharding_plan(ebc, {"t": TieredParams(Tier.SSD, cache_rows=16, storage_dir=str(storage))}, 1)
    return DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), sharders=[TieredEmbeddingBagCollectionSharder()],
                                    device=torch.device("cpu"))


def _rows(n: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------- another process ----
def test_a_second_process_is_refused_everything_this_one_holds(process_group, tmp_path: Path) -> None:
    """This process holds a block store, an SCM store, a claimed checkpoint directory and a
    sharded model's storage directory; another process trying to open, overwrite or claim
    any of them is refused, naming it and this pid; everything reads back unchanged."""
    blk, scm, ckpt, storage = tmp_path / "t.blk", tmp_path / "t.scm", tmp_path / "ckpt", tmp_path / "storage"
    ids = torch.arange(0, 64, 3)
    store = BlockStore(str(blk), 64, 4)
    store.write(ids, _rows(len(ids), store.row_width, 1))
    store.flush()
    scm_store = ScmStore(str(scm), 64, 4)
    scm_store.write(ids, _rows(len(ids), scm_store.row_width, 2))
    checkpointer = DifferentialCheckpointer(str(ckpt))
    checkpointer.claim_directory()
    (ckpt / "latest").write_text("step_00000001")  # what the job had written there
    dmp = _shard(storage)
    dmp.fused_optimizer  # noqa: B018 -- the model is live
    rank_dir = storage / "rank_0"
    before = {"blk": store.read(ids), "scm": scm_store.read(ids), "ckpt": _digest(ckpt), "rank": _digest(rank_dir)}

    got = _run_child([["open_block", str(blk)], ["create_block", str(blk)], ["open_scm", str(scm)],
                      ["create_scm", str(scm)], ["claim_checkpoint", str(ckpt)], ["shard", str(storage)]])
    pid = f"pid {os.getpid()}"
    for step in ("open_block", "create_block"):
        _refused(got[step], str(blk), pid)
    for step in ("open_scm", "create_scm"):
        _refused(got[step], str(scm), pid)
    _refused(got["claim_checkpoint"], "checkpoint directory", str(ckpt), pid)
    _refused(got["shard"], "rank storage directory", str(rank_dir), pid)

    assert torch.equal(store.read(ids), before["blk"])
    assert torch.equal(scm_store.read(ids), before["scm"])
    assert _digest(ckpt) == before["ckpt"]
    assert _digest(rank_dir) == before["rank"]
    store.close()
    scm_store.close()
    reopened = BlockStore.open(str(blk))  # the first job's rows, as written
    assert torch.equal(reopened.read(ids), before["blk"])
    reopened.close()
    assert torch.equal(ScmStore.open(str(scm)).read(ids), before["scm"])
    del dmp


def test_locks_die_with_their_process(tmp_path: Path) -> None:
    """A job killed with SIGKILL (as torchrun ends a failed rank) leaves nothing locked: its
    restart opens the same store and claims the same directories."""
    blk, scm, ckpt = tmp_path / "t.blk", tmp_path / "t.scm", tmp_path / "ckpt"
    BlockStore(str(blk), 64, 4).close()
    ScmStore(str(scm), 64, 4).close()
    proc = _child([["open_block", str(blk)], ["open_scm", str(scm)], ["claim_checkpoint", str(ckpt)]])
    try:
        got = _reports(proc)
        assert all(r["ok"] for r in got.values()), got
        holder = f"pid {proc.pid}"
        with pytest.raises(BlockingIOError, match=f"{blk}.*{holder}"):
            BlockStore.open(str(blk))
        with pytest.raises(BlockingIOError, match=f"{scm}.*{holder}"):
            ScmStore.open(str(scm))
        with pytest.raises(BlockingIOError, match=f"checkpoint directory {ckpt}.*{holder}"):
            DifferentialCheckpointer(str(ckpt)).claim_directory()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    BlockStore.open(str(blk)).close()
    ScmStore.open(str(scm)).close()
    DifferentialCheckpointer(str(ckpt)).claim_directory()


# ----------------------------------------------------------------- this process ----
def test_the_same_store_opened_twice_in_one_process_is_refused(tmp_path: Path) -> None:
    blk, scm = tmp_path / "t.blk", tmp_path / "t.scm"
    ids = torch.arange(10)
    store = BlockStore(str(blk), 64, 4)
    rows = _rows(10, store.row_width, 3)
    store.write(ids, rows)
    here = f"this process \\(pid {os.getpid()}\\)"
    with pytest.raises(OSError, match=f"table file {blk} is in use: .*{here}") as e:
        BlockStore.open(str(blk))
    assert e.value.errno == errno.EWOULDBLOCK
    with pytest.raises(OSError, match=f"{blk}.*{here}"):
        BlockStore(str(blk), 64, 4, overwrite=True)
    other = BlockStore(str(tmp_path / "other.blk"), 64, 4)
    with pytest.raises(OSError, match=f"{blk}.*{here}"):
        other.snapshot(str(blk))  # would replace the live store's file under it
    other.close()
    reader = BlockStore.open_read_only(str(blk))  # reads pinned versions beside the writer
    reader.close()
    assert torch.equal(store.read(ids), rows)  # nothing was disturbed
    store.close()
    store = BlockStore.open(str(blk))  # close freed it
    assert torch.equal(store.read(ids), rows)
    store.close()

    scm_store = ScmStore(str(scm), 64, 4)
    scm_store.write(ids, rows[:, : scm_store.row_width])
    with pytest.raises(BlockingIOError, match=f"SCM table file {scm} is in use: .*{here}"):
        ScmStore.open(str(scm))
    with pytest.raises(BlockingIOError, match=f"{scm}.*{here}"):
        ScmStore(str(scm), 64, 4, overwrite=True)  # would truncate the live mapping
    assert torch.equal(scm_store.read(ids), rows[:, : scm_store.row_width])
    scm_store.close()
    ScmStore(str(scm), 64, 4, overwrite=True).close()


def test_one_process_shares_its_directory_locks(tmp_path: Path) -> None:
    """The kernels of one rank (one process) share their storage directory's lock; it is
    freed once nothing holds it, and it puts no file in the directory."""
    first = lock_directory(str(tmp_path), "rank storage directory")
    assert lock_directory(str(tmp_path), "rank storage directory") is first
    assert os.listdir(tmp_path) == []
    first.release()
    again = lock_directory(str(tmp_path), "rank storage directory")
    assert again is not first and again.held
    with pytest.raises(BlockingIOError, match=f"{tmp_path}.*this process"):
        lock_file(str(tmp_path), "directory")  # a lock taken through another open
    again.release()
