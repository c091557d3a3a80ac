"""The dense state of a checkpoint step -- the model's and the optimizers' state_dicts as DCP
saves them, tiered rows left out -- and loading it back, or loading a plain DCP checkpoint."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import torch.distributed.checkpoint as dcp
from torch import nn

from torchrec_mtrains.checkpoint.kind_change import ChangedTables, Table, pop_tables, table_state
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


def load_dense(path: str, state: Dict[str, Any], changed: Optional[ChangedTables] = None,
               earlier: Optional[Dict[str, Set[Table]]] = None) -> None:
    """Fills ``state`` from the step's DCP files, leaving out tables that changed kind;
    ``earlier``: {step directory: FUSED tables} whose weights and optimizer state load from
    that earlier step of the chain instead (the full step, for tables whose deltas hold
    only their changed rows). Collective: the same steps and tables on every rank."""
    earlier = earlier or {}
    moved: Set[Table] = set().union(*earlier.values()) if earlier else set()
    parts = {source: table_state(state, tables) for source, tables in earlier.items()}
    taken = pop_tables(state, (changed.to_fused | changed.to_tiered if changed else set()) | moved)
    _load(state, path)
    for source in sorted(parts):
        _load(parts[source], source)
    for parent, key, value in reversed(taken):
        parent[key] = value


def _load(state: Dict[str, Any], path: str) -> None:
    # When this rank lacks keys the checkpoint has (another rank's table), DCP's load falls
    # back to its pre-2.4 key format, in which a subtree without tensors (the optimizer
    # state of a tiered table, kept out: {}) is a key of its own that no checkpoint holds.
    emptied = _pop_empty(state)
    dcp.load(state, checkpoint_id=path)
    for parent, key, value in reversed(emptied):
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
