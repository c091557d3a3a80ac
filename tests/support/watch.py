"""Running a child process with a hang guard that a slow machine does not trip.

A total timeout races the clock: on a loaded machine a healthy child can run past it. A
child that reports its progress (a line per operation, on stdout or stderr) is hung only
when it stops reporting, so the guard here is a stall: no new line for ``stall_s``.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Dict, List, Optional, Sequence

__all__ = ["run_watched"]


def run_watched(cmd: Sequence[str], stall_s: float, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs ``cmd`` to completion, capturing its output as text.

    Args:
        cmd: the command; it should print a line at least every few seconds of work.
        stall_s: seconds without a new line of output after which the child is hung.
        env: its environment (default: this process's).

    Raises:
        subprocess.TimeoutExpired: the child printed nothing for ``stall_s`` seconds; it was
            killed, and ``output`` / ``stderr`` hold what it had printed.
    """
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: List[str] = []
    err: List[str] = []
    last_line = [time.monotonic()]

    def pump(stream, sink: List[str]) -> None:
        for line in stream:
            sink.append(line)
            last_line[0] = time.monotonic()

    pumps = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
             threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
    for t in pumps:
        t.start()
    stalled = False
    while proc.poll() is None:
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if time.monotonic() - last_line[0] > stall_s:
                stalled = True
                proc.kill()
                proc.wait()
    for t in pumps:
        t.join()
    if stalled:
        raise subprocess.TimeoutExpired(list(cmd), stall_s, output="".join(out), stderr="".join(err))
    return subprocess.CompletedProcess(list(cmd), proc.returncode, "".join(out), "".join(err))
