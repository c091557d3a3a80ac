"""ScmStore: a table in byte-addressable storage-class memory (the SCM tier).

The table is a memory-mapped file: on a DAX mount of PMem or CXL memory the loads and
stores go straight to the device; on any other filesystem it is an mmap through the page
cache (which is how it is tested here). Rows are read and written in place with
vectorised gathers and scatters, without block I/O.

File layout (little-endian): a 4 KiB header (magic ``MTRNSCM1`` then a JSON object with the
table's shape, dtype, init range and seed, zero padding, and in its last 4 bytes the CRC-32
(zlib) of the bytes before them; 0 there marks a file written before the checksum), then
``num_rows`` rows of ``(dim + state_dim) * itemsize`` bytes, then one little-endian u32 per
row: the crc32c of the row's bytes (0 mapped to 1), or 0 while the row has never been
written. Rows never written read as their deterministic initial value (lazy_init.py); every
other row is checked against its checksum on each read, so a flipped bit in the file is
reported (``CorruptionError`` naming the file and row), never returned as weights. Files of
the first format (no ``"row_checksums"`` key in the header: one written-flag byte per row,
no checksums) still open and work, unchecked.

A process killed in the middle of a write may leave a row whose checksum does not match
its bytes; that row then reads as corrupt until it is written again (restore the last
checkpoint), rather than as a half-written row. A power cut can do the same to any row
written since the last ``flush`` (its bytes and checksum reach the disk in pages written
back at different times); rows not written since read as of that flush, and the table
itself (created with its directory entry synced) is never lost.

A store into a mapping cannot report a full disk -- the kernel sends SIGBUS and the process
dies -- so by default the file's blocks are reserved at creation (``posix_fallocate``: on
ext4/xfs an instant extent allocation) and a table that does not fit fails there with an
OSError naming its file. ``preallocate=False`` makes a sparse file that takes no space until
rows are written, for tables far larger than what they will ever touch, at that risk.

An open store owns its file: it holds an exclusive lock on it until ``close`` (file_lock.py),
and a second open -- in another process, or this one -- is refused with BlockingIOError
naming the file and the holder's pid, before anything is truncated or mapped.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from torchrec_mtrains.storage._validation import (
    PathLike,
    as_ids,
    check_init_range,
    check_int,
    check_path,
    check_row_range,
    check_rows,
    id_range_checked_by_op,
)
from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.storage.file_lock import FileLock, lock_file
from torchrec_mtrains.storage.fsync import fsync_path
from torchrec_mtrains.storage.types import CorruptionError, RowStore

__all__ = ["ScmStore"]

_MAGIC = b"MTRNSCM1"
_HEADER_BYTES = 4096
_CRC_AT = _HEADER_BYTES - 4  # header bytes covered by the CRC-32 stored after them
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_ROW_CHECKSUMS = "crc32c"  # the header's "row_checksums" value in files with a checksum per row
_WHAT = "SCM table file"  # what ownership errors call the file


class ScmStore(RowStore):
    """A table in a memory-mapped file. Create with ``ScmStore(path, num_rows, dim, ...)``,
    reopen with ``ScmStore.open(path)``. Not thread-safe for concurrent writes to the same
    rows (callers serialise, as TieredEmbeddingBags does)."""

    def __init__(
        self,
        path: PathLike,
        num_rows: int,
        dim: int,
        state_dim: int = 1,
        dtype: torch.dtype = torch.float32,
        init_range: Tuple[float, float] = (-0.01, 0.01),
        seed: int = 0,
        overwrite: bool = False,
        preallocate: bool = True,
    ) -> None:
        check_int("num_rows", num_rows, 1, 2**40)
        check_int("dim", dim, 1, 2**20)
        check_int("state_dim", state_dim, 0, 2**20)
        check_init_range(init_range)
        check_int("seed", seed, 0, 2**64 - 1)
        names = {v: k for k, v in _DTYPES.items()}
        if dtype not in names:
            raise ValueError(f"dtype={dtype} must be one of {list(_DTYPES.values())}")
        path = check_path(path)
        meta = {
            "num_rows": num_rows, "dim": dim, "state_dim": state_dim, "dtype": names[dtype],
            "init_range": [float(init_range[0]), float(init_range[1])], "seed": seed,
            "row_checksums": _ROW_CHECKSUMS,
        }
        header = _encode_header(meta)
        size = _file_bytes(meta)
        # No O_TRUNC: an existing file is emptied only once its lock is ours (never under
        # another store's mapping, which would then fault).
        flags = os.O_RDWR | os.O_CREAT | (0 if overwrite else os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o644)
        except FileExistsError as e:
            raise FileExistsError(e.errno, f"{path} already exists (pass overwrite=True)") from None
        except FileNotFoundError as e:
            raise FileNotFoundError(e.errno, f"the directory of {path} does not exist") from None
        try:
            lock = lock_file(path, _WHAT, fd=os.dup(fd))  # its own descriptor: held after fd closes
        except OSError:
            os.close(fd)  # the file stays: it is another store's (or, just created, its next one's)
            raise
        try:
            os.ftruncate(fd, 0)  # an overwritten table keeps none of its old rows
            os.ftruncate(fd, size)
            if preallocate:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not SIGBUS on a later store
            os.pwrite(fd, header, 0)
            os.fsync(fd)
            _fsync_dir(os.path.dirname(path) or ".")  # the new file's entry survives a power cut
        except OSError as e:
            os.close(fd)
            os.unlink(path)
            lock.release()
            raise OSError(e.errno, f"cannot create {path} ({size:,} bytes): {e.strerror}") from None
        os.close(fd)
        self._map(path, meta, lock)

    @classmethod
    def open(cls, path: PathLike) -> "ScmStore":
        """Opens an existing table file, validating its header and size."""
        path = check_path(path)
        try:
            lock = lock_file(path, _WHAT)
        except FileNotFoundError:
            raise FileNotFoundError(2, f"table file {path} does not exist") from None
        try:
            with open(path, "rb") as f:
                head = f.read(_HEADER_BYTES)
            meta = _decode_header(path, head)
            expected = _file_bytes(meta)
            size = os.path.getsize(path)
            # Created with exactly this size (ftruncate): any other size means the header
            # does not describe this file (or the file was cut or extended).
            if size != expected:
                what = "truncated" if size < expected else "longer than its header says"
                raise ValueError(f"{path} is {what}: {size} bytes, the header needs {expected}")
        except (OSError, ValueError):
            lock.release()
            raise
        store = cls.__new__(cls)
        store._map(path, meta, lock)
        return store

    def _map(self, path: str, meta: Dict[str, Any], lock: FileLock) -> None:
        load_extension()
        self._lock = lock
        self.path = path
        self.num_rows, self.dim, self.state_dim = meta["num_rows"], meta["dim"], meta["state_dim"]
        self.dtype = _DTYPES[meta["dtype"]]
        self.init_range = tuple(meta["init_range"])
        self.seed = meta["seed"]
        self.checksummed = _has_row_checksums(meta)
        row_bytes, tail_bytes = _row_bytes(meta), _tail_bytes(meta)
        self._rows_mm = np.memmap(path, np.uint8, "r+", _HEADER_BYTES, (self.num_rows, row_bytes))
        self._tail_mm = np.memmap(
            path, np.uint8, "r+", _HEADER_BYTES + self.num_rows * row_bytes, (self.num_rows * tail_bytes,)
        )
        self.data = torch.from_numpy(self._rows_mm).view(self.dtype)
        # Per row: its crc32c (0: never written), or in first-format files a written flag.
        self._tail = torch.from_numpy(self._tail_mm).view(torch.int32 if self.checksummed else torch.bool)
        self._rows_read = self._rows_written = self._lazy_rows = 0

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        ids = self._checked(ids)
        args = (self.data, self._tail, ids, self.dim, self.state_dim, self.seed,
                float(self.init_range[0]), float(self.init_range[1]))
        with id_range_checked_by_op(self.path, ids, self.num_rows):
            if self.checksummed:
                rows, lazy, bad = torch.ops.mtrains.gather_rows_checked(*args)
            else:
                (rows, lazy), bad = torch.ops.mtrains.gather_rows_or_init(*args), -1
        if bad >= 0:
            raise CorruptionError(
                errno.EBADMSG,
                f"{self.path}: row {int(ids[bad])} (byte offset {self._row_offset(int(ids[bad]))}): crc32c "
                "mismatch, the row's bytes or its checksum are damaged (write the row again or restore "
                "a checkpoint)")
        self._lazy_rows += lazy
        self._rows_read += ids.numel()
        if out is None:
            return rows
        check_rows(self.path, out, ids.numel(), self.row_width, self.dtype, "out")
        out.copy_(rows)
        return out

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        ids = self._checked(ids)
        check_rows(self.path, rows, ids.numel(), self.row_width, self.dtype, "rows")
        # Rows are copied in order, so for a repeated id the last one wins.
        scatter = torch.ops.mtrains.scatter_rows_checked if self.checksummed else torch.ops.mtrains.scatter_rows_mark
        with id_range_checked_by_op(self.path, ids, self.num_rows):  # checked before any row is written
            scatter(rows.contiguous(), ids, self.data, self._tail)
        self._rows_written += ids.numel()

    def attach_to(self, mover: torch.ScriptObject, table: int) -> None:
        if getattr(self, "_rows_mm", None) is None:
            raise ValueError(f"{self.path} is closed")
        words = self._tail if self.checksummed else self._tail.view(torch.uint8)
        mover.set_mapped(table, self.data, words, self.dim, self.state_dim, self.seed,
                         float(self.init_range[0]), float(self.init_range[1]), self.path, _HEADER_BYTES)

    def count_moved(self, rows_read: int, rows_written: int, lazy_rows: int) -> None:
        self._rows_read += rows_read
        self._rows_written += rows_written
        self._lazy_rows += lazy_rows

    def written_ids(self, start: int, stop: int) -> torch.Tensor:
        """The ids in ``[start, stop)`` of rows ever written (a nonzero checksum or written
        flag in the row's tail mark), ascending int64; the others read as their lazy initial
        value. Scans the range's 4-byte marks (1-byte in first-format files) only."""
        if getattr(self, "_rows_mm", None) is None:
            raise ValueError(f"{self.path} is closed")
        check_row_range(self.path, start, stop, self.num_rows)
        return torch.nonzero(self._tail[start:stop]).view(-1).add_(start)

    def flush(self) -> None:
        """msyncs the mapping (on PMem/CXL DAX mounts this persists the stores)."""
        if getattr(self, "_rows_mm", None) is None:
            raise ValueError(f"{self.path} is closed")
        self._rows_mm.flush()
        self._tail_mm.flush()

    def close(self) -> None:
        if getattr(self, "_rows_mm", None) is None:
            return
        self.flush()
        del self.data, self._tail
        self._rows_mm = self._tail_mm = None
        self._lock.release()  # after the mapping is gone: the next owner may truncate

    def stats(self) -> Dict[str, float]:
        """Counters; ``rows_materialised`` (rows ever written, so held by the file rather than
        initialised lazily) scans a 4-byte mark per row."""
        return {
            "rows_read": float(self._rows_read),
            "rows_written": float(self._rows_written),
            "lazy_init_rows": float(self._lazy_rows),
            "rows_materialised": float(torch.count_nonzero(self._tail)) if self._rows_mm is not None else 0.0,
        }

    def _row_offset(self, row: int) -> int:
        return _HEADER_BYTES + row * self.data.shape[1] * self.data.element_size()

    def _checked(self, ids: object) -> torch.Tensor:
        if getattr(self, "_rows_mm", None) is None:
            raise ValueError(f"{self.path} is closed")
        return as_ids(self.path, ids)


_fsync_dir = fsync_path  # the entries of a directory (a file just created in it)


def _row_bytes(meta: Dict[str, Any]) -> int:
    return (meta["dim"] + meta["state_dim"]) * torch.empty(0, dtype=_DTYPES[meta["dtype"]]).element_size()


def _has_row_checksums(meta: Dict[str, Any]) -> bool:
    """A file of the current format (a checksum per row), not the first (a written flag)."""
    return meta.get("row_checksums") == _ROW_CHECKSUMS


def _tail_bytes(meta: Dict[str, Any]) -> int:
    """Bytes per row after the rows: a u32 checksum, or the first format's written flag."""
    return 4 if _has_row_checksums(meta) else 1


def _file_bytes(meta: Dict[str, Any]) -> int:
    return _HEADER_BYTES + meta["num_rows"] * (_row_bytes(meta) + _tail_bytes(meta))


def _encode_header(meta: Dict[str, Any]) -> bytes:
    body = _MAGIC + json.dumps(meta).encode()
    if len(body) > _CRC_AT:
        raise ValueError(f"SCM table header of {len(body)} bytes does not fit in {_CRC_AT}")
    body = body.ljust(_CRC_AT, b"\0")
    return body + struct.pack("<I", zlib.crc32(body) or 1)  # 0 is reserved for "no checksum"


def _decode_header(path: str, head: bytes) -> Dict[str, Any]:
    """Parses and validates a header read from ``path``; raises ValueError naming the file
    and the bad field (never KeyError/TypeError, never a header that would map garbage)."""
    if not head.startswith(_MAGIC):
        raise ValueError(f"{path} is not an SCM table (bad magic)")
    if len(head) < _HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {len(head)} bytes, shorter than the SCM header")
    (stored,) = struct.unpack_from("<I", head, _CRC_AT)
    if stored != 0 and stored != (zlib.crc32(head[:_CRC_AT]) or 1):
        raise ValueError(f"{path}: SCM header checksum mismatch (corrupted header)")
    try:
        meta = json.loads(head[len(_MAGIC) : _CRC_AT].rstrip(b"\0"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: corrupted SCM header ({e})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: corrupted SCM header (not a JSON object)")
    try:
        for key in ("num_rows", "dim", "state_dim", "dtype", "init_range", "seed"):
            if key not in meta:
                raise ValueError(f"field {key!r} is missing")
        check_int("num_rows", meta["num_rows"], 1, 2**40)
        check_int("dim", meta["dim"], 1, 2**20)
        check_int("state_dim", meta["state_dim"], 0, 2**20)
        check_int("seed", meta["seed"], 0, 2**64 - 1)
        if not isinstance(meta["dtype"], str) or meta["dtype"] not in _DTYPES:
            raise ValueError(f"dtype={meta['dtype']!r} must be one of {sorted(_DTYPES)}")
        init = meta["init_range"]
        if not isinstance(init, list) or len(init) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in init
        ):
            raise ValueError(f"init_range={init!r} must be [lo, hi]")
        check_init_range(init)
        if meta.get("row_checksums", _ROW_CHECKSUMS) != _ROW_CHECKSUMS:
            raise ValueError(f"row_checksums={meta['row_checksums']!r} must be {_ROW_CHECKSUMS!r}")
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{path}: corrupted SCM header ({e})") from None
    return meta
