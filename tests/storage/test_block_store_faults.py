"""BlockStore under scripted device faults (the fault-injecting device of csrc/storage/device.h).

Every failure raises OSError with the errno and the table file (CorruptionError for a
damaged read), leaves the store usable, and loses nothing it had accepted: a retried flush
persists every row, as a reopen shows.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Dict

import pytest
import torch

from tests.support.block_store_helpers import assert_rows_equal, expected_lazy, random_rows
from torchrec_mtrains.storage import BlockStore, CorruptionError
from torchrec_mtrains.testing import inject_device_fault

N, DIM = 2000, 12


def _rows(n: int, seed: int) -> torch.Tensor:
    return random_rows(n, DIM + 1, torch.float32, seed)


def _check(store: BlockStore, model: Dict[int, torch.Tensor], what: str) -> None:
    ids = torch.arange(N)
    want = expected_lazy(store, ids, 0, (-0.01, 0.01))
    for i, r in model.items():
        if isinstance(i, int):
            want[i] = r
    assert_rows_equal(store.read(ids), want, what)


def _reopened(path: Path, model: Dict[int, torch.Tensor], engine: str = "threads") -> None:
    with BlockStore.open(path, dram_cache_mb=0, io_engine=engine) as store:
        _check(store, model, "rows after reopen")


def _on_disk_store(tmp_path: Path, engine: str, cache_mb: float = 0) -> tuple:
    """A table whose rows 0..999 are on disk (written, closed, reopened: not buffered)."""
    path = tmp_path / "t.tbl"
    rows = _rows(1000, seed=1)
    with BlockStore(path, N, DIM, dram_cache_mb=0, segment_blocks=4, io_engine=engine) as store:
        store.write(torch.arange(1000), rows)
    store = BlockStore.open(path, dram_cache_mb=cache_mb, io_engine=engine)
    return path, store, {i: rows[i] for i in range(1000)}


# Write, sync and map faults during flush ---------------------------------------------------
@pytest.mark.parametrize(
    "kind,on_map,err",
    [
        ("write_error", False, errno.ENOSPC),
        ("write_error", True, errno.ENOSPC),
        ("write_error", False, errno.EIO),
        ("sync_error", False, errno.EIO),
        ("sync_error", True, errno.EIO),
    ],
    ids=["log-enospc", "map-enospc", "log-eio", "log-sync", "map-sync"],
)
def test_failed_flush_then_retry(tmp_path: Path, engine: str, kind: str, on_map: bool, err: int) -> None:
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=1, io_engine=engine)
    model = {}
    first = _rows(500, seed=1)
    store.write(torch.arange(500), first)
    model.update({i: first[i] for i in range(500)})
    store.flush()
    second = _rows(800, seed=2)
    ids = torch.arange(300, 1100)
    store.write(ids, second)
    model.update({int(i): r for i, r in zip(ids, second)})

    inject_device_fault(store, kind, errno_code=err, on_map=on_map)
    with pytest.raises(OSError) as e:
        store.flush()
    assert e.value.errno == err and str(path) in str(e.value), e.value
    assert not isinstance(e.value, CorruptionError)
    assert "injected" in str(e.value)
    _check(store, model, "rows after the failed flush")  # usable, nothing lost

    more = _rows(100, seed=3)  # keeps accepting writes
    store.write(torch.arange(1900, 2000), more)
    model.update({1900 + i: more[i] for i in range(100)})
    store.flush()  # the fault was a one-off: the retry succeeds
    assert store.stats()["cache_dirty_rows"] == 0
    store.close()
    _reopened(path, model, engine)


@pytest.mark.parametrize("kind", ["write_error", "sync_error"])
def test_repeated_flush_failures_lose_nothing(tmp_path: Path, kind: str) -> None:
    """Batches written between several failed flushes all survive the first good one."""
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=4, segment_blocks=4)  # holds every row
    model = {}
    for k in range(5):
        rows = _rows(300, seed=10 + k)
        ids = torch.arange(200 * k, 200 * k + 300)
        store.write(ids, rows)
        model.update({int(i): r for i, r in zip(ids, rows)})
        inject_device_fault(store, kind, errno_code=errno.ENOSPC, on_map=bool(k % 2))
        with pytest.raises(OSError) as e:
            store.flush()
        assert e.value.errno == errno.ENOSPC
    store.flush()
    _check(store, model, "rows after repeated failures")
    store.close()
    _reopened(path, model)


def test_write_back_failure_during_write(tmp_path: Path, engine: str) -> None:
    """With the cache off, full segments are written during write(): a failure there
    raises, but the batch was accepted (it reads back) and a later flush persists it."""
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=0, segment_blocks=1, io_engine=engine)
    inject_device_fault(store, "write_error", errno_code=errno.ENOSPC)
    rows = _rows(1000, seed=4)
    with pytest.raises(OSError) as e:
        store.write(torch.arange(1000), rows)
    assert e.value.errno == errno.ENOSPC and str(path) in str(e.value)
    model = {i: rows[i] for i in range(1000)}
    _check(store, model, "rows accepted by the failed write")
    store.flush()
    store.close()
    _reopened(path, model)


def test_read_after_failed_write_back(tmp_path: Path) -> None:
    """Regression test (bug fixed in 92f25a0): while a write-back keeps failing
    (e.g. the disk is full), read() failed too, although it had read the rows. Cache off,
    segment_blocks=1, write_error armed for 100 operations (ENOSPC): write(0..999) raises;
    then read([0, 1999]) must return row 0 as written and row 1999's initial value."""
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=0, segment_blocks=1)
    inject_device_fault(store, "write_error", count=100, errno_code=errno.ENOSPC)
    rows = _rows(1000, seed=4)
    with pytest.raises(OSError):
        store.write(torch.arange(1000), rows)
    try:
        got = store.read(torch.tensor([0, N - 1]))
    except OSError as e:
        inject_device_fault(store, "write_error", count=0)  # disarm, so close() can flush
        store.close()
        pytest.fail(f"read() of accepted rows failed because a write-back failed: {e}")
    inject_device_fault(store, "write_error", count=0)
    want = torch.cat([rows[:1], expected_lazy(store, [N - 1], 0, (-0.01, 0.01))])
    assert_rows_equal(got, want)
    store.close()


def test_failed_close_keeps_store_open(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=1, io_engine=engine)
    rows = _rows(700, seed=5)
    store.write(torch.arange(700), rows)
    inject_device_fault(store, "write_error", errno_code=errno.ENOSPC)
    with pytest.raises(OSError) as e:
        store.close()
    assert e.value.errno == errno.ENOSPC and str(path) in str(e.value)
    model = {i: rows[i] for i in range(700)}
    _check(store, model, "rows after the failed close")  # still open and usable
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.read([0])
    _reopened(path, model)


def test_failed_snapshot_keeps_store_usable(tmp_path: Path) -> None:
    path, snap = tmp_path / "t.tbl", tmp_path / "snap.tbl"
    store = BlockStore(path, N, DIM, dram_cache_mb=1)
    rows = _rows(100, seed=6)
    store.write(torch.arange(100), rows)
    inject_device_fault(store, "sync_error", errno_code=errno.EIO)
    with pytest.raises(OSError) as e:
        store.snapshot(snap)
    assert e.value.errno == errno.EIO and str(path) in str(e.value)
    assert not snap.exists() and not list(tmp_path.glob("*.tmp"))
    store.snapshot(snap)
    store.close()
    _reopened(snap, {i: rows[i] for i in range(100)})


# Read faults ----------------------------------------------------------------------------
@pytest.mark.parametrize("cache_mb", [0, 1], ids=["no-cache", "cache"])
def test_read_error_leaves_store_usable(tmp_path: Path, engine: str, cache_mb: float) -> None:
    path, store, model = _on_disk_store(tmp_path, engine, cache_mb)
    with store:
        inject_device_fault(store, "read_error", errno_code=errno.EIO)
        ids = torch.arange(0, 1000, 7)
        with pytest.raises(OSError) as e:
            store.read(ids)
        assert e.value.errno == errno.EIO and str(path) in str(e.value)
        assert not isinstance(e.value, CorruptionError)
        assert store.stats()["cache_rows"] == 0, "a failed read must not cache anything"
        assert_rows_equal(store.read(ids), torch.stack([model[int(i)] for i in ids]), "retried read")
        _check(store, model, "all rows after a read error")


def test_read_error_after_some_operations(tmp_path: Path) -> None:
    path, store, model = _on_disk_store(tmp_path, "threads")
    with store:
        inject_device_fault(store, "read_error", after=2, errno_code=errno.EIO)
        for k in range(2):  # the first two device reads go through
            store.read(torch.tensor([k * 100]))
        with pytest.raises(OSError):
            store.read(torch.tensor([500]))
        assert_rows_equal(store.read(torch.tensor([500])), model[500][None])


def test_corrupt_read_detected(tmp_path: Path, engine: str) -> None:
    path, store, model = _on_disk_store(tmp_path, engine, cache_mb=1)
    with store:
        inject_device_fault(store, "corrupt_read")
        with pytest.raises(CorruptionError, match=f"{path}.*log block") as e:
            store.read(torch.tensor([3, 600]))
        assert e.value.errno == errno.EBADMSG
        assert_rows_equal(store.read(torch.tensor([3, 600])), torch.stack([model[3], model[600]]))
        _check(store, model, "rows after a corrupted read")
    _reopened(path, model)


# Faults during garbage collection -----------------------------------------------------
def _gc_store(tmp_path: Path) -> tuple:
    """A nearly full log (overprovision 0.1, 4-block segments) on disk, reopened so that
    the next rewrites must collect garbage from segments read back from the device."""
    path = tmp_path / "t.tbl"
    rows = _rows(N, seed=1)
    with BlockStore(path, N, DIM, dram_cache_mb=0, segment_blocks=4, overprovision=0.1) as store:
        store.write(torch.arange(N), rows)
    store = BlockStore.open(path, dram_cache_mb=0)
    model = {i: rows[i] for i in range(N)}
    model["rewritten"] = set()
    g = torch.Generator().manual_seed(0)
    k = 0
    # Scatter dead rows until the free segments are just above what the collector keeps.
    while store.stats()["free_segments"] > store.stats()["gc_reserve_segments"] + 1:
        _rewrite_until_gc(store, model, g, seed=20 + k)
        k += 1
    assert store.stats()["gc_rows_moved"] == 0
    return path, store, model, g


def _rewrite_until_gc(store: BlockStore, model: dict, g: torch.Generator, seed: int) -> None:
    ids = torch.randperm(N, generator=g)[:300]
    r = _rows(300, seed=seed)
    store.write(ids, r)
    model.update({int(i): x for i, x in zip(ids, r)})
    model["rewritten"].update(ids.tolist())


@pytest.mark.parametrize("kind", ["read_error", "corrupt_read"])
def test_fault_during_gc_leaves_store_usable(tmp_path: Path, kind: str) -> None:
    path, store, model, g = _gc_store(tmp_path)
    inject_device_fault(store, kind, errno_code=errno.EIO)
    try:
        _rewrite_until_gc(store, model, g, seed=30)
        raised = None
    except OSError as e:
        raised = e
    if raised is not None:
        assert str(path) in str(raised)
        assert raised.errno == (errno.EBADMSG if kind == "corrupt_read" else errno.EIO)
        _rewrite_until_gc(store, model, g, seed=31)  # the retry goes through
    assert store.stats()["gc_rows_moved"] > 0
    _check(store, model, "rows after a fault during garbage collection")
    store.close()
    _reopened(path, model)


def test_persistent_read_error_during_gc_is_reported(tmp_path: Path) -> None:
    """Regression (fixed): SegmentLog::CollectGarbage retries a victim whose read fails
    without bound (MoveLiveRows fails before changing anything, so the same segment is
    picked again), so one write() spins until the device recovers -- forever on a
    persistent EIO (a 60 s run with the fault armed for 10^12 operations never returned).
    Inputs: table N=2000, dim=12, overprovision=0.1, segment_blocks=4, cache off, on disk
    and reopened; read_error armed for 100000 operations; a rewrite of 300 random rows
    that needs garbage collection. Expected: OSError EIO after a bounded number of tries,
    the fault still armed for (almost) all its operations. Got: the write retried the read
    100000 times, consuming every armed fault, before raising."""
    path, store, model, g = _gc_store(tmp_path)
    armed = 100_000
    inject_device_fault(store, "read_error", count=armed, errno_code=errno.EIO)
    with pytest.raises(OSError) as e:
        _rewrite_until_gc(store, model, g, seed=30)
    assert e.value.errno == errno.EIO and str(path) in str(e.value)
    # Rows not rewritten since the reopen are on disk only: reading them must still hit
    # the armed fault if the collector gave up early.
    try:
        store.read(torch.tensor(sorted(set(range(N)) - model["rewritten"])))
        still_armed = False
    except OSError:
        still_armed = True
    inject_device_fault(store, "read_error", count=0)  # disarm
    store.close()
    assert still_armed, (
        f"garbage collection retried a failing device read until all {armed} armed faults "
        "were consumed (unbounded retry: a persistent read error hangs write())")
