"""Shared helpers of the BlockStore tests: reference implementations and file surgery.

The reference implementations follow the specs in csrc/storage/lazy_init.h (initial
values) and csrc/storage/block_format.h (file layout, crc32c), written independently of
the C++ so that a test compares the store against the spec, not against itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterator, Tuple

import numpy as np
import torch

from torchrec_mtrains.storage import BlockStore

# Format constants of csrc/storage/block_format.h.
HEADER_BYTES = 4096  # header content covered by the header crc32c
MAP_FOOTER_BYTES = 16
JOURNAL_BLOCK_BYTES = 4096
LOG_FOOTER_BYTES = 24
TABLE_MAGIC = b"MTRNBLK1"
# Byte offsets of header fields (EncodeHeader order, little-endian).
HDR_VERSION = 8  # u32
HDR_BLOCK_SIZE = 12  # u32
HDR_NUM_ROWS = 16  # u64
HDR_DIM = 24  # u32
HDR_DTYPE = 32  # u32
HDR_NUM_SEGMENTS = 64  # u64


# crc32c (Castagnoli, reflected, pre/post inverted: the standard CRC-32C of common/crc32c.h).
def _crc_table() -> Tuple[int, ...]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return tuple(table)


_CRC_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# Initial values (lazy_init.h): weight j of row r is lo + (hi - lo) * u with u the top 24
# bits of SplitMix64(seed, r, j), computed in float32; optimizer state starts at zero.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROW_SALT = np.uint64(0x632BE59BD9B4E019)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def reference_init_rows(
    ids: "torch.Tensor | list[int]",
    dim: int,
    state_dim: int,
    seed: int,
    init_range: Tuple[float, float],
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The initial value of rows ``ids`` as the spec defines it, ``[len(ids), dim + state_dim]``."""
    with np.errstate(over="ignore"):
        rows = np.asarray(torch.as_tensor(ids, dtype=torch.int64).numpy(), dtype=np.uint64)
        seed_mix = _mix(np.array([seed], dtype=np.uint64) ^ _GOLDEN)
        base = seed_mix ^ _mix(rows + _ROW_SALT)  # [n]
        cols = (np.arange(dim, dtype=np.uint64) + np.uint64(1)) * _GOLDEN  # [dim]
        r = _mix(base[:, None] + cols[None, :])
    u = (r >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    lo, hi = init_range
    span, flo = np.float32(float(hi) - float(lo)), np.float32(lo)
    weights = flo + span * u
    out = np.zeros((len(rows), dim + state_dim), dtype=np.float32)
    out[:, :dim] = weights
    return torch.from_numpy(out).to(dtype)


def expected_lazy(store: BlockStore, ids: "torch.Tensor | list[int]", seed: int,
                  init_range: Tuple[float, float]) -> torch.Tensor:
    return reference_init_rows(ids, store.dim, store.state_dim, seed, init_range, store.dtype)


def random_rows(n: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Distinct, finite rows (no NaN, so torch.equal compares them exactly)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((n, width), generator=g, dtype=torch.float32) * 200 - 100).to(dtype)


# File layout (block_format.h).
def map_pages(store_or_layout: "BlockStore | Dict[str, str]") -> int:
    layout = _layout(store_or_layout)
    block, rows = int(layout["block_size"]), int(layout["num_rows"])
    per_page = (block - MAP_FOOTER_BYTES) // 8
    return -(-rows // per_page)


def log_offset(store_or_layout: "BlockStore | Dict[str, str]") -> int:
    """Byte offset of log block 0 in the main file (unstriped tables)."""
    layout = _layout(store_or_layout)
    block = int(layout["block_size"])
    return block + map_pages(layout) * block


def journal_block_offset(store_or_layout: "BlockStore | Dict[str, str]", position: int) -> int:
    """Byte offset in the main file of map-journal block `position` (0: the first one after
    the descriptor) of an unstriped table: the journal region follows the log."""
    layout = _layout(store_or_layout)
    block = int(layout["block_size"])
    region = log_offset(layout) + int(layout["num_segments"]) * int(layout["segment_blocks"]) * block
    return region + JOURNAL_BLOCK_BYTES * (1 + position)


def main_file_bytes(store_or_layout: "BlockStore | Dict[str, str]") -> int:
    """Size of the main file of a striped table: header, map pages and the map journal
    region (twice the map pages and 16 blocks more) that follows them."""
    layout = _layout(store_or_layout)
    block = int(layout["block_size"])
    return log_offset(layout) + (2 * map_pages(layout) + 16) * block


def row_bytes(store: BlockStore) -> int:
    return store.row_width * store.dtype.itemsize


def _layout(x: "BlockStore | Dict[str, str]") -> Dict[str, str]:
    return x.layout if isinstance(x, BlockStore) else x


def flip_byte(path: "str | os.PathLike[str]", offset: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1, f"offset {offset} is past the end of {path}"
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def patch_header(path: "str | os.PathLike[str]", offset: int, fmt: str, value: int) -> None:
    """Overwrites a header field and re-seals the header crc32c, as a valid-looking but
    foreign or damaged table would have it."""
    with open(path, "r+b") as f:
        header = bytearray(f.read(HEADER_BYTES))
        struct.pack_into("<" + fmt, header, offset, value)
        struct.pack_into("<I", header, HEADER_BYTES - 4, crc32c(bytes(header[: HEADER_BYTES - 4])))
        f.seek(0)
        f.write(header)


def file_bytes(path: "str | os.PathLike[str]") -> bytes:
    return Path(path).read_bytes()


@contextlib.contextmanager
def tmpfs(size: str, options: str = "") -> Iterator[Path]:
    """Mounts a tmpfs of `size` (e.g. "2m") on a fresh directory; skips the test when
    mounting is not permitted (not root, or no CAP_SYS_ADMIN in this container)."""
    import pytest

    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this machine: cannot make a small or read-only filesystem")
    d = Path(tempfile.mkdtemp(prefix="mtrains_tmpfs_"))
    opts = f"size={size}" + (f",{options}" if options else "")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        d.rmdir()
        pytest.skip(f"mounting a tmpfs is not permitted here ({res.stderr.strip()})")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        d.rmdir()


def remount(d: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(d)], check=True,
                   capture_output=True)


_URING_REASON: Dict[str, str] = {}


def uring_unavailable_reason(scratch_dir: "str | os.PathLike[str]") -> str:
    """'' when the io_uring engine works here, else why not (probed once per process)."""
    if "reason" not in _URING_REASON:
        d = Path(tempfile.mkdtemp(dir=scratch_dir, prefix="uring_probe"))
        try:
            BlockStore(d / "probe.tbl", 8, 4, io_engine="uring", dram_cache_mb=0).close()
            _URING_REASON["reason"] = ""
        except OSError as e:
            _URING_REASON["reason"] = str(e)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return _URING_REASON["reason"]


def assert_rows_equal(got: torch.Tensor, want: torch.Tensor, what: str = "rows") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if not torch.equal(got, want):
        bad = (got != want).any(dim=1).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what} differ at positions {bad}: got {got[bad]} want {want[bad]}")
