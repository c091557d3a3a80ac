"""Running examples/dlrm/train.py as a subprocess for the crash, restart and full-disk tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import torch

from tests.support.paths import EXAMPLE_DLRM, REPO_ROOT
from tests.support.planner_nodes import PINNED_PROFILE
from tests.support.ports import OS_PICKED_PORT

TRAIN = str(EXAMPLE_DLRM / "train.py")

# A run of a few seconds: tables at 5% of their rows (100K rows down to 1K), an 8 MiB DRAM
# budget so the planner puts one table on SCM and two on SSD, a checkpoint every 4 steps.
STEPS = 20
EVERY = 4
SMALL = ["--steps", str(STEPS), "--batch-size", "64", "--table-scale", "0.05", "--dram-budget", "8MiB",
         "--checkpoint-every", str(EVERY), "--eval-batches", "1", "--log-every", "5",
         "--hardware", PINNED_PROFILE, "--input-time-per-sample", "0s"]  # placements that do not move


def env(fault: Optional[str] = None, **extra: str) -> Dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("MTRAINS_FAULT", "TORCHELASTIC"))}
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e["MASTER_PORT"] = OS_PICKED_PORT  # train.py of one process: its rank 0 binds the port
    e["OMP_NUM_THREADS"] = "1"
    if fault:
        e["MTRAINS_FAULT"] = fault
    e.update(extra)
    return e


def train_cmd(storage: str, ckpt: str, out: str, *more: str) -> List[str]:
    return [sys.executable, TRAIN, *SMALL, "--storage-dir", storage, "--checkpoint-dir", ckpt, "--out", out, *more]


def torchrun_cmd(storage: str, ckpt: str, out: str, *more: str, max_restarts: int = 2) -> List[str]:
    """``train_cmd`` under a 2-rank ``torchrun --standalone`` that may restart the job."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.5", *train_cmd(storage, ckpt, out, *more)[1:]]


def torchrun_env(**extra: str) -> Dict[str, str]:
    """``env`` for ``torchrun_cmd``: no MASTER_PORT (torchrun --standalone picks the port)."""
    e = env(**extra)
    e.pop("MASTER_PORT")
    return e


def run(cmd: List[str], environ: Dict[str, str], timeout: float = 120,
        cwd: str = str(REPO_ROOT)) -> subprocess.CompletedProcess:
    """Runs ``cmd`` (in ``cwd``, default the repository) in a session of its own; on timeout
    kills the whole group (torchrun's workers too, which would outlive it) and raises
    TimeoutExpired."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def fault_trace(path: str) -> List[Tuple[str, ...]]:
    """The lines MTRAINS_FAULT_TRACE wrote: (phase, count[, signal]); none before the file exists."""
    try:
        with open(path) as f:
            return [tuple(line.split()) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def metrics(out: str) -> dict:
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f)


def checkpoint_tensors(path: str, tmp: str) -> Dict[str, torch.Tensor]:
    """A DCP checkpoint as flat {key: tensor} (read without a process group)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dst = os.path.join(tmp, os.path.basename(path) + f".{os.getpid()}.{len(os.listdir(tmp))}.pt")
    dcp_to_torch_save(path, dst)
    flat: Dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix] = obj
        else:
            flat[prefix] = torch.tensor(obj) if isinstance(obj, (int, float)) else obj

    walk("", torch.load(dst, weights_only=False))
    return flat


def assert_same_tensors(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), f"{k} differs: max |diff| {(a[k].double() - b[k].double()).abs().max()}"
        else:
            assert a[k] == b[k], k
