"""Checkpoints of the example with torch.distributed.checkpoint (DCP).

Layout of ``--checkpoint-dir``::

    step_00000100/      DCP files: model.state_dict() (tiered tables read through their
                        tiers), model.fused_optimizer.state_dict(), the dense optimizer
    step_00000100/trainer.json   step (= data position), losses so far, AUC curve, seed
    latest              name of the newest complete checkpoint (replaced atomically last)

A checkpoint is complete once ``latest`` names it; every other ``step_*`` directory is then
removed (the previous checkpoint, and what a save killed half-way left behind). Before a
save, the tiered tables are flushed to their tiers (so the table files are consistent and
durable at each checkpoint); a save that fails (a full disk) removes its partial directory
and raises an OSError naming it, leaving ``latest`` as it was.

Fault points (``torchrec_mtrains.testing.faults``, for crash tests): ``checkpoint.write``
(this rank's DCP data files written, no ``.metadata`` yet), ``checkpoint.saved`` (DCP save
complete, no ``trainer.json``), ``checkpoint.latest`` (``trainer.json`` written, ``latest``
not yet switched), ``checkpoint.cleanup`` (switched, older checkpoints not yet removed).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Any, Dict, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from torchrec_mtrains.testing.faults import fault_point

__all__ = ["flush_tiers", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

_PREFIX = "step_"
_FULL_BYTES = 1 << 20  # a failed save with less free space than this is reported as ENOSPC


class _Writer(dcp.FileSystemWriter):
    """DCP's file writer with a fault point once this rank's data files are written."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()
        fault_point("checkpoint.write")
        return future


def _state(model, dense_optimizer) -> Dict[str, Any]:
    return {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict(),
            "dense_optim": dense_optimizer.state_dict()}


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)  # the rename itself survives a power loss
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_tiers(model) -> None:
    """Writes every tiered table's dirty cached rows to its tier (and makes them durable)."""
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    for m in model.modules():
        if isinstance(m, ShardedTieredEmbeddingBagCollection):
            for kernel in m.tiered_kernels():
                kernel.flush()


def _remove_all_but(directory: str, keep: str) -> None:
    for entry in os.listdir(directory):
        if entry.startswith(_PREFIX) and entry != keep:
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def save_checkpoint(directory: str, step: int, model, dense_optimizer, trainer: Dict[str, Any]) -> str:
    """Saves on every rank (collective); rank 0 writes trainer.json and ``latest``.

    Raises:
        OSError: the checkpoint could not be written (e.g. ENOSPC); its partial directory is
            removed and ``latest`` still names the previous checkpoint.
    """
    name = f"{_PREFIX}{step:08d}"
    path = os.path.join(directory, name)
    previous = latest_checkpoint(directory)
    if previous is not None and os.path.basename(previous) == name:
        return path  # already complete (nothing trained since it was loaded)
    if dist.get_rank() == 0 and os.path.exists(path):
        shutil.rmtree(path)  # left by a save that died before switching ``latest``
    dist.barrier()
    flush_tiers(model)
    try:
        dcp.save(_state(model, dense_optimizer), storage_writer=_Writer(path))
        dist.barrier()
        fault_point("checkpoint.saved")
        if dist.get_rank() == 0:
            _write_atomic(os.path.join(path, "trainer.json"), json.dumps({**trainer, "step": step}))
    except (CheckpointException, OSError) as e:
        code = _errno_of(e)
        if code == errno.EIO and shutil.disk_usage(directory).free < _FULL_BYTES:
            # DCP writes tensors through torch.save's zip writer, which reports a full disk
            # as RuntimeError("unexpected pos ..."): name the cause from the free space.
            code = errno.ENOSPC
        if dist.get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
        raise OSError(code, f"checkpoint {path} could not be written ({os.strerror(code)}): {_first_line(e)}; "
                            f"the latest complete checkpoint is still {previous}") from e
    if dist.get_rank() == 0:
        fault_point("checkpoint.latest")
        _write_atomic(os.path.join(directory, "latest"), name)
        fault_point("checkpoint.cleanup")
        _remove_all_but(directory, name)
    dist.barrier()
    return path


def _errno_of(e: BaseException) -> int:
    if isinstance(e, OSError) and e.errno:
        return e.errno
    if isinstance(e, CheckpointException):
        for exc, _ in e.failures.values():
            if isinstance(exc, OSError) and exc.errno:
                return exc.errno
    return errno.EIO


def _first_line(e: BaseException) -> str:
    if isinstance(e, CheckpointException):
        return "; ".join(f"rank {r}: {type(exc).__name__}: {exc}" for r, (exc, _) in sorted(e.failures.items()))
    return f"{type(e).__name__}: {e}"


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest complete checkpoint in ``directory``, or None."""
    try:
        with open(os.path.join(directory, "latest")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return None
    path = os.path.join(directory, name)
    return path if os.path.exists(os.path.join(path, "trainer.json")) else None


def load_checkpoint(path: str, model, dense_optimizer) -> Dict[str, Any]:
    """Restores model, fused and dense optimizer state (collective); returns trainer.json."""
    state = _state(model, dense_optimizer)
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])
    model.fused_optimizer.load_state_dict(state["optim"])
    dense_optimizer.load_state_dict(state["dense_optim"])
    with open(os.path.join(path, "trainer.json")) as f:
        return json.load(f)
