"""Checkpoints of the example with torch.distributed.checkpoint (DCP).

Layout of ``--checkpoint-dir``::

    step_00000100/      DCP files: model.state_dict() (tiered tables read through their
                        tiers), model.fused_optimizer.state_dict(), the dense optimizer
    step_00000100/trainer.json   step (= data position), losses so far, AUC curve, seed
    latest              name of the newest complete checkpoint (replaced atomically last)

A checkpoint is complete once ``latest`` names it; older ones are then removed.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]


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


def save_checkpoint(directory: str, step: int, model, dense_optimizer, trainer: Dict[str, Any]) -> str:
    """Saves on every rank (collective); rank 0 writes trainer.json and ``latest``."""
    name = f"step_{step:08d}"
    path = os.path.join(directory, name)
    dcp.save(_state(model, dense_optimizer), checkpoint_id=path)
    dist.barrier()
    if dist.get_rank() == 0:
        _write_atomic(os.path.join(path, "trainer.json"), json.dumps({**trainer, "step": step}))
        previous = latest_checkpoint(directory)
        _write_atomic(os.path.join(directory, "latest"), name)
        if previous and os.path.basename(previous) != name:
            shutil.rmtree(previous, ignore_errors=True)
    dist.barrier()
    return path


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
