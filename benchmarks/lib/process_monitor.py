"""Samples a process tree's memory and a directory's disk use over time, with the block
device's I/O counters, on a thread of its own (for benchmarks that run training jobs)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

__all__ = ["DiskCounters", "ProcessTreeMonitor", "Sample", "device_counters", "directory_bytes", "process_memory",
           "run_monitored", "tree_pids"]


@dataclasses.dataclass(frozen=True)
class DiskCounters:
    """/proc/diskstats of one block device: completed I/Os and bytes."""

    reads: int = 0
    read_bytes: int = 0
    writes: int = 0
    write_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sample: seconds since start; RSS summed over the tree and of its largest
    process; the directory's allocated bytes; the device's counters."""

    t: float
    rss: int
    rss_anon: int
    rss_file: int
    rss_max_process: int
    processes: int
    disk_bytes: int
    disk: DiskCounters


def tree_pids(root: int) -> List[int]:
    """``root`` and its descendants (through /proc/<pid>/task/<tid>/children)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue  # gone
    return out


def process_memory(pid: int) -> Tuple[int, int, int]:
    """(VmRSS, RssAnon, RssFile) bytes of ``pid``; zeros if it is gone."""
    values = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in values:
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values["VmRSS"], values["RssAnon"], values["RssFile"]


def directory_bytes(path: str) -> int:
    """Bytes allocated to the files under ``path`` (st_blocks: sparse files count what they
    hold; a file linked under several names, as checkpoints link block-store files, once)."""
    total = 0
    seen = set()
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue  # removed meanwhile
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def _device_name(path: str) -> Optional[str]:
    """The /proc/diskstats name of the whole device holding ``path``."""
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    try:
        real = os.path.realpath(f"/sys/dev/block/{major}:{minor}")
    except OSError:
        return None
    if os.path.exists(os.path.join(real, "partition")):
        real = os.path.dirname(real)  # a partition: count its disk
    return os.path.basename(real)


def device_counters(name: Optional[str]) -> DiskCounters:
    """The device's counters (zeros when unknown). Sectors are 512 bytes in diskstats."""
    if name is None:
        return DiskCounters()
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 9 and fields[2] == name:
                return DiskCounters(int(fields[3]), int(fields[5]) * 512, int(fields[7]), int(fields[9]) * 512)
    return DiskCounters()


class ProcessTreeMonitor:
    """Samples every ``interval`` seconds until ``stop()``: use as a context manager.

    Args:
        root_pid: the launcher; its descendants are found anew at each sample.
        directory: the directory whose disk use is sampled (and whose device's counters).
        interval: seconds between samples.
    """

    def __init__(self, root_pid: int, directory: str, interval: float = 2.0) -> None:
        self.root_pid, self.directory, self.interval = root_pid, directory, interval
        self.samples: List[Sample] = []
        self._device = _device_name(directory)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._t0 = time.monotonic()

    def __enter__(self) -> "ProcessTreeMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> Sample:
        pids = tree_pids(self.root_pid)
        mem = [process_memory(p) for p in pids]
        return Sample(
            t=time.monotonic() - self._t0,
            rss=sum(m[0] for m in mem), rss_anon=sum(m[1] for m in mem), rss_file=sum(m[2] for m in mem),
            rss_max_process=max((m[0] for m in mem), default=0), processes=len(pids),
            disk_bytes=directory_bytes(self.directory), disk=device_counters(self._device),
        )

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.interval):
                break

    def peaks(self) -> Dict[str, int]:
        """Largest RSS (tree, anonymous, one process) and disk use seen."""
        s = self.samples
        return {"rss": max((x.rss for x in s), default=0), "rss_anon": max((x.rss_anon for x in s), default=0),
                "rss_max_process": max((x.rss_max_process for x in s), default=0),
                "disk_bytes": max((x.disk_bytes for x in s), default=0)}


def run_monitored(cmd: List[str], log_path: Path, directory: str, interval: float, timeout_s: float,
                  who: str, **popen: object) -> ProcessTreeMonitor:
    """Runs ``cmd`` (in a session of its own, output to ``log_path``) while sampling its
    process tree and ``directory``; returns the finished monitor.

    Raises:
        SystemExit: the run failed (its log's tail in the message) or ran past
            ``timeout_s`` (its whole process group killed); ``who`` names the run.
    """
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **popen)
        try:
            with ProcessTreeMonitor(proc.pid, directory, interval) as monitor:
                code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SystemExit(f"{who} ran past {timeout_s:.0f} s: killed") from None
    if code != 0:
        raise SystemExit(f"{who} failed (exit {code}):\n{log_path.read_text()[-3000:]}")
    return monitor

