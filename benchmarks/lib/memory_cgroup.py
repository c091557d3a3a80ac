"""MemoryCgroup: runs a job with less memory than the machine has (a cgroup v1 memory
group), as on a node with that much RAM.

The group's limit caps what its processes hold in RAM together: their anonymous memory and
the page cache their file I/O brings in (the kernel reclaims the group's cache before it
goes past the limit, and kills a process of the group when nothing is left to reclaim).
A process started with ``preexec_fn=group.enter`` runs in the group, and so do its children.

    with MemoryCgroup(8 << 30) as group:
        subprocess.run(cmd, preexec_fn=group.enter)
        print(group.usage())

Raises MemoryCgroupUnavailable, naming the path and the reason, where the controller is
missing or not writable (cgroup v2 only, a container without the mount, no privileges).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["CGROUP_V1_MEMORY", "MemoryCgroup", "MemoryCgroupUnavailable"]

CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
_STAT_KEYS = ("total_rss", "total_cache", "total_mapped_file", "total_swap")


class MemoryCgroupUnavailable(RuntimeError):
    """The memory cgroup cannot be created or limited here."""


class MemoryCgroup:
    """A memory cgroup of ``limit_bytes`` under ``root`` (cgroup v1's memory controller),
    removed by ``close``. Swap is capped with it where the kernel accounts swap, so the
    limit is not escaped by swapping."""

    def __init__(self, limit_bytes: int, root: Path = CGROUP_V1_MEMORY, name: Optional[str] = None) -> None:
        if limit_bytes < 1 << 20:
            raise ValueError(f"memory limit {limit_bytes} B is below 1 MiB")
        self.limit_bytes = int(limit_bytes)
        self.path = Path(root) / (name or f"mtrains-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        if not (Path(root) / "memory.limit_in_bytes").exists():
            raise MemoryCgroupUnavailable(f"no cgroup v1 memory controller at {root} (memory.limit_in_bytes missing)")
        try:
            self.path.mkdir()
        except OSError as e:
            raise MemoryCgroupUnavailable(f"cannot create the memory cgroup {self.path}: {e.strerror}") from None
        try:
            self._write("memory.limit_in_bytes", self.limit_bytes)
            if (self.path / "memory.memsw.limit_in_bytes").exists():
                self._write("memory.memsw.limit_in_bytes", self.limit_bytes)
        except OSError as e:
            self.close()
            raise MemoryCgroupUnavailable(f"cannot limit the memory cgroup {self.path}: {e.strerror}") from None
        got = int(self._read("memory.limit_in_bytes"))
        if got > self.limit_bytes:  # the kernel rounds down to pages; never up
            self.close()
            raise MemoryCgroupUnavailable(f"{self.path}: limit {self.limit_bytes} B was set as {got} B")

    def enter(self) -> None:
        """Moves the calling process into the group (its later children follow): pass as
        ``preexec_fn`` so that a child runs in it from its first instruction."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write("0")

    def usage(self) -> Dict[str, int]:
        """Bytes of the group now and at its peak, how often the limit was hit
        (``memory.failcnt``: some kernels count only failed charges, 0 here even at an OOM
        kill), and how many of its processes the kernel killed for memory (0 where the
        kernel does not say)."""
        stat = dict(line.split() for line in self._read("memory.stat").splitlines())
        oom = dict(line.split() for line in self._read("memory.oom_control").splitlines())
        return {"limit_bytes": int(self._read("memory.limit_in_bytes")),
                "usage_bytes": int(self._read("memory.usage_in_bytes")),
                "peak_bytes": int(self._read("memory.max_usage_in_bytes")),
                "limit_hits": int(self._read("memory.failcnt")),
                "oom_kills": int(oom.get("oom_kill", 0)),
                **{f"{k[len('total_'):]}_bytes": int(stat.get(k, 0)) for k in _STAT_KEYS}}

    def processes(self) -> List[int]:
        """The pids in the group."""
        return [int(p) for p in self._read("cgroup.procs").split()]

    def kill_all(self, timeout_s: float = 30.0) -> None:
        """SIGKILLs what is left of a job in the group (a rank whose peer the kernel killed
        for memory may outlive the launcher) and waits until the group is empty."""
        deadline = time.monotonic() + timeout_s
        while (left := self.processes()):
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {left} of the memory cgroup {self.path} outlived SIGKILL "
                                   f"for {timeout_s:.0f} s")
            time.sleep(0.05)

    def close(self) -> None:
        """Kills what is left in the group, then removes it. Idempotent."""
        if self.path.exists():
            self.kill_all()
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            left = self._read("cgroup.procs").split() if self.path.exists() else []
            raise RuntimeError(f"cannot remove the memory cgroup {self.path}: {e.strerror} "
                               f"(processes still in it: {', '.join(left) or 'none'})") from None

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def _write(self, name: str, value: int) -> None:
        with open(self.path / name, "w") as f:
            f.write(str(value))
