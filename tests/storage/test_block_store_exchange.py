"""BlockStore.exchange: a write then a read in one call, their device I/O overlapping.

Checked against write-then-read on a dict model: a row written and read in the same call,
or written in one call and read in the next (while its segment may still be queued or in
flight), reads its new value; bad input changes nothing; device faults in the middle of
the call raise (OSError / CorruptionError naming the file) and never yield garbage rows,
and nothing the call accepted is lost.
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

N, DIM = 3000, 12


def _rows(n: int, seed: int) -> torch.Tensor:
    return random_rows(n, DIM + 1, torch.float32, seed)


def _want(store: BlockStore, model: Dict[int, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    want = expected_lazy(store, ids, 0, (-0.01, 0.01))
    for k, i in enumerate(ids.tolist()):
        if i in model:
            want[k] = model[i]
    return want


def _on_disk_store(tmp_path: Path, engine: str, cache_mb: float) -> tuple:
    """A table whose rows 0..1499 are on disk (written, closed, reopened: not buffered),
    with small segments so that a few hundred written rows fill and queue several."""
    path = tmp_path / "t.tbl"
    rows = _rows(1500, seed=1)
    with BlockStore(path, N, DIM, dram_cache_mb=0, segment_blocks=4, io_engine=engine) as store:
        store.write(torch.arange(1500), rows)
    store = BlockStore.open(path, dram_cache_mb=cache_mb, io_engine=engine)
    return path, store, {i: rows[i] for i in range(1500)}


@pytest.mark.parametrize("cache_mb", [0, 0.05])
def test_exchange_matches_write_then_read(tmp_path: Path, engine: str, cache_mb: float) -> None:
    """Random exchanges (repeated ids, rows of the previous call's writes re-read, rows
    both written and read in one call) against a model of write-then-read."""
    _, store, model = _on_disk_store(tmp_path, engine, cache_mb)
    g = torch.Generator().manual_seed(7)
    last_written = torch.empty(0, dtype=torch.int64)
    with store:
        for step in range(12):
            w_ids = torch.randint(0, N, (int(torch.randint(0, 600, (1,), generator=g)),), generator=g)
            w_rows = _rows(w_ids.numel(), seed=100 + step)
            r_ids = torch.cat([
                torch.randint(0, N, (400,), generator=g),
                last_written[:100],   # written by the previous call
                w_ids[:50],           # written by this call
            ])
            got = store.exchange(w_ids, w_rows, r_ids)
            for i, r in zip(w_ids.tolist(), w_rows):
                model[i] = r  # the last of repeated ids wins
            assert_rows_equal(got, _want(store, model, r_ids), f"exchange {step}")
            last_written = w_ids
        store.flush()
        assert_rows_equal(store.read(torch.arange(N)), _want(store, model, torch.arange(N)), "all rows")


def test_exchange_into_out_and_empty_sides(tmp_path: Path, engine: str) -> None:
    _, store, model = _on_disk_store(tmp_path, engine, 0)
    with store:
        ids = torch.tensor([5, 1400, 2999, 5])
        out = torch.full((4, DIM + 1), float("nan"))
        got = store.exchange(torch.empty(0, dtype=torch.int64), torch.empty(0, DIM + 1), ids, out=out)
        assert got.data_ptr() == out.data_ptr()
        assert_rows_equal(out, _want(store, model, ids), "read only")
        rows = _rows(3, seed=9)
        got = store.exchange(torch.tensor([7, 8, 7]), rows, torch.empty(0, dtype=torch.int64))
        assert got.shape == (0, DIM + 1)
        model[7], model[8] = rows[2], rows[1]
        assert_rows_equal(store.read(torch.tensor([7, 8])), _want(store, model, torch.tensor([7, 8])), "write only")


@pytest.mark.parametrize(
    "case,exc,match",
    [
        ("write_id_out_of_range", IndexError, "3000"),
        ("read_id_out_of_range", IndexError, "-1"),
        ("write_rows_wrong_shape", ValueError, "write_rows"),
        ("write_rows_wrong_dtype", ValueError, "write_rows"),
        ("out_wrong_shape", ValueError, "out"),
        ("float_ids", ValueError, "ids"),
        ("out_overlaps_write_rows", ValueError, "overlap"),
    ],
)
def test_exchange_bad_input_changes_nothing(tmp_path: Path, case: str, exc: type, match: str) -> None:
    _, store, model = _on_disk_store(tmp_path, "threads", 0)
    w_ids, w_rows, r_ids, out = torch.tensor([1, 2, 3]), _rows(3, seed=5), torch.tensor([1, 2, 4]), None
    if case == "write_id_out_of_range":
        w_ids = torch.tensor([1, 3000, 3])
    elif case == "read_id_out_of_range":
        r_ids = torch.tensor([1, -1])
    elif case == "write_rows_wrong_shape":
        w_rows = _rows(2, seed=5)
    elif case == "write_rows_wrong_dtype":
        w_rows = w_rows.double()
    elif case == "out_wrong_shape":
        out = torch.empty(2, DIM + 1)
    elif case == "float_ids":
        r_ids = r_ids.float()
    elif case == "out_overlaps_write_rows":
        out = w_rows
    with store:
        before = store.stats()
        with pytest.raises(exc, match=match):
            store.exchange(w_ids, w_rows, r_ids, out=out)
        after = store.stats()
        assert (after["rows_read"], after["rows_written"]) == (before["rows_read"], before["rows_written"])
        ids = torch.arange(10)
        assert_rows_equal(store.read(ids), _want(store, model, ids), "rows after a refused exchange")
    with pytest.raises(ValueError, match="closed"):
        store.exchange(torch.tensor([1]), _rows(1, seed=5), torch.tensor([2]))


@pytest.mark.parametrize("kind", ["read_error", "corrupt_read"])
@pytest.mark.parametrize("cache_mb", [0, 0.05])
def test_read_fault_mid_exchange_raises_and_keeps_the_writes(
    tmp_path: Path, engine: str, kind: str, cache_mb: float
) -> None:
    """A read failing while the written rows' segments are in flight: the call raises (no
    rows returned), the writes were accepted, and the store goes on."""
    path, store, model = _on_disk_store(tmp_path, engine, cache_mb)
    w_ids = torch.arange(1500, 2400)  # fills several 4-block segments
    w_rows = _rows(w_ids.numel(), seed=3)
    r_ids = torch.arange(0, 1500, 3)  # on disk only
    with store:
        inject_device_fault(store, kind, errno_code=errno.EIO)
        with pytest.raises(OSError) as e:
            store.exchange(w_ids, w_rows, r_ids)
        if kind == "corrupt_read":
            assert isinstance(e.value, CorruptionError) and e.value.errno == errno.EBADMSG
        else:
            assert e.value.errno == errno.EIO and not isinstance(e.value, CorruptionError)
        assert str(path) in str(e.value)
        model.update({i: r for i, r in zip(w_ids.tolist(), w_rows)})
        assert_rows_equal(store.exchange(w_ids[:0], w_rows[:0], r_ids), _want(store, model, r_ids), "retried read")
        store.flush()
    with BlockStore.open(path, dram_cache_mb=0, io_engine="threads") as reopened:
        ids = torch.arange(N)
        assert_rows_equal(reopened.read(ids), _want(reopened, model, ids), "rows after reopen")


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_write_fault_mid_exchange_raises_and_loses_nothing(tmp_path: Path, engine: str, err: int) -> None:
    """The device refusing the written rows' segments while the reads stream: the call
    raises the write's errno; the rows read were right, the written rows stay in memory
    (readable) and a retried flush persists them."""
    path, store, model = _on_disk_store(tmp_path, engine, 0)
    w_ids = torch.arange(1500, 2400)
    w_rows = _rows(w_ids.numel(), seed=4)
    r_ids = torch.cat([torch.arange(0, 1500, 3), w_ids[::7]])
    model.update({i: r for i, r in zip(w_ids.tolist(), w_rows)})
    with store:
        inject_device_fault(store, "write_error", count=1, errno_code=err)
        with pytest.raises(OSError) as e:
            store.exchange(w_ids, w_rows, r_ids)
        assert e.value.errno == err and str(path) in str(e.value) and "flush() retries" in str(e.value)
        assert_rows_equal(store.read(r_ids), _want(store, model, r_ids), "rows read after the failed write")
        store.flush()
    with BlockStore.open(path, dram_cache_mb=0, io_engine="threads") as reopened:
        ids = torch.arange(N)
        assert_rows_equal(reopened.read(ids), _want(reopened, model, ids), "rows after reopen")
