"""A storage device's limits, measured with fio on a filesystem.

Each job runs with ioengine=io_uring, direct=1, one job, time limited (after a 1 s ramp)
on one test file that fio lays out on first use. ``mtrains probe-hw`` runs 4 KiB random
reads at queue depth 32 (the IOPS that bound cold random row reads); the benchmarks run
more jobs through the same runner.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FioJob", "FioResult", "FioUnavailable", "run_fio", "run_job"]

_STAT_BLOCK_BYTES = 4096
"""``FioResult.blocks_4k`` counts I/Os in 4 KiB blocks: one random row access each."""


class FioUnavailable(RuntimeError):
    """fio cannot run here: not installed, or a job failed (no io_uring, no O_DIRECT, ...).

    The message says what is missing.
    """


@dataclass(frozen=True)
class FioJob:
    """One fio job.

    Attributes:
        name: Name of the job (the key of its result).
        rw: fio ``rw``: "randread", "randwrite", "write".
        block_size: Bytes per I/O.
        iodepth: I/Os in flight.
    """

    name: str
    rw: str
    block_size: int
    iodepth: int


@dataclass(frozen=True)
class FioResult:
    """What one fio job measured.

    Attributes:
        job: The job.
        ios: I/Os completed.
        seconds: Seconds of measurement.
        iops: I/Os per second.
        bytes_per_s: Bytes per second.
        clat_p50_us, clat_p99_us: Completion-latency percentiles in microseconds.
        usr_cpu_pct, sys_cpu_pct: fio's user and system CPU use in percent.
    """

    job: FioJob
    ios: int
    seconds: float
    iops: float
    bytes_per_s: float
    clat_p50_us: float
    clat_p99_us: float
    usr_cpu_pct: float
    sys_cpu_pct: float

    @property
    def blocks_4k(self) -> int:
        """The I/Os completed as 4 KiB blocks (1 MiB writes count 256 each)."""
        return self.ios * self.job.block_size // _STAT_BLOCK_BYTES


def _fio_binary() -> str:
    path = shutil.which("fio")
    if path is None:
        raise FioUnavailable("fio is not installed (apt-get install fio)")
    return path


def run_job(fio: str, job: FioJob, file: Path, size_mb: int, runtime_s: float) -> FioResult:
    """Runs one fio job and parses its JSON output.

    Args:
        fio: Path of the fio binary.
        job: The job.
        file: Test file (laid out by fio on first use).
        size_mb: File size in MiB.
        runtime_s: Seconds of measurement (after a 1 s ramp).

    Raises:
        FioUnavailable: fio exited with an error.
    """
    cmd = [
        fio, "--name", job.name, "--filename", str(file), "--size", f"{size_mb}m",
        "--ioengine", "io_uring", "--direct", "1", "--rw", job.rw, "--bs", str(job.block_size),
        "--iodepth", str(job.iodepth), "--numjobs", "1", "--time_based", "--runtime",
        f"{runtime_s:g}s", "--ramp_time", "1s", "--randrepeat", "0", "--norandommap",
        "--output-format", "json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise FioUnavailable(f"fio job {job.name} failed ({proc.returncode}): {proc.stderr.strip()}")
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    stats = out["jobs"][0]["read" if "read" in job.rw else "write"]
    runtime_ms = stats["runtime"] or 1
    pct = stats.get("clat_ns", {}).get("percentile", {})
    return FioResult(
        job=job,
        ios=int(stats["total_ios"]),
        seconds=runtime_ms / 1e3,
        iops=float(stats["iops"]),
        bytes_per_s=float(stats["bw_bytes"]),
        clat_p50_us=pct.get("50.000000", 0) / 1e3,
        clat_p99_us=pct.get("99.000000", 0) / 1e3,
        usr_cpu_pct=float(out["jobs"][0].get("usr_cpu", 0.0)),
        sys_cpu_pct=float(out["jobs"][0].get("sys_cpu", 0.0)),
    )


def run_fio(directory: Path, jobs: list[FioJob], size_mb: int, runtime_s: float,
            keep: bool = False) -> dict[str, FioResult]:
    """Runs ``jobs`` on one test file in ``directory``.

    Args:
        directory: Directory on the filesystem under test.
        jobs: Jobs to run, in order.
        size_mb: Test file size in MiB.
        runtime_s: Seconds per job.
        keep: Keep the test file.

    Returns:
        Job name -> result.

    Raises:
        FioUnavailable: fio is missing or failed (e.g. no io_uring, no O_DIRECT).
    """
    fio = _fio_binary()
    file = directory / "fio.dat"
    try:
        return {job.name: run_job(fio, job, file, size_mb, runtime_s) for job in jobs}
    finally:
        if not keep:
            file.unlink(missing_ok=True)
