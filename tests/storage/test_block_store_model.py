"""BlockStore against an in-memory model: hypothesis-generated operation sequences
(read / write / flush / reopen / snapshot, flushes and reads hit by device faults, with
caches of 0 to a few rows and segments small enough that garbage collection runs), and
concurrent readers and writers."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, \
    run_state_machine_as_test

from tests.support.block_store_helpers import (assert_rows_equal, random_rows, reference_init_rows,
                                               uring_unavailable_reason)
from tests.support.paths import REPO_ROOT
from tests.support.watch import run_watched
from torchrec_mtrains.storage import BlockStore, CorruptionError
from torchrec_mtrains.testing import enable_device_faults, inject_device_fault

CACHE_OVERHEAD_BYTES = 40  # per cached row, as csrc/storage/block_store_open.cc sizes the cache
TRACE = os.environ.get("MTRAINS_MODEL_TRACE") == "1"  # log every operation to stderr (child runs)


def trace(*parts: object) -> None:
    if TRACE:
        print(*parts, file=sys.stderr, flush=True)


def cache_mb_for_rows(rows: int, row_bytes: int) -> float:
    """dram_cache_mb that gives a cache of exactly `rows` rows (0: no cache)."""
    return (rows + 0.5) * (row_bytes + CACHE_OVERHEAD_BYTES) / 2**20 if rows else 0.0


@st.composite
def table_configs(draw: st.DrawFn) -> dict:
    dim = draw(st.sampled_from([3, 16, 1100]))  # 1100 fp32: a row spans two blocks
    return dict(
        num_rows=draw(st.integers(1, 60 if dim == 1100 else 400)),
        dim=dim,
        state_dim=draw(st.integers(0, 2)),
        dtype=draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16])),
        seed=draw(st.integers(0, 2**64 - 1)),
        init_range=draw(st.sampled_from([(-0.01, 0.01), (-1.0, 3.0), (2.0, 2.0)])),
        block_size=draw(st.sampled_from([4096, 4096, 8192])),
        segment_blocks=draw(st.integers(1, 4)),
        overprovision=draw(st.sampled_from([0.1, 0.1, 0.3, 1.0])),
    )


class StoreMachine(RuleBasedStateMachine):
    """Drives one table through random operations; `model` holds every row written."""

    engines: List[str] = ["threads"]
    root: Path = Path("/tmp")

    def __init__(self) -> None:
        super().__init__()
        self.dir = self.root / uuid.uuid4().hex
        self.dir.mkdir()
        self.path = self.dir / "t.tbl"
        self.store: BlockStore | None = None
        self.model: Dict[int, torch.Tensor] = {}
        self.snapshots = 0
        self.write_seed = 0

    # Set-up -----------------------------------------------------------------------------
    @initialize(cfg=table_configs(), cache_rows=st.sampled_from([0, 1, 3, 50, 10**6]),
                engine_index=st.integers(0, 1), direct_io=st.booleans())
    def create(self, cfg: dict, cache_rows: int, engine_index: int, direct_io: bool) -> None:
        trace("create", self.path, cfg, f"cache_rows={cache_rows}", f"engine_index={engine_index}",
              f"direct_io={direct_io}")
        self.cfg = cfg
        self.row_bytes = (cfg["dim"] + cfg["state_dim"]) * cfg["dtype"].itemsize
        self.store = BlockStore(
            self.path, cfg["num_rows"], cfg["dim"], state_dim=cfg["state_dim"], dtype=cfg["dtype"],
            dram_cache_mb=cache_mb_for_rows(cache_rows, self.row_bytes), init_range=cfg["init_range"],
            seed=cfg["seed"], direct_io=direct_io, block_size=cfg["block_size"],
            segment_blocks=cfg["segment_blocks"], overprovision=cfg["overprovision"],
            io_engine=self.engines[engine_index % len(self.engines)],
        )
        assert self.store.stats()["cache_capacity_rows"] == min(cache_rows, cfg["num_rows"])
        self.file_size = os.stat(self.path).st_size
        self.lazy = reference_init_rows(torch.arange(cfg["num_rows"]), cfg["dim"], cfg["state_dim"],
                                        cfg["seed"], cfg["init_range"], cfg["dtype"])

    def expected(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.lazy[ids].clone()
        for k, i in enumerate(ids.tolist()):
            if i in self.model:
                out[k] = self.model[i]
        return out

    def ids(self, data: st.DataObject, max_size: int) -> torch.Tensor:
        n = self.cfg["num_rows"]
        return torch.tensor(data.draw(st.lists(st.integers(0, n - 1), max_size=max_size)), dtype=torch.int64)

    # Operations ---------------------------------------------------------------------------
    @rule(data=st.data())
    def write(self, data: st.DataObject) -> None:
        ids = self.ids(data, max_size=120)
        self.write_seed += 1
        rows = random_rows(len(ids), self.store.row_width, self.cfg["dtype"], self.write_seed)
        trace("write", ids.tolist(), f"rows=random_rows(seed={self.write_seed})")
        self.store.write(ids, rows)
        for i, r in zip(ids.tolist(), rows):  # the last of repeated ids wins
            self.model[i] = r

    @rule(data=st.data(), use_out=st.booleans())
    def read(self, data: st.DataObject, use_out: bool) -> None:
        ids = self.ids(data, max_size=60)
        out = torch.empty((len(ids), self.store.row_width), dtype=self.cfg["dtype"]) if use_out else None
        trace("read", ids.tolist())
        assert_rows_equal(self.store.read(ids, out=out), self.expected(ids), "read")

    @rule()
    def read_all(self) -> None:
        ids = torch.arange(self.cfg["num_rows"])
        trace("read_all")
        assert_rows_equal(self.store.read(ids), self.expected(ids), "read of every row")

    @rule()
    def flush(self) -> None:
        trace("flush")
        self.store.flush()
        s = self.store.stats()
        assert s["cache_dirty_rows"] == 0
        assert s["live_rows"] == len(self.model), (s["live_rows"], len(self.model))

    @rule(cache_rows=st.sampled_from([0, 2, 10**6]), engine_index=st.integers(0, 1),
          direct_io=st.booleans())
    def reopen(self, cache_rows: int, engine_index: int, direct_io: bool) -> None:
        trace("reopen", f"cache_rows={cache_rows}", f"engine_index={engine_index}", f"direct_io={direct_io}")
        self.store.close()
        self.store = BlockStore.open(self.path, dram_cache_mb=cache_mb_for_rows(cache_rows, self.row_bytes),
                                     direct_io=direct_io,
                                     io_engine=self.engines[engine_index % len(self.engines)])
        assert self.store.stats()["live_rows"] == len(self.model)

    @precondition(lambda self: self.snapshots < 3)
    @rule()
    def snapshot(self) -> None:
        self.snapshots += 1
        dst = self.dir / f"snap{self.snapshots}.tbl"
        trace("snapshot")
        self.store.snapshot(dst)
        ids = torch.arange(self.cfg["num_rows"])
        with BlockStore.open(dst, dram_cache_mb=0) as copy:
            assert_rows_equal(copy.read(ids), self.expected(ids), "snapshot")
        dst.unlink()

    @rule(kind=st.sampled_from(["write_error", "sync_error"]), on_map=st.booleans(),
          after=st.integers(0, 2))
    def failed_flush(self, kind: str, on_map: bool, after: int) -> None:
        """A flush hit by a device fault raises OSError (or succeeds if it did no I/O of
        that kind); nothing is lost and the next flush works."""
        trace("failed_flush", kind, f"on_map={on_map}", f"after={after}")
        inject_device_fault(self.store, kind, after=after, errno_code=errno.ENOSPC, on_map=on_map)
        try:
            self.store.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC and str(self.path) in str(e), e
        finally:
            inject_device_fault(self.store, kind, count=0, on_map=on_map)  # disarm
        self.flush()

    @rule(data=st.data(), kind=st.sampled_from(["read_error", "corrupt_read"]))
    def failed_read(self, data: st.DataObject, kind: str) -> None:
        """A read hit by a device fault raises OSError / CorruptionError (or succeeds if it
        read nothing from the device); a retry returns the right rows."""
        ids = self.ids(data, max_size=60)
        trace("failed_read", kind, ids.tolist())
        inject_device_fault(self.store, kind, errno_code=errno.EIO)
        try:
            got = self.store.read(ids)
        except CorruptionError as e:
            assert kind == "corrupt_read" and str(self.path) in str(e), e
            got = None
        except OSError as e:
            assert kind == "read_error" and e.errno == errno.EIO and str(self.path) in str(e), e
            got = None
        finally:
            inject_device_fault(self.store, kind, count=0)  # disarm
        if got is None:
            got = self.store.read(ids)
        assert_rows_equal(got, self.expected(ids), "read after a device fault")

    @invariant()
    def stats_consistent(self) -> None:
        if self.store is None:
            return
        s = self.store.stats()
        assert s["cache_dirty_rows"] <= s["cache_rows"] <= s["cache_capacity_rows"]
        assert s["live_rows"] <= len(self.model)
        assert s["free_segments"] <= s["log_segments"]
        assert s["cache_hits"] + s["cache_misses"] == s["rows_read"]
        assert os.stat(self.path).st_size == self.file_size, "the table file changed size"

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
                with BlockStore.open(self.path, dram_cache_mb=0) as again:  # final check from disk
                    ids = torch.arange(self.cfg["num_rows"])
                    assert_rows_equal(again.read(ids), self.expected(ids), "rows after the final reopen")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_machine(root: str, max_examples: int, steps: int, derandomize: bool) -> None:
    """Runs the state machine (in the child process of the tests below)."""
    enable_device_faults()  # the child has no conftest: its stores take faults on command
    StoreMachine.root = Path(root)
    StoreMachine.engines = ["threads"] if uring_unavailable_reason(root) else ["uring", "threads"]
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(max_examples=max_examples, stateful_step_count=steps, deadline=None,
                          derandomize=derandomize, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]),
    )


STALL_S = 60  # no operation for this long: the store hangs (operations take milliseconds)


def _run_machine_in_child(tmp_path: Path, max_examples: int, steps: int, derandomize: bool) -> None:
    """Runs the machine in a child process: a store that hangs (a livelock in C++ holds the
    store's mutex and ignores signals) fails the test, with the operations of the hanging
    example, instead of stalling the suite. The child logs each operation; it is hung when
    it logs none for STALL_S, however long the whole run takes on a loaded machine."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.storage import test_block_store_model as m
        m.run_machine({str(tmp_path)!r}, {max_examples}, {steps}, {derandomize})
        """
    )
    env = dict(os.environ, MTRAINS_MODEL_TRACE="1")
    try:
        res = run_watched([sys.executable, "-c", script], STALL_S, env)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        lines = err.splitlines()
        start = max((k for k, line in enumerate(lines) if line.startswith("create ")), default=0)
        pytest.fail(f"the store hung (no operation for {STALL_S} s); operations of the hanging example:\n"
                    + "\n".join(lines[start:][-80:]))
    if res.returncode != 0:
        tail = [line for line in res.stderr.splitlines()
                if not line.startswith(("create ", "write ", "read", "flush", "reopen ", "snapshot",
                                        "failed_"))]
        pytest.fail(f"model check failed (rc={res.returncode}):\n{res.stdout[-6000:]}\n"
                    + "\n".join(tail[-150:]))


def test_random_operations_match_model(tmp_path: Path) -> None:
    """60 fixed (derandomized) sequences of up to 30 operations: the same every run."""
    _run_machine_in_child(tmp_path, max_examples=60, steps=30, derandomize=True)


@pytest.mark.slow
def test_random_operations_match_model_long(tmp_path: Path) -> None:
    """300 fresh random sequences of up to 50 operations (different every run)."""
    _run_machine_in_child(tmp_path, max_examples=300, steps=50, derandomize=False)


# Concurrency -----------------------------------------------------------------------------
HANG_S = 300  # a wait this long means a thread hung (or starved), not a slow machine


def test_concurrent_reader_writer_and_flusher(tmp_path: Path, engine: str) -> None:
    """A writer rewrites rows [0, 3000) with increasing versions while a reader reads
    [2000, 4000) and a third thread flushes and snapshots. Every row read is a version the
    writer wrote (or the initial value), versions seen never go back, rows never written stay
    at their initial value, and the final table equals the writer's model, also after reopen.

    The threads run until the counters say what the test needs happened, not for a time:
    garbage collection moved rows (the log of 12 segments, 3 of them kept for the collector,
    fills after ~45 writes of 150 rows), then the reader read 20 more batches and the flusher
    (a flush every 5 writes, a snapshot every third flush) took 2 more snapshots, all while
    the writer kept writing."""
    n, dim = 4000, 7
    reads_after_gc, snapshots_after_gc, flush_every = 20, 2, 5
    path = tmp_path / "t.tbl"
    # Segments of 8 blocks, 50% spare: garbage collection runs without the small-segment
    # livelock that test_block_store.py::test_gc_makes_progress_with_one_block_segments shows.
    store = BlockStore(path, n, dim, dram_cache_mb=cache_mb_for_rows(200, 32), segment_blocks=8,
                       overprovision=0.5, io_engine=engine, seed=5)
    lazy = reference_init_rows(torch.arange(n), dim, 1, 5, (-0.01, 0.01))
    model: Dict[int, float] = {}
    errors: List[BaseException] = []
    stop = threading.Event()
    gc_seen, reads_done, snapshots_done = threading.Event(), threading.Event(), threading.Event()
    progress = threading.Condition()  # notified at each write, event and failure
    writes, reads, snapshots = [0], [0], [0]

    def announce(event: threading.Event) -> None:
        with progress:
            event.set()
            progress.notify_all()

    def guarded(fn):
        def run() -> None:
            try:
                fn()
            except BaseException as e:  # reported by the main thread
                errors.append(e)
                stop.set()
            finally:
                with progress:
                    progress.notify_all()
        return run

    @guarded
    def writer() -> None:
        g = torch.Generator().manual_seed(1)
        version = 0
        while not stop.is_set():
            version += 1
            ids = torch.randperm(3000, generator=g)[:150]
            rows = torch.full((150, dim + 1), float(version))
            rows[:, 0] = ids.float()
            store.write(ids, rows)
            for i in ids.tolist():
                model[i] = float(version)
            if not gc_seen.is_set():
                if store.stats()["gc_rows_moved"] > 0:
                    announce(gc_seen)
                elif version >= 2000:  # 40 times what fills the log
                    raise AssertionError(f"garbage collection moved no row in {version} writes of 150 rows")
            with progress:
                writes[0] = version
                progress.notify_all()

    @guarded
    def reader() -> None:
        g = torch.Generator().manual_seed(2)
        seen = torch.zeros(n)
        after_gc = 0
        while not stop.is_set():
            gc_before = gc_seen.is_set()
            ids = torch.randint(2000, 4000, (120,), generator=g)
            got = store.read(ids)
            reads[0] += 1
            for k, i in enumerate(ids.tolist()):
                row = got[k]
                if torch.equal(row, lazy[i]):
                    assert seen[i] == 0, f"row {i} went back to its initial value"
                    continue
                assert i < 3000, f"row {i} was never written but reads {row}"
                assert row[0] == i and torch.all(row[1:] == row[1]), f"row {i} is torn: {row}"
                assert row[1] >= seen[i], f"row {i} went back from version {seen[i]} to {row[1]}"
                seen[i] = row[1]
            after_gc += gc_before
            if after_gc >= reads_after_gc and not reads_done.is_set():
                announce(reads_done)

    @guarded
    def flusher() -> None:
        k, flushed_at, after_gc = 0, 0, 0
        while True:
            with progress:  # wait for the writer's next writes
                progress.wait_for(lambda: stop.is_set() or writes[0] >= flushed_at + flush_every)
            if stop.is_set():
                return
            flushed_at = writes[0]
            gc_before = gc_seen.is_set()
            store.flush()
            store.stats()
            k += 1
            if k % 3 == 0:
                store.snapshot(tmp_path / "snap.tbl")
                snapshots[0] += 1
                after_gc += gc_before
                if after_gc >= snapshots_after_gc and not snapshots_done.is_set():
                    announce(snapshots_done)

    threads = [threading.Thread(target=f, daemon=True) for f in (writer, reader, flusher)]
    for t in threads:
        t.start()
    with progress:  # HANG_S is a hang guard, not a window the work must fit in
        progress.wait_for(lambda: errors or (gc_seen.is_set() and reads_done.is_set() and snapshots_done.is_set()),
                          timeout=HANG_S)
    stop.set()
    with progress:
        progress.notify_all()
    for t in threads:
        t.join(timeout=60)
    if any(t.is_alive() for t in threads):  # leave the store alone: a hung call holds its lock
        pytest.fail("a thread hung inside the store")
    if errors:
        raise errors[0]
    assert gc_seen.is_set() and reads_done.is_set() and snapshots_done.is_set(), (
        f"after {writes[0]} writes, {reads[0]} reads, {snapshots[0]} snapshots: "
        f"gc {gc_seen.is_set()}, reads {reads_done.is_set()}, snapshots {snapshots_done.is_set()}")
    assert reads[0] > 10 and len(model) > 1000

    want = lazy.clone()
    for i, v in model.items():
        want[i, 0], want[i, 1:] = i, v
    assert_rows_equal(store.read(torch.arange(n)), want, "final table")
    assert store.stats()["gc_rows_moved"] > 0
    store.close()
    with BlockStore.open(path, dram_cache_mb=0) as again:
        assert_rows_equal(again.read(torch.arange(n)), want, "final table after reopen")
    with BlockStore.open(tmp_path / "snap.tbl", dram_cache_mb=0) as snap:  # a consistent copy
        rows = snap.read(torch.arange(n))
        for i in range(n):
            if not torch.equal(rows[i], lazy[i]):
                assert rows[i, 0] == i and torch.all(rows[i, 1:] == rows[i, 1]) and rows[i, 1] <= model[i]


def test_concurrent_writers_disjoint_ids(tmp_path: Path) -> None:
    """Two writers on disjoint id ranges, each with its own model, with a small cache and
    tiny segments: both models hold at the end."""
    n, dim = 2000, 5
    path = tmp_path / "t.tbl"
    store = BlockStore(path, n, dim, dram_cache_mb=cache_mb_for_rows(50, 24), segment_blocks=8,
                       overprovision=0.3)
    models: List[Dict[int, torch.Tensor]] = [{}, {}]
    errors: List[BaseException] = []

    def writer(part: int) -> None:
        try:
            g = torch.Generator().manual_seed(part)
            for rnd in range(150):
                ids = torch.randint(part * 1000, part * 1000 + 1000, (60,), generator=g)
                rows = random_rows(60, dim + 1, torch.float32, seed=part * 1000 + rnd)
                store.write(ids, rows)
                for i, r in zip(ids.tolist(), rows):
                    models[part][i] = r
                if rnd % 25 == 0:
                    store.flush()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(p,), daemon=True) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if any(t.is_alive() for t in threads):
        pytest.fail("a writer hung inside the store")
    assert not errors, errors
    assert store.stats()["gc_rows_moved"] > 0
    store.close()
    with BlockStore.open(path, dram_cache_mb=0) as again:
        for model in models:
            ids = torch.tensor(sorted(model))
            assert_rows_equal(again.read(ids), torch.stack([model[int(i)] for i in ids]))


# Crash consistency --------------------------------------------------------------------
@pytest.mark.parametrize("cache_rows", [0, 40])
def test_copy_of_live_file_is_consistent(tmp_path: Path, cache_rows: int) -> None:
    """A copy of the table file taken at any moment (what a crash would leave, as the
    store's writes are synchronous) opens, holds every row flushed and not rewritten since,
    exactly, and for every other row one of the values it had since that flush -- even while
    garbage collection reuses segments."""
    n, dim = 600, 6
    path = tmp_path / "t.tbl"
    store = BlockStore(path, n, dim, dram_cache_mb=cache_mb_for_rows(cache_rows, 28), segment_blocks=4,
                       overprovision=0.3, seed=2)
    lazy = reference_init_rows(torch.arange(n), dim, 1, 2, (-0.01, 0.01))
    flushed = lazy.clone()  # each row as of the last explicit flush
    since: Dict[int, List[torch.Tensor]] = {}  # values written since that flush
    g = torch.Generator().manual_seed(cache_rows)
    crash = tmp_path / "crash.tbl"
    for rnd in range(60):
        ids = torch.randint(0, n, (int(torch.randint(1, 150, (1,), generator=g)),), generator=g)
        rows = random_rows(len(ids), dim + 1, torch.float32, seed=1000 + rnd)
        store.write(ids, rows)
        for i, r in zip(ids.tolist(), rows):
            since.setdefault(i, []).append(r)
        if rnd % 5 == 4:
            store.flush()
            for i, values in since.items():
                flushed[i] = values[-1]
            since = {}
        if rnd % 3 == 0:
            shutil.copyfile(path, crash)
            with BlockStore.open(crash, dram_cache_mb=0) as copy:
                got = copy.read(torch.arange(n))
            for i in range(n):
                ok = torch.equal(got[i], flushed[i]) or any(torch.equal(got[i], v) for v in since.get(i, []))
                assert ok, f"round {rnd}: row {i} of the copy holds a value it never had since the last flush"
            crash.unlink()
    assert store.stats()["gc_rows_moved"] > 0
    store.close()
