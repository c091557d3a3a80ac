"""Helpers shared by the store benchmark and its baselines.

Filesystem checks, page-cache dropping, id workloads (uniform, Zipf), deterministic
row values, and process I/O / CPU counters.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = [
    "FsInfo",
    "IdWorkload",
    "ProcIo",
    "Stopwatch",
    "check_filesystem",
    "drop_page_cache",
    "make_rows",
    "make_workload",
    "read_proc_io",
    "rows_mismatch",
]

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
"""Filesystems held in RAM: benchmarking storage on them measures memory, not a device."""

DROP_CACHES = "/proc/sys/vm/drop_caches"


@dataclass(frozen=True)
class FsInfo:
    """The filesystem holding a directory.

    Attributes:
        mount_point: Mount point (longest /proc/mounts prefix of the directory).
        fs_type: Filesystem type, e.g. "ext4", "xfs", "tmpfs".
        device: Source device of the mount, e.g. "/dev/nvme0n1p1".
        free_bytes: Bytes available to unprivileged users.
        in_memory: Whether the filesystem lives in RAM (tmpfs, ...).
    """

    mount_point: str
    fs_type: str
    device: str
    free_bytes: int
    in_memory: bool


def check_filesystem(directory: Path, need_bytes: int = 0) -> FsInfo:
    """Finds the filesystem of ``directory`` and warns when it cannot give device figures.

    Args:
        directory: An existing directory.
        need_bytes: Bytes the benchmark will write there; a warning is issued when fewer
            are free.

    Returns:
        The filesystem's description.
    """
    real = os.path.realpath(directory)
    best = ("/", "unknown", "unknown")
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            dev, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, fstype, dev)
    st = os.statvfs(real)
    info = FsInfo(best[0], best[1], best[2], st.f_bavail * st.f_frsize, best[1] in MEMORY_FILESYSTEMS)
    if info.in_memory:
        warnings.warn(
            f"benchmark directory {real} is on {info.fs_type} (in RAM): device figures are "
            "meaningless and direct I/O may fail; pass --dir on an SSD filesystem",
            stacklevel=2,
        )
    if need_bytes and info.free_bytes < need_bytes:
        warnings.warn(
            f"benchmark directory {real} has {info.free_bytes / 2**30:.1f} GiB free, the run "
            f"needs about {need_bytes / 2**30:.1f} GiB",
            stacklevel=2,
        )
    return info


def drop_page_cache(files: Iterable[Path] = ()) -> str:
    """Evicts file data from the OS page cache before a cold phase.

    Tries ``sync; echo 1 > /proc/sys/vm/drop_caches`` (needs root); when that is not
    writable, calls ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each of ``files`` after
    an fdatasync (dirty pages cannot be dropped).

    Args:
        files: Files (or directories, walked one level deep) to evict in the fallback.

    Returns:
        The method used: "drop_caches", "fadvise" or "none" (neither was possible).
    """
    os.sync()
    try:
        with open(DROP_CACHES, "w", encoding="ascii") as f:
            f.write("1\n")
        return "drop_caches"
    except OSError:
        pass
    paths: list[Path] = []
    for p in files:
        p = Path(p)
        if p.is_dir():
            paths.extend(c for c in p.iterdir() if c.is_file())
        elif p.is_file():
            paths.append(p)
    if not paths or not hasattr(os, "posix_fadvise"):
        return "none"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


@dataclass(frozen=True)
class IdWorkload:
    """Row ids of every phase, shared by all systems so they do identical work.

    Attributes:
        uniform: int64 [batches, batch]: distinct uniform random ids per batch.
        zipf: int64 [zipf_batches, batch]: Zipf(alpha) ranks mapped through a random
            permutation of the ids (hot rows are spread over the table); repeats occur.
        write_each: int64 [write_batches, batch]: distinct uniform ids per batch.
        write_end: int64 [write_batches, batch]: distinct uniform ids per batch.
    """

    uniform: np.ndarray
    zipf: np.ndarray
    write_each: np.ndarray
    write_end: np.ndarray


def _distinct_batches(rng: np.random.Generator, rows: int, batch: int, n: int) -> np.ndarray:
    out = np.empty((n, batch), dtype=np.int64)
    for i in range(n):
        out[i] = rng.choice(rows, size=batch, replace=False)
    return out


def zipf_ids(rng: np.random.Generator, rows: int, count: int, alpha: float,
             order: Optional[np.ndarray] = None) -> np.ndarray:
    """Draws ids with P(rank k) proportional to k^-alpha over ``rows`` shuffled ids.

    Args:
        rng: Random generator.
        rows: Number of distinct ids (the finite support; numpy's zipf is unbounded).
        count: Ids to draw.
        alpha: Zipf exponent (> 0).
        order: int64 [rows], the id of each rank (most popular first); default a random
            permutation drawn from ``rng`` after the draws. Pass it to know which ids
            are hot (e.g. for the best static cache).

    Returns:
        int64 [count] ids in [0, rows).
    """
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(count), side="right")
    np.minimum(ranks, rows - 1, out=ranks)
    if order is None:
        order = rng.permutation(rows).astype(np.int64)
    elif order.shape != (rows,):
        raise ValueError(f"order must have shape ({rows},), got {order.shape}")
    return order[ranks]


def make_workload(
    rows: int, batch: int, batches: int, zipf_batches: int, write_batches: int,
    alpha: float, seed: int,
) -> IdWorkload:
    """Generates the ids of every phase (see :class:`IdWorkload`)."""
    rng = np.random.default_rng(seed)
    return IdWorkload(
        uniform=_distinct_batches(rng, rows, batch, batches),
        zipf=zipf_ids(rng, rows, zipf_batches * batch, alpha).reshape(zipf_batches, batch),
        write_each=_distinct_batches(rng, rows, batch, write_batches),
        write_end=_distinct_batches(rng, rows, batch, write_batches),
    )


def make_rows(ids: np.ndarray, width: int, version: int, seed: int) -> np.ndarray:
    """Row values that identify themselves: column 0 is the row id, the last the version.

    The other columns are uniform in [-0.01, 0.01). Ids up to 2**24 are exact in float32.

    Args:
        ids: int64 [n] row ids.
        width: Values per row (dim + state_dim), >= 2.
        version: 0 for the load, k for the k-th write batch.
        seed: Seed of the filler values.

    Returns:
        float32 [n, width].
    """
    rng = np.random.default_rng((seed, version, int(ids[0]) if len(ids) else 0))
    rows = rng.random((len(ids), width), dtype=np.float32)
    rows *= 0.02
    rows -= 0.01
    rows[:, 0] = ids
    rows[:, -1] = version
    return rows


def rows_mismatch(rows: np.ndarray, ids: np.ndarray) -> int:
    """Counts rows whose id column (column 0) is not the id they were read for."""
    return int(np.count_nonzero(rows[:, 0] != ids.astype(np.float32)))


@dataclass(frozen=True)
class ProcIo:
    """Block-layer bytes of this process (``/proc/self/io``, all threads).

    Attributes:
        read_bytes: Bytes this process caused to be read from storage.
        write_bytes: Bytes this process caused to be written to storage (for buffered
            I/O: counted when pages are dirtied, page granular).
    """

    read_bytes: int
    write_bytes: int

    def __sub__(self, other: "ProcIo") -> "ProcIo":
        return ProcIo(self.read_bytes - other.read_bytes, self.write_bytes - other.write_bytes)


def read_proc_io() -> Optional[ProcIo]:
    """Reads ``/proc/self/io``; None where the kernel does not provide it."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            kv = dict(line.split(":", 1) for line in f if ":" in line)
        return ProcIo(int(kv["read_bytes"]), int(kv["write_bytes"]))
    except (OSError, KeyError, ValueError):
        return None


class Stopwatch:
    """Wall-clock and process-CPU time of a code block (``with Stopwatch() as sw:``).

    Attributes:
        seconds: Wall-clock seconds (time.perf_counter).
        cpu_s: CPU seconds of the whole process, all threads (time.process_time).
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_s = 0.0
        self._t0 = 0.0
        self._c0 = 0.0

    def __enter__(self) -> "Stopwatch":
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu_s = time.process_time() - self._c0
