"""BlockStore failure paths: bad input, files of another format, damaged or truncated
files, missing / read-only directories, a full disk.

Each error must be ValueError / IndexError / OSError (CorruptionError for checksums) with a
message naming the table file and the bad value, and must leave the store usable and the
file as it was.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.block_store_helpers import (
    HDR_BLOCK_SIZE,
    HDR_DIM,
    HDR_DTYPE,
    HDR_NUM_SEGMENTS,
    HDR_VERSION,
    assert_rows_equal,
    expected_lazy,
    file_bytes,
    flip_byte,
    log_offset,
    patch_header,
    random_rows,
    remount,
    row_bytes,
    tmpfs,
)
from torchrec_mtrains.storage import BlockStore, CorruptionError
from torchrec_mtrains.testing import inject_device_fault

N, DIM = 1000, 8


@pytest.fixture
def table(tmp_path: Path) -> Path:
    """A flushed table whose rows 0..299 were written (in order, so the first log blocks
    hold rows 0, 1, 2, ...), closed."""
    path = tmp_path / "t.tbl"
    with BlockStore(path, N, DIM, dram_cache_mb=0, seed=3) as store:
        store.write(torch.arange(300), _rows(300))
    return path


def _rows(n: int, seed: int = 0) -> torch.Tensor:
    return random_rows(n, DIM + 1, torch.float32, seed)


def _check_intact(path: Path) -> None:
    """The table written by the `table` fixture reads back exactly."""
    with BlockStore.open(path, dram_cache_mb=0) as store:
        assert_rows_equal(store.read(torch.arange(300)), _rows(300), "written rows")
        rest = torch.arange(300, N)
        assert_rows_equal(store.read(rest), expected_lazy(store, rest, 3, (-0.01, 0.01)))


# Bad ids and rows ------------------------------------------------------------------
@pytest.mark.parametrize("bad", [N, N + 5, 2**62, -1, -(2**40)])
def test_id_out_of_range(table: Path, bad: int) -> None:
    with BlockStore.open(table, dram_cache_mb=0.01) as store:
        ids = torch.tensor([1, 2, bad, 4])
        with pytest.raises(IndexError, match=rf"{table}.*row id {bad}\b.*\[0, {N}\)"):
            store.read(ids)
        with pytest.raises(IndexError, match=rf"{table}.*row id {bad}\b"):
            store.write(ids, _rows(4, seed=9))
        # Nothing of the refused batch was applied; the store still works.
        assert_rows_equal(store.read(torch.tensor([1, 2, 4])), _rows(300)[[1, 2, 4]])
        store.write(torch.tensor([5]), _rows(1, seed=10))
    with BlockStore.open(table) as store:
        assert_rows_equal(store.read(torch.tensor([5])), _rows(1, seed=10))
        assert_rows_equal(store.read(torch.tensor([1, 2, 4])), _rows(300)[[1, 2, 4]])


@pytest.mark.parametrize("id_dtype", [torch.int8, torch.int16, torch.int32])
def test_negative_small_int_ids(table: Path, id_dtype: torch.dtype) -> None:
    with BlockStore.open(table) as store:
        with pytest.raises(IndexError, match=rf"{table}.*row id -3\b"):
            store.read(torch.tensor([0, -3], dtype=id_dtype))


@pytest.mark.parametrize(
    "ids,match",
    [
        (torch.tensor([1.0, 2.0]), "integer tensor, got dtype torch.float32"),
        (torch.tensor([True, False]), "integer tensor, got dtype torch.bool"),
        ([0.5], "integer tensor, got dtype torch.float"),
        (torch.tensor([[1, 2]]), r"1-D, got shape \(1, 2\)"),
        (torch.tensor(3), r"1-D, got shape \(\)"),
    ],
    ids=["float", "bool", "float-list", "2-D", "0-D"],
)
def test_ids_of_wrong_dtype_or_shape(table: Path, ids: object, match: str) -> None:
    with BlockStore.open(table) as store:
        with pytest.raises(ValueError, match=f"{table}: ids must be .*{match}"):
            store.read(ids)
        with pytest.raises(ValueError, match=f"{table}: ids must be .*{match}"):
            store.write(ids, _rows(2))
        assert_rows_equal(store.read(torch.tensor([7])), _rows(300)[[7]])
    _check_intact(table)


@pytest.mark.parametrize(
    "rows,match",
    [
        (torch.zeros(2, DIM), rf"shape \(2, {DIM}\), expected \(2, {DIM + 1}\)"),
        (torch.zeros(2, DIM + 2), rf"shape \(2, {DIM + 2}\), expected \(2, {DIM + 1}\)"),
        (torch.zeros(3, DIM + 1), rf"shape \(3, {DIM + 1}\), expected \(2, {DIM + 1}\)"),
        (torch.zeros(DIM + 1), rf"shape \({DIM + 1},\)"),
        (torch.zeros(2, DIM + 1, dtype=torch.float64), "dtype torch.float64, the table holds torch.float32"),
        (torch.zeros(2, DIM + 1, dtype=torch.float16), "dtype torch.float16, the table holds torch.float32"),
        ([[0.0] * (DIM + 1)] * 2, "must be a torch.Tensor, got list"),
    ],
    ids=["narrow", "wide", "count", "1-D", "float64", "float16", "list"],
)
def test_rows_of_wrong_width_dtype_or_count(table: Path, rows: object, match: str) -> None:
    with BlockStore.open(table, dram_cache_mb=0) as store:
        with pytest.raises(ValueError, match=f"{table}: rows .*{match}"):
            store.write(torch.tensor([0, 1]), rows)
    _check_intact(table)


@pytest.mark.parametrize(
    "out,match",
    [
        (torch.zeros(2, DIM), rf"out has shape \(2, {DIM}\)"),
        (torch.zeros(2, DIM + 1, dtype=torch.bfloat16), "out has dtype torch.bfloat16"),
        (torch.zeros(DIM + 1, 2).t(), "out must be contiguous"),
    ],
    ids=["shape", "dtype", "strided"],
)
def test_bad_out_tensor(table: Path, out: torch.Tensor, match: str) -> None:
    with BlockStore.open(table) as store:
        with pytest.raises(ValueError, match=match):
            store.read(torch.tensor([0, 1]), out=out)
        assert_rows_equal(store.read(torch.tensor([0, 1])), _rows(300)[:2])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_rows=0), "num_rows=0"),
        (dict(num_rows=-5), "num_rows=-5"),
        (dict(num_rows=2**49), f"num_rows={2**49}"),
        (dict(dim=0), "dim=0"),
        (dict(dim=2**21), f"dim={2**21}"),
        (dict(state_dim=-1), "state_dim=-1"),
        (dict(dim=2**20, state_dim=1), "dim=1048576 and state_dim=1"),
        (dict(dtype=torch.float64), "dtype=torch.float64"),
        (dict(dtype=torch.int32), "dtype=torch.int32"),
        (dict(init_range=(1.0, -1.0)), r"init_range=\(1.0, -1.0\)"),
        (dict(init_range=(0.0, float("inf"))), "init_range"),
        (dict(init_range=(0.0,)), "init_range"),
        (dict(seed=-1), "seed=-1"),
        (dict(block_size=2048), "block_size=2048"),
        (dict(block_size=5000), "block_size=5000"),
        (dict(segment_blocks=0), "segment_blocks=0"),
        (dict(overprovision=0.05), "overprovision=0.05"),
        (dict(overprovision=float("nan")), "overprovision=nan"),
        (dict(dram_cache_mb=-1), "dram_cache_mb=-1"),
        (dict(io_engine="aio"), "io_engine='aio'"),
        (dict(queue_depth=0), "queue_depth=0"),
        (dict(io_threads=0), "io_threads=0"),
        (dict(direct_io="yes"), "direct_io='yes'"),
        (dict(num_rows=10.0), "num_rows=10.0"),
    ],
)
def test_bad_table_settings_name_the_value_and_create_nothing(tmp_path: Path, kwargs: dict,
                                                              match: str) -> None:
    args = dict(num_rows=10, dim=4)
    args.update(kwargs)
    path = tmp_path / "t.tbl"
    with pytest.raises(ValueError, match=match):
        BlockStore(path, **args)
    assert list(tmp_path.iterdir()) == [], "a refused create left files behind"


def test_bad_stripe_settings(tmp_path: Path) -> None:
    path = tmp_path / "t.tbl"
    with pytest.raises(ValueError, match="named twice"):
        BlockStore(path, 10, 4, stripe_paths=[tmp_path / "a", tmp_path / "a"])
    with pytest.raises(ValueError, match=f"must be non-empty and differ from {path}"):
        BlockStore(path, 10, 4, stripe_paths=[path, tmp_path / "b"])
    with pytest.raises(ValueError, match="too long for the header"):
        BlockStore(path, 10, 4, stripe_paths=[tmp_path / ("x" * 200) / "y" for _ in range(30)])
    # A stripe in a missing directory: the error names it, and no file is left behind.
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nodir" / "s1")):
        BlockStore(path, 10, 4, stripe_paths=[tmp_path / "s0", tmp_path / "nodir" / "s1"])
    assert list(tmp_path.iterdir()) == []


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="path must be a str"):
        BlockStore(123, 10, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty or contains a NUL"):
        BlockStore("", 10, 4)
    with pytest.raises(ValueError, match="NUL"):
        BlockStore.open(str(tmp_path / "a\0b"))


def test_unknown_fault_kind(table: Path) -> None:
    with BlockStore.open(table) as store:
        with pytest.raises(ValueError, match="unknown fault kind 'disk_on_fire'"):
            inject_device_fault(store, "disk_on_fire")


# Missing and read-only directories ------------------------------------------------------
def test_missing_directory_and_file(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "t.tbl"
    with pytest.raises(FileNotFoundError, match=f"directory of {path} does not exist") as e:
        BlockStore(path, 10, 4)
    assert e.value.errno == errno.ENOENT
    missing = tmp_path / "missing.tbl"
    with pytest.raises(FileNotFoundError, match=f"table file {missing} does not exist"):
        BlockStore.open(missing)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        BlockStore.open(tmp_path)


def test_read_only_directory(tmp_path: Path) -> None:
    """Creating in, or opening for writing from, a read-only filesystem fails with EROFS /
    EACCES naming the file (as root, chmod does not stop us: use a read-only mount)."""
    with tmpfs("1m") as d:
        existing = d / "t.tbl"
        with BlockStore(existing, 100, 4, direct_io=False) as store:
            store.write(torch.tensor([1]), torch.ones(1, 5))
        before = file_bytes(existing)
        remount(d, "ro")
        path = d / "new.tbl"
        with pytest.raises(OSError, match=str(path)) as e:
            BlockStore(path, 10, 4)
        assert e.value.errno in (errno.EROFS, errno.EACCES)
        with pytest.raises(OSError, match=str(existing)) as e:
            BlockStore.open(existing)
        assert e.value.errno in (errno.EROFS, errno.EACCES)
        assert file_bytes(existing) == before
        remount(d, "rw")
        with BlockStore.open(existing, direct_io=False) as store:
            assert torch.all(store.read(torch.tensor([1])) == 1)


# Files of another format --------------------------------------------------------------
@pytest.mark.parametrize(
    "content,match",
    [
        (b"", "too short to hold a table header"),
        (b"hello\n" * 10, "too short to hold a table header"),
        (b"PK\x03\x04" + bytes(10000), r"not a torchrec_mtrains block-store table \(bad magic\)"),
        (bytes(8192), "bad magic"),
    ],
    ids=["empty", "text", "zip", "zeros"],
)
def test_open_file_of_another_format(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "other.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{path}.*{match}"):
        BlockStore.open(path)
    assert path.read_bytes() == content


@pytest.mark.parametrize(
    "offset,fmt,value,match",
    [
        (HDR_VERSION, "I", 1, r"format version 1 is not supported \(this build reads version 2\)"),
        (HDR_VERSION, "I", 3, "format version 3 is not supported"),
        (HDR_DTYPE, "I", 9, "dtype code 9 is unknown"),
        (HDR_BLOCK_SIZE, "I", 5000, "block_size=5000"),
        (HDR_DIM, "I", 0, "dim=0"),
        (HDR_NUM_SEGMENTS, "Q", 0, "num_segments=0"),
        (HDR_NUM_SEGMENTS, "Q", 2**50, "num_segments"),
    ],
    ids=["old-version", "version", "dtype", "block_size", "dim", "no-segments", "huge-log"],
)
def test_open_header_with_bad_field(table: Path, offset: int, fmt: str, value: int, match: str) -> None:
    """A header with a valid checksum but a field this build cannot accept: ValueError."""
    patch_header(table, offset, fmt, value)
    before = file_bytes(table)
    with pytest.raises(ValueError, match=f"{table}.*{match}"):
        BlockStore.open(table)
    assert file_bytes(table) == before


def test_open_truncated_file(table: Path) -> None:
    full = os.stat(table).st_size
    for size in (full - 4096, full // 2, 4096 + 100):
        os.truncate(table, size)
        with pytest.raises(ValueError, match=rf"{table} is truncated: {size} bytes, the header needs {full}"):
            BlockStore.open(table)
    os.truncate(table, 1000)
    with pytest.raises(ValueError, match=f"{table}.*too short"):
        BlockStore.open(table)


# Stripes -------------------------------------------------------------------------------
def _striped(tmp_path: Path, name: str, seed: int) -> tuple:
    path = tmp_path / f"{name}.tbl"
    stripes = [tmp_path / f"{name}.s{i}" for i in range(3)]
    with BlockStore(path, 3000, DIM, dram_cache_mb=0, segment_blocks=2, stripe_paths=stripes,
                    seed=seed) as store:
        store.write(torch.arange(3000), random_rows(3000, DIM + 1, torch.float32, seed))
    return path, stripes


def test_stripe_of_another_table_is_detected(tmp_path: Path) -> None:
    a, a_stripes = _striped(tmp_path, "a", 1)
    b, b_stripes = _striped(tmp_path, "b", 2)
    # A stripe opened as a table: not a table.
    with pytest.raises(ValueError, match=f"{a_stripes[0]}.*bad magic"):
        BlockStore.open(a_stripes[0])
    # Table a with b's stripe 1 in place of its own: never b's rows, always an error.
    os.replace(b_stripes[1], a_stripes[1])
    try:
        store = BlockStore.open(a, dram_cache_mb=0)
    except (ValueError, OSError) as e:  # refused at open: fine
        assert str(a_stripes[1]) in str(e) or str(a) in str(e)
        return
    with store:
        saw_error = False
        for start in range(0, 3000, 100):
            ids = torch.arange(start, start + 100)
            try:
                got = store.read(ids)
            except CorruptionError as e:
                assert str(a) in str(e) and "another table" in str(e), e
                saw_error = True
                continue
            assert_rows_equal(got, random_rows(3000, DIM + 1, torch.float32, 1)[start:start + 100])
        assert saw_error, "rows in a foreign stripe were read without an error"


def test_missing_or_truncated_stripe(tmp_path: Path) -> None:
    a, stripes = _striped(tmp_path, "a", 1)
    os.rename(stripes[2], tmp_path / "away")
    with pytest.raises(FileNotFoundError, match=f"stripe file {stripes[2]} of {a} is missing"):
        BlockStore.open(a)
    os.rename(tmp_path / "away", stripes[2])
    os.truncate(stripes[0], 4096)
    with pytest.raises(ValueError, match=f"stripe file {stripes[0]} of {a} is truncated"):
        BlockStore.open(a)


# Damaged files -------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["row data", "row id", "footer crc", "footer magic"])
def test_flipped_byte_in_data_block_detected(table: Path, engine: str, where: str) -> None:
    """A flipped bit in a log block: CorruptionError naming the file and block, never the
    damaged row; other blocks stay readable; rewriting the row repairs it."""
    with BlockStore.open(table) as store:
        rb, rpb, bs = row_bytes(store), int(store.layout["rows_per_block"]), int(store.layout["block_size"])
        log0 = log_offset(store)
    offset = log0 + {
        "row data": rb * 2 + 3,  # row 2 (slot 2 of block 0)
        "row id": bs - 24 - 8 * rpb + 8 * 2,  # the id of slot 2
        "footer crc": bs - 24 + 4,
        "footer magic": bs - 24,
    }[where]
    flip_byte(table, offset)
    damaged = file_bytes(table)
    block0 = torch.arange(rpb)  # rows 0..rpb-1 live in log block 0
    with BlockStore.open(table, dram_cache_mb=0.01, io_engine=engine) as store:
        with pytest.raises(CorruptionError, match=rf"{table}.*log block 0\b") as e:
            store.read(torch.tensor([2]))
        assert e.value.errno == errno.EBADMSG
        assert isinstance(e.value, OSError)
        with pytest.raises(CorruptionError):
            store.read(torch.tensor([250, 0]))  # any batch touching the block
        assert_rows_equal(store.read(torch.arange(rpb, 300)), _rows(300)[rpb:], "other blocks")
        assert_rows_equal(store.read(torch.tensor([999])), expected_lazy(store, [999], 3, (-0.01, 0.01)))
        assert file_bytes(table) == damaged, "a failed read changed the file"
        # Rewriting the damaged block's rows repairs them.
        store.write(block0, _rows(300)[:rpb])
        assert_rows_equal(store.read(torch.tensor([2])), _rows(300)[[2]])
    _check_intact(table)


def test_flipped_byte_in_header_detected(table: Path) -> None:
    flip_byte(table, HDR_DIM)  # a field, covered by the header crc32c
    with pytest.raises((CorruptionError, ValueError), match=f"{table}.*header checksum"):
        BlockStore.open(table)
    flip_byte(table, HDR_DIM)
    flip_byte(table, 1)  # the magic
    with pytest.raises(ValueError, match=f"{table}.*bad magic"):
        BlockStore.open(table)
    flip_byte(table, 1)
    _check_intact(table)


def test_flipped_byte_in_location_map_detected(table: Path) -> None:
    with BlockStore.open(table) as store:
        bs = int(store.layout["block_size"])
    flip_byte(table, bs + 8 * 5)  # row 5's map entry
    with pytest.raises(CorruptionError, match=f"{table}.*location-map page 0"):
        BlockStore.open(table)
    flip_byte(table, bs + 8 * 5)
    _check_intact(table)


# A full disk ---------------------------------------------------------------------------
def _fill_until_enospc(store: BlockStore, dim: int) -> tuple:
    """Writes 256-row batches (flushing now and then) until one fails; returns the model
    of accepted rows, the failing batch and the error."""
    model, error, uncertain = {}, None, {}
    for k in range(1, 40):  # 256 rows a batch (< one Reserve), about 1 MB in all
        ids = torch.arange(1000 + 256 * (k - 1), 1000 + 256 * k)
        rows = random_rows(256, dim + 1, torch.float32, seed=100 + k)
        try:
            store.write(ids, rows)
            model.update({int(i): r for i, r in zip(ids, rows)})
            if k % 4 == 0:
                store.flush()
        except OSError as e:
            error, uncertain = e, {int(i): r for i, r in zip(ids, rows)}
            break
    return model, uncertain, error


def test_full_disk(tmp_path: Path, engine: str) -> None:
    """On a small filesystem, writes and flushes fail with ENOSPC naming the file; nothing
    accepted is lost (the store reads it, and a flush after space is freed persists it),
    and the file on disk stays a consistent table throughout."""
    with tmpfs("4m") as d:
        path, filler = d / "t.tbl", d / "filler"
        n, dim = 20000, 31  # 128-byte rows, 30 per block
        store = BlockStore(path, n, dim, dram_cache_mb=0, segment_blocks=8, io_engine=engine,
                           direct_io=False)
        first = random_rows(1000, dim + 1, torch.float32, seed=1)
        store.write(torch.arange(1000), first)
        store.flush()
        filler.write_bytes(bytes(os.statvfs(d).f_bavail * os.statvfs(d).f_frsize - 96 * 1024))

        model, uncertain, error = _fill_until_enospc(store, dim)
        model.update({i: first[i] for i in range(1000)})
        assert error is not None, "a 4 MiB filesystem took 1 MB more without ENOSPC"
        assert error.errno == errno.ENOSPC, error
        assert str(path) in str(error), error
        assert not isinstance(error, CorruptionError)

        with pytest.raises(OSError) as e:
            store.flush()
        assert e.value.errno == errno.ENOSPC and str(path) in str(e.value)

        # Meanwhile the file is a consistent table as of some commit: a second opener sees
        # the first flush's rows and, for every other row, a value it really had. It opens
        # a copy of the file's bytes: the live store owns the file itself (a second open of
        # it is refused), and the copy leaves it untouched.
        shutil.copyfile(path, tmp_path / "t.tbl")
        with BlockStore.open(tmp_path / "t.tbl", dram_cache_mb=0, direct_io=False) as other:
            assert_rows_equal(other.read(torch.arange(1000)), first, "rows flushed before the disk filled")
            rest = torch.arange(1000, n)
            got = other.read(rest)
            lazy = expected_lazy(other, rest, 0, (-0.01, 0.01))
            for j, i in enumerate(rest.tolist()):
                if not torch.equal(got[j], lazy[j]):
                    assert i in model and torch.equal(got[j], model[i]), f"row {i} is damaged"

        # Free the space: everything accepted reads back (the failing batch entirely or
        # not at all), and the retried flush persists it.
        filler.unlink()
        ids = torch.tensor(sorted(model))
        assert_rows_equal(store.read(ids), torch.stack([model[int(i)] for i in ids]), "accepted rows")
        if uncertain:
            u = torch.tensor(sorted(uncertain))
            got = store.read(u)
            new = torch.stack([uncertain[int(i)] for i in u])
            old = expected_lazy(store, u, 0, (-0.01, 0.01))
            assert torch.equal(got, new) or torch.equal(got, old)
            if torch.equal(got, new):
                model.update(uncertain)
        store.flush()
        store.close()
        with BlockStore.open(path, dram_cache_mb=0, direct_io=False) as again:
            ids = torch.tensor(sorted(model))
            assert_rows_equal(again.read(ids), torch.stack([model[int(i)] for i in ids]), "after retry")


def test_reads_work_while_disk_full(tmp_path: Path) -> None:
    """Regression test (bug fixed in 92f25a0): after a write fails with ENOSPC
    (cache off, so full segments wait in memory), read() failed too -- BlockStore::Read
    returned the error of its trailing SegmentLog::FlushQueue although `out` was filled.
    Reads of rows in memory, on disk or never written must succeed while the disk is full.
    Same check via an injected fault: test_block_store_faults.py::test_read_after_failed_write_back."""
    with tmpfs("4m") as d:
        path, filler = d / "t.tbl", d / "filler"
        store = BlockStore(path, 20000, 31, dram_cache_mb=0, segment_blocks=8, direct_io=False)
        store.write(torch.arange(1000), random_rows(1000, 32, torch.float32, seed=1))
        store.flush()
        filler.write_bytes(bytes(os.statvfs(d).f_bavail * os.statvfs(d).f_frsize - 96 * 1024))
        model, _, error = _fill_until_enospc(store, 31)
        assert error is not None and error.errno == errno.ENOSPC
        try:
            got = store.read(torch.tensor([0, 19999]))  # a flushed row and a never-written one
        except OSError as e:
            pytest.fail(f"read() failed while the disk is full: {e}")
        finally:
            filler.unlink()
            store.close()
        assert_rows_equal(got[:1], random_rows(1000, 32, torch.float32, seed=1)[:1])


# Snapshot failures ---------------------------------------------------------------------
def test_snapshot_to_bad_destination(table: Path, tmp_path: Path) -> None:
    with BlockStore.open(table) as store:
        with pytest.raises(ValueError, match=f"must differ from {table}"):
            store.snapshot(table)
        dst = tmp_path / "nodir" / "snap.tbl"
        with pytest.raises(FileNotFoundError, match=str(dst)):
            store.snapshot(dst)
        store.write(torch.tensor([0]), _rows(1, seed=5))  # still usable
        store.snapshot(tmp_path / "ok.tbl")
    assert not list(tmp_path.rglob("*.tmp"))
    with BlockStore.open(tmp_path / "ok.tbl") as copy:
        assert_rows_equal(copy.read(torch.tensor([0, 1])), torch.cat([_rows(1, seed=5), _rows(300)[[1]]]))


def test_snapshot_of_striped_table_to_long_path(tmp_path: Path) -> None:
    """Regression (fixed): BlockStore::Snapshot re-encodes the header with the new stripe
    paths (dst + ".stripeN") without the length check Create does (header_bytes <= 4000),
    so EncodeHeader writes past the 4096-byte header buffer: the process aborts with
    "double free or corruption". Expected: a ValueError (paths too long for the header)
    or a snapshot that opens. Run in a subprocess so the crash cannot take pytest down."""
    script = textwrap.dedent(
        f"""
        import os, torch
        from torchrec_mtrains.storage import BlockStore
        base = {str(tmp_path)!r}
        stripes = [os.path.join(base, f"s{{i}}") for i in range(3)]
        s = BlockStore(os.path.join(base, "t.tbl"), 100, 8, stripe_paths=stripes)
        s.write(torch.arange(10), torch.ones(10, 9))
        d = base
        for i in range(6):
            d = os.path.join(d, chr(97 + i) * 220)
        os.makedirs(d)
        dst = os.path.join(d, "snap")  # ~1350 characters; 3 stripe names ~4100 bytes
        try:
            s.snapshot(dst)
        except ValueError as e:
            print("REFUSED", e)
        else:
            t = BlockStore.open(dst)
            assert torch.all(t.read(torch.arange(10)) == 1)
            print("SNAPSHOT OK")
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and ("REFUSED" in res.stdout or "SNAPSHOT OK" in res.stdout), (
        f"snapshot of a striped table to a {1350}-character path crashed or failed "
        f"(rc={res.returncode}): {res.stdout[-500:]} {res.stderr[-1500:]}"
    )


# A forked child ------------------------------------------------------------------------------
def test_a_forked_child_cannot_use_or_disturb_the_parents_store(tmp_path: Path) -> None:
    """A child forked with a store open gets a clear error if it uses it, and its exit (the
    handle's destructor) neither flushes through the parent's I/O rings nor drops its
    queued writes: the parent then flushes, reads and reopens its rows."""
    path = tmp_path / "t.blk"
    store = BlockStore(path, num_rows=1000, dim=8, state_dim=1)
    ids = torch.arange(0, 1000, 7)
    rows = random_rows(ids.numel(), 9, torch.float32, seed=3)
    store.write(ids, rows)  # accepted, not yet flushed
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only, and skip pytest's teardown
        code = 1
        try:
            store.read(ids[:3])
        except RuntimeError as e:
            code = 0 if "forked child cannot use it" in str(e) else 2
        store.close()  # the child's copy: released without I/O
        del store
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert_rows_equal(store.read(ids), rows)
    store.flush()
    store.close()
    reopened = BlockStore.open(path)
    assert_rows_equal(reopened.read(ids), rows)
    reopened.close()


# One runtime config for every way of opening a store ----------------------------------------
def test_runtime_config_opens_and_conflicts_with_loose_arguments(tmp_path: Path) -> None:
    from torchrec_mtrains.storage import StoreRuntimeConfig

    path = tmp_path / "t.blk"
    runtime = StoreRuntimeConfig(dram_cache_mb=1.0, io_engine="threads", io_threads=2)
    store = BlockStore(path, num_rows=100, dim=4, runtime=runtime)
    assert store.io_engine == "threads"
    store.close()
    store = BlockStore.open(path, runtime=runtime)
    assert store.io_engine == "threads"
    store.close()
    with pytest.raises(ValueError, match=r"not both: \['io_engine'\]"):
        BlockStore.open(path, io_engine="threads", runtime=runtime)
    with pytest.raises(ValueError, match="must be a StoreRuntimeConfig"):
        BlockStore.open(path, runtime={"io_engine": "threads"})
