"""The device's limits measured with fio on the filesystem under test, as benchmark results.

fio runs through the library's runner (``torchrec_mtrains.planner.hardware.fio``: io_uring,
direct=1, one job, time limited). Jobs of the store benchmark (``default_jobs``):

- ``randread_4k_qd{Q}``: 4 KiB random reads at queue depth Q (32, and the store's
  queue depth if different). One row per 4 KiB block touched, so these IOPS bound
  cold random row reads.
- ``randwrite_4k_qd{Q}``: 4 KiB random writes (the limit of in-place row updates).
- ``write_1m_seq``: 1 MiB sequential writes (the limit of log-structured write-back),
  reported as 4 KiB-block equivalents in ``rows`` plus MB/s.
"""

from __future__ import annotations

from pathlib import Path

from torchrec_mtrains.planner.hardware import fio as _fio
from torchrec_mtrains.planner.hardware.fio import FioJob, FioResult, FioUnavailable

from benchmarks.lib.types import MIB, BaselineUnavailable, PhaseResult

__all__ = ["FioJob", "default_jobs", "phase_result", "run_fio"]


def default_jobs(queue_depth: int) -> list[FioJob]:
    """The jobs the store benchmark runs: reads at QD 32 (+ the store's), writes."""
    jobs = [FioJob("randread_4k_qd32", "randread", 4096, 32)]
    if queue_depth != 32:
        jobs.append(FioJob(f"randread_4k_qd{queue_depth}", "randread", 4096, queue_depth))
    jobs.append(FioJob(f"randwrite_4k_qd{queue_depth}", "randwrite", 4096, queue_depth))
    jobs.append(FioJob("write_1m_seq", "write", MIB, 8))
    return jobs


def phase_result(r: FioResult) -> PhaseResult:
    """One job's result as a phase of system "fio": ``rows`` = I/Os as 4 KiB blocks,
    ``extra`` with iops, MB/s and completion-latency percentiles in microseconds."""
    return PhaseResult(
        system="fio",
        phase=r.job.name,
        rows=r.blocks_4k,
        seconds=r.seconds,
        cpu_s=None,
        extra={
            "iops": r.iops,
            "MBps": r.bytes_per_s / 1e6,
            "block_bytes": r.job.block_size,
            "iodepth": r.job.iodepth,
            "clat_p50_us": r.clat_p50_us,
            "clat_p99_us": r.clat_p99_us,
            "usr_cpu_pct": r.usr_cpu_pct,
            "sys_cpu_pct": r.sys_cpu_pct,
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
    try:
        results = _fio.run_fio(directory, jobs, size_mb, runtime_s, keep)
    except FioUnavailable as e:
        raise BaselineUnavailable(str(e)) from e
    return {name: phase_result(r) for name, r in results.items()}
