"""The dense state of a checkpoint step -- the model's and the optimizers' state_dicts as DCP
saves them, tiered rows left out -- and loading it back, or loading a plain DCP checkpoint."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch.distributed.checkpoint as dcp
from torch import nn

from torchrec_mtrains.checkpoint.kind_change import ChangedTables, pop_changed
from torchrec_mtrains.checkpoint.tiered_parts import clear_dirty

__all__ = ["load_dense", "load_plain", "load_state_dicts", "state_of"]


def state_of(model: nn.Module, dense_optimizer: Any) -> Dict[str, Any]:
    """The state DCP saves and loads: the model's, its fused optimizer's, the dense optimizer's."""
    state: Dict[str, Any] = {"model": model.state_dict()}
    fused = getattr(model, "fused_optimizer", None)
    if fused is not None:
        state["optim"] = fused.state_dict()
    if dense_optimizer is not None:
        state["dense_optim"] = dense_optimizer.state_dict()
    return state


def load_dense(path: str, state: Dict[str, Any], changed: Optional[ChangedTables] = None) -> None:
    """Fills ``state`` from the step's DCP files, leaving out tables that changed kind."""
    taken = pop_changed(state, changed) if changed else []
    # When this rank lacks keys the checkpoint has (another rank's table), DCP's load falls
    # back to its pre-2.4 key format, in which a subtree without tensors (the optimizer
    # state of a tiered table, kept out: {}) is a key of its own that no checkpoint holds.
    emptied = _pop_empty(state)
    dcp.load(state, checkpoint_id=path)
    for parent, key, value in reversed(taken + emptied):
        parent[key] = value


def load_state_dicts(state: Dict[str, Any], model: nn.Module, dense_optimizer: Any) -> None:
    """Loads a filled ``state_of`` into the model and the optimizers."""
    model.load_state_dict(state["model"])
    if "optim" in state:
        model.fused_optimizer.load_state_dict(state["optim"])
    if dense_optimizer is not None:
        dense_optimizer.load_state_dict(state["dense_optim"])


def _pop_empty(tree: Dict[str, Any]) -> List[Tuple[Dict[str, Any], str, Any]]:
    """Removes the dicts of ``tree`` that hold no value at any depth; returns (parent, key,
    dict) of each, in removal order (put back in reverse order to restore ``tree``)."""
    removed: List[Tuple[Dict[str, Any], str, Any]] = []
    for key, value in list(tree.items()):
        if isinstance(value, dict):
            removed += _pop_empty(value)
            if not value:
                removed.append((tree, key, tree.pop(key)))
    return removed


def load_plain(path: str, model: nn.Module, dense_optimizer: Any) -> None:
    """Loads a plain DCP checkpoint (an export): TorchRec's own load, every row in it."""
    state = state_of(model, dense_optimizer)
    load_dense(path, state)
    load_state_dicts(state, model, dense_optimizer)
    clear_dirty(model)
