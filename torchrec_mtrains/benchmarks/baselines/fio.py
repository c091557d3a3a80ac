"""The device's limits measured with fio on the filesystem under test.

Jobs (ioengine=io_uring, direct=1, one job, time limited):

- ``randread_4k_qd{Q}``: 4 KiB random reads at queue depth Q (32, and the store's
  queue depth if different). One row per 4 KiB block touched, so these IOPS bound
  cold random row reads.
- ``randwrite_4k_qd{Q}``: 4 KiB random writes (the limit of in-place row updates).
- ``write_1m_seq``: 1 MiB sequential writes (the limit of log-structured write-back),
  reported as 4 KiB-block equivalents in ``rows`` plus MB/s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from torchrec_mtrains.benchmarks.types import BaselineUnavailable, MIB, PhaseResult

__all__ = ["FioJob", "default_jobs", "run_fio"]


@dataclass(frozen=True)
class FioJob:
    """One fio job.

    Attributes:
        name: Phase name of the result.
        rw: fio ``rw``: "randread", "randwrite", "write".
        block_size: Bytes per I/O.
        iodepth: I/Os in flight.
    """

    name: str
    rw: str
    block_size: int
    iodepth: int


def default_jobs(queue_depth: int) -> list[FioJob]:
    """The jobs the store benchmark runs: reads at QD 32 (+ the store's), writes."""
    jobs = [FioJob("randread_4k_qd32", "randread", 4096, 32)]
    if queue_depth != 32:
        jobs.append(FioJob(f"randread_4k_qd{queue_depth}", "randread", 4096, queue_depth))
    jobs.append(FioJob(f"randwrite_4k_qd{queue_depth}", "randwrite", 4096, queue_depth))
    jobs.append(FioJob("write_1m_seq", "write", MIB, 8))
    return jobs


def _fio_binary() -> str:
    path = shutil.which("fio")
    if path is None:
        raise BaselineUnavailable("fio is not installed (apt-get install fio)")
    return path


def run_job(fio: str, job: FioJob, file: Path, size_mb: int, runtime_s: float) -> PhaseResult:
    """Runs one fio job and parses its JSON output.

    Args:
        fio: Path of the fio binary.
        job: The job.
        file: Test file (laid out by fio on first use).
        size_mb: File size in MiB.
        runtime_s: Seconds of measurement (after a 1 s ramp).

    Returns:
        The result: ``rows`` = I/Os completed, ``extra`` with iops, MB/s and
        completion-latency percentiles in microseconds.
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
        raise BaselineUnavailable(f"fio job {job.name} failed ({proc.returncode}): {proc.stderr.strip()}")
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    stats = out["jobs"][0]["read" if "read" in job.rw else "write"]
    runtime_ms = stats["runtime"] or 1
    pct = stats.get("clat_ns", {}).get("percentile", {})
    ios = int(stats["total_ios"])
    blocks_4k = ios * job.block_size // 4096
    return PhaseResult(
        system="fio",
        phase=job.name,
        rows=blocks_4k,
        seconds=runtime_ms / 1e3,
        cpu_s=None,
        extra={
            "iops": float(stats["iops"]),
            "MBps": float(stats["bw_bytes"]) / 1e6,
            "block_bytes": job.block_size,
            "iodepth": job.iodepth,
            "clat_p50_us": pct.get("50.000000", 0) / 1e3,
            "clat_p99_us": pct.get("99.000000", 0) / 1e3,
            "usr_cpu_pct": float(out["jobs"][0].get("usr_cpu", 0.0)),
            "sys_cpu_pct": float(out["jobs"][0].get("sys_cpu", 0.0)),
        },
    )


def run_fio(directory: Path, jobs: list[FioJob], size_mb: int, runtime_s: float,
            keep: bool = False) -> dict[str, PhaseResult]:
    """Runs ``jobs`` on one test file in ``directory``.

    Args:
        directory: Directory on the filesystem under test.
        jobs: Jobs to run, in order.
        size_mb: Test file size in MiB.
        runtime_s: Seconds per job.
        keep: Keep the test file.

    Returns:
        Job name -> result (``rows`` counts 4 KiB blocks, so ``rows_per_s`` is 4 KiB IOPS).

    Raises:
        BaselineUnavailable: fio is missing or failed (e.g. no io_uring, no O_DIRECT).
    """
    fio = _fio_binary()
    file = directory / "fio.dat"
    try:
        return {job.name: run_job(fio, job, file, size_mb, runtime_s) for job in jobs}
    finally:
        if not keep:
            file.unlink(missing_ok=True)
