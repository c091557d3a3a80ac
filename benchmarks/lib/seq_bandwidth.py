"""Sequential write and read bandwidth of the filesystem under a directory, in 1 MiB blocks.

With fio (``torchrec_mtrains.planner.hardware.fio``: io_uring, O_DIRECT, one job, QD 8, time
limited after a 1 s ramp) when it is installed; otherwise a Python loop over one file:
O_DIRECT writes from an aligned buffer then an fsync, and O_DIRECT reads, or -- where the
filesystem refuses O_DIRECT (tmpfs) -- buffered writes + fsync and reads after the file's
pages were evicted with ``posix_fadvise(DONTNEED)``. ``SeqBandwidth.method`` says which ran.
"""

from __future__ import annotations

import dataclasses
import errno
import mmap
import os
import time
from pathlib import Path
from typing import Callable, Dict, Tuple

from benchmarks.lib.types import MIB

__all__ = ["METHODS", "SeqBandwidth", "measure"]

FIO_QUEUE_DEPTH = 8  # the depth of the benchmarks' other 1 MiB sequential fio jobs


@dataclasses.dataclass(frozen=True)
class SeqBandwidth:
    """Sequential bandwidth of one filesystem.

    Attributes:
        write_bytes_per_s: 1 MiB sequential writes, bytes per second (durable: direct I/O or
            counted through the fsync).
        read_bytes_per_s: 1 MiB sequential reads, bytes per second (from the device).
        method: how it was measured, in words.
        file_bytes: size of the test file.
    """

    write_bytes_per_s: float
    read_bytes_per_s: float
    method: str
    file_bytes: int

    @property
    def min_bytes_per_s(self) -> float:
        return min(self.write_bytes_per_s, self.read_bytes_per_s)

    def as_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


def _fio(directory: Path, size_mb: int, seconds: float) -> SeqBandwidth:
    from torchrec_mtrains.planner.hardware.fio import FioJob, run_fio

    jobs = [FioJob("seq_write_1m", "write", MIB, FIO_QUEUE_DEPTH), FioJob("seq_read_1m", "read", MIB, FIO_QUEUE_DEPTH)]
    res = run_fio(directory, jobs, size_mb=size_mb, runtime_s=seconds)
    return SeqBandwidth(res["seq_write_1m"].bytes_per_s, res["seq_read_1m"].bytes_per_s,
                        f"fio (io_uring, O_DIRECT, 1 MiB blocks, QD {FIO_QUEUE_DEPTH}, {seconds:g} s per job)",
                        size_mb * MIB)


def _open_direct(path: Path, flags: int) -> Tuple[int, bool]:
    """(fd, direct): O_DIRECT where the filesystem takes it, else a buffered descriptor."""
    try:
        return os.open(path, flags | getattr(os, "O_DIRECT", 0)), hasattr(os, "O_DIRECT")
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        return os.open(path, flags), False


def _python(directory: Path, size_mb: int, seconds: float) -> SeqBandwidth:
    """One pass of ``size_mb`` MiB written then read (``seconds`` is fio's; unused here)."""
    del seconds
    path = directory / "seq_bandwidth.dat"
    block = mmap.mmap(-1, MIB)  # page aligned, as O_DIRECT needs
    block.write(os.urandom(MIB))
    try:
        fd, direct_write = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            t0 = time.perf_counter()
            for _ in range(size_mb):
                os.write(fd, block)
            os.fsync(fd)
            write_s = time.perf_counter() - t0
        finally:
            os.close(fd)
        if not direct_write:  # the pages just written must come from the device when read
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        fd, direct_read = _open_direct(path, os.O_RDONLY)
        try:
            t0 = time.perf_counter()
            while os.readv(fd, [block]) == MIB:
                pass
            read_s = time.perf_counter() - t0
        finally:
            os.close(fd)
    finally:
        block.close()
        path.unlink(missing_ok=True)
    how = "O_DIRECT" if direct_write and direct_read else "buffered + fsync, reads after fadvise(DONTNEED)"
    return SeqBandwidth(size_mb * MIB / write_s, size_mb * MIB / read_s,
                        f"python loop ({how}, 1 MiB blocks, QD 1, one pass)", size_mb * MIB)


METHODS: Dict[str, Callable[[Path, int, float], SeqBandwidth]] = {"fio": _fio, "python": _python}
"""How bandwidth can be measured, by name (``auto``: fio, else python)."""


def measure(directory: Path, method: str = "auto", size_mb: int = 1024, seconds: float = 5.0) -> SeqBandwidth:
    """Measures sequential write then read bandwidth on ``directory``'s filesystem.

    Args:
        directory: an existing directory on the filesystem under test (a test file of
            ``size_mb`` MiB is written there and removed).
        method: "fio", "python", or "auto" (fio if it runs here, else python).
        size_mb: test file size in MiB.
        seconds: seconds per fio job (the Python loop makes one pass of the file).

    Raises:
        ValueError: an unknown method or a size below 1 MiB.
        FioUnavailable: ``method="fio"`` and fio cannot run here.
    """
    from torchrec_mtrains.planner.hardware.fio import FioUnavailable

    if method not in (*METHODS, "auto"):
        raise ValueError(f"method={method!r} must be one of {sorted(METHODS)} or 'auto'")
    if size_mb < 1:
        raise ValueError(f"size_mb={size_mb!r} must be >= 1")
    if method != "auto":
        return METHODS[method](directory, size_mb, seconds)
    try:
        return _fio(directory, size_mb, seconds)
    except FioUnavailable as e:
        result = _python(directory, size_mb, seconds)
        return dataclasses.replace(result, method=f"{result.method}; fio unavailable: {e}")
