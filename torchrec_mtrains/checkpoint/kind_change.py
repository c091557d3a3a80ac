"""Tables that changed kind between a save and a restore: tiered then, TorchRec's own FUSED
kernel now, or the reverse.

A tiered table's rows are in the chain's row chunks and its dense-state entry is an empty
placeholder; a FUSED table's rows are in the dense state, a ShardedTensor of weights and
one of optimizer state. So the dense load leaves both kinds of changed tables out, and:

- tiered then, FUSED now: the FUSED shards take their rows from the chain like a tiered
  shard would (``FusedRows`` gives their weights and state the tiers' row interface);
- FUSED then, tiered now: the tiered shards read their rows from the saved ShardedTensors
  in blocks (``StepReader.read_block``), never the whole table at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.restore import chain_specs, join_rows
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.types import ChainError, PieceSpec, Table, table_of
from torchrec_mtrains.layout import OPTIMIZERS
from torchrec_mtrains.layout import state_parts as layout_state_parts
from torchrec_mtrains.sharding.checkpoint import STATE_KEYS, STEP_KEY

__all__ = [
    "ChangedTables", "FusedRows", "changed_tables", "check_dense_optimizers", "check_fused_optimizer",
    "check_fused_targets", "dense_sources", "fused_optimizers", "fused_pieces", "pop_tables", "read_dense_rows",
    "restore_from_dense", "table_of", "table_state", "tiered_tables",
]

def weight_key(table: Table) -> str:
    return f"{table[0]}{table[2]}.{table[1]}.weight"


def state_key(table: Table) -> str:
    return f"{table[1]}.{STATE_KEYS[0]}"


@dataclasses.dataclass
class ChangedTables:
    to_fused: Set[Table]  # saved tiered, FUSED now
    to_tiered: Set[Table]  # saved FUSED (in the dense state), tiered now

    def __bool__(self) -> bool:
        return bool(self.to_fused or self.to_tiered)


def changed_tables(pieces: List[LocalPiece], tiered_now: Set[Table], chain: List[ChainStep],
                   model_state: Dict[str, Any]) -> ChangedTables:
    """Which tables changed kind (the same answer on every rank: from the plan and the chain)."""
    saved_tiered = {table_of(s) for s in chain_specs(chain, fused=False)}
    fused_now = {t for t in saved_tiered if isinstance(model_state.get(weight_key(t)), ShardedTensor)}
    return ChangedTables(fused_now - tiered_now, tiered_now - saved_tiered)


def pop_tables(state: Dict[str, Any], tables: Set[Table]) -> List[Tuple[Dict[str, Any], str, Any]]:
    """Takes the tables' entries (weights, optimizer state) out of a state (``{"model": ...,
    "optim": ...}``); returns (parent, key, value) of each, to put back."""
    removed = []
    optim_state = state.get("optim", {}).get("state", {})
    for table in sorted(tables):
        key = weight_key(table)
        if key in state["model"]:
            removed.append((state["model"], key, state["model"].pop(key)))
        if key in optim_state:
            removed.append((optim_state, key, optim_state.pop(key)))
    return removed


class FusedRows:
    """A FUSED shard's weights ``[rows, cols]`` and optimizer state (``[rows]`` row-wise,
    ``[rows, cols]`` per element, or None) with the row interface restore writes through."""

    def __init__(self, weights: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        self.weights, self.state = weights, state

    def spec(self, table: Table, offsets: List[int], size: torch.Size) -> PieceSpec:
        values = 0 if self.state is None else (1 if self.state.dim() == 1 else self.weights.shape[1])
        return PieceSpec(
            table=table[1], module=table[0], row_offset=int(offsets[0]), col_offset=int(offsets[1]),
            rows=int(self.weights.shape[0]), cols=int(self.weights.shape[1]), table_rows=int(size[0]),
            table_cols=int(size[1]), dtype=str(self.weights.dtype).replace("torch.", ""), state_values=values,
            seed=0, init_range=[0.0, 0.0], tables_attr=table[2],
        )

    def written_ids(self, t: int, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop)  # every row is in memory, none initial by construction

    def store_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        return join_rows(self.weights[ids], None if self.state is None else self.state[ids])

    def set_rows(self, t: int, ids: torch.Tensor, weights: torch.Tensor, state: Optional[torch.Tensor]) -> None:
        with torch.no_grad():
            self.weights[ids] = weights.to(self.weights.dtype)
            if self.state is not None and state is not None:
                self.state[ids] = state.reshape(self.state[ids].shape).to(self.state.dtype)

    def set_store_rows(self, t: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        cols = self.weights.shape[1]
        state = None if self.state is None else rows[:, cols:].contiguous().view(torch.float32)
        self.set_rows(t, ids, rows[:, :cols], state)


def fused_pieces(state: Dict[str, Any], tables: Set[Table]) -> List[LocalPiece]:
    """This rank's shards of ``tables``, FUSED now, as pieces over the state's tensors."""
    out = []
    optim_state = state.get("optim", {}).get("state", {})
    for table in sorted(tables):
        weights = state["model"][weight_key(table)]
        moments = optim_state.get(weight_key(table), {}).get(state_key(table))
        local_m = moments.local_shards() if isinstance(moments, ShardedTensor) else []
        for n, shard in enumerate(weights.local_shards()):
            m = local_m[n].tensor if n < len(local_m) else None
            rows = FusedRows(shard.tensor, m)
            out.append(LocalPiece(rows, 0, rows.spec(table, shard.metadata.shard_offsets, weights.size())))
    return out


def _blocks(rows: int, block_rows: int) -> Iterator[Tuple[int, int]]:
    for lo in range(0, rows, block_rows):
        yield lo, min(rows, lo + block_rows)


def dense_sources(chain: List[ChainStep], tables: Set[Table]) -> Dict[Table, int]:
    """Where each of ``tables`` (FUSED when saved) has its rows in the dense state: the index
    of the chain's last step that holds its weights there. That is the last step for a table
    saved whole at every step, the full step for one whose deltas hold only its changed rows
    (``PieceRecord.fused``, applied on top).

    Raises:
        ChainError: no step of the chain holds the table's weights.
    """
    out = {}
    for table in sorted(tables):
        key = f"model.{weight_key(table)}"
        held = [n for n, s in enumerate(chain) if _is_weight(s.reader.metadata.state_dict_metadata.get(key))]
        if not held:
            last = chain[-1]
            raise ChainError(
                f"checkpoint {last.reader.path} (step {last.step}) has no rows of table {table[0]}{table[1]}: "
                "it was neither tiered nor a FUSED table there", last.reader.path, last.step)
        out[table] = held[-1]
    return out


def _is_weight(md: Any) -> bool:
    return isinstance(md, TensorStorageMetadata) and len(md.size) == 2


def read_dense_rows(step: ChainStep, spec: PieceSpec, lo: int, hi: int,
                    state_row: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weights, fp32 optimizer state or None) of the FUSED shard ``spec``'s rows ``[lo, hi)``
    as step ``step`` saved them in its dense state (ShardedTensors, read through DCP's
    resharding reads). Each of FBGEMM's parts of ``spec``'s state (``PieceSpec.state_parts``)
    is read from its TorchRec key (``<table>.momentum1``, ``<table>.exp_avg_sq``): a row-wise
    part at row ``state_row`` of its tensor (TorchRec stacks one per column shard), a
    per-element part at the weights' place. The state is ``[n]`` for one row-wise part, else
    ``[n, state_values]`` (the parts side by side, as the tiers store them)."""
    table = table_of(spec)
    read = step.reader.read_block
    r0 = spec.row_offset + lo
    weights = read(f"model.{weight_key(table)}", [r0, spec.col_offset], (hi - lo, spec.cols), spec.torch_dtype)
    parts = []
    for name, width in zip(STATE_KEYS, spec.state_parts):
        skey = f"optim.state.{weight_key(table)}.{table[1]}.{name}"
        if width == 1:
            parts.append(read(skey, [state_row], (hi - lo,), torch.float32))
        else:
            parts.append(read(skey, [r0, spec.col_offset], (hi - lo, spec.cols), torch.float32))
    if not parts:
        return weights, None
    if len(parts) == 1:
        return weights, parts[0]
    return weights, torch.cat([p.reshape(hi - lo, -1) for p in parts], dim=1)


def fused_optimizers(state: Dict[str, Tuple[int, ...]], cols: int) -> List[str]:
    """The optimizers (FBGEMM's EmbOptimType values) whose state TorchRec's FUSED kernel
    keeps as ``state`` ({key suffix after ``<table>.``: shape}) on a table of ``cols``
    columns: its parts' keys and shapes alone tell only the kind (Adam and LAMB keep the
    same parts), so more than one may fit; none for another optimizer's keys."""
    parts = [state[k] for k in STATE_KEYS if k in state]
    if set(state) - set(STATE_KEYS) - {STEP_KEY} or [k for k in STATE_KEYS if k in state] != list(STATE_KEYS[:len(parts)]):
        return []
    kinds = tuple("row" if len(shape) == 1 else "element" for shape in parts)
    return [name for name in OPTIMIZERS
            if tuple("row" if w == 1 else "element" for w in layout_state_parts(name, cols)) == kinds]


def _describe(state: Dict[str, Tuple[int, ...]]) -> str:
    return ", ".join(f"{k} {list(shape)}" for k, shape in sorted(state.items())) or "no optimizer state"


def check_fused_optimizer(table: Table, saved: str, fused_state: Dict[str, Tuple[int, ...]], cols: int,
                          fused_saved: bool) -> None:
    """Raises ValueError unless a FUSED table's optimizer state (``fused_state``: {key suffix:
    shape}) can be the state of optimizer ``saved`` (the tiered side's), naming both.

    ``fused_saved``: the FUSED state is the checkpoint's (restored into a tiered table), else
    the model's now (a tiered table's rows restored into it)."""
    fits = fused_optimizers(fused_state, cols)
    if saved in fits:
        return
    fused = " or ".join(fits) if fits else f"an optimizer of state {_describe(fused_state)}"
    if fused_saved:
        raise ValueError(f"table {table[0]}{table[1]}: cannot restore the optimizer state of {fused} (saved as "
                         f"TorchRec's FUSED table: {_describe(fused_state)}) into a tiered table trained with "
                         f"{saved}: another optimizer")
    raise ValueError(f"table {table[0]}{table[1]}: cannot restore the optimizer state of {saved} (saved as a "
                     f"tiered table) into TorchRec's FUSED table trained with {fused} "
                     f"({_describe(fused_state)}): another optimizer")


def _saved_fused_state(step: ChainStep, table: Table) -> Dict[str, Tuple[int, ...]]:
    """{key suffix: shape} of a FUSED table's optimizer state in a step's dense state."""
    prefix = f"optim.state.{weight_key(table)}.{table[1]}."
    return {k[len(prefix):]: tuple(md.size) for k, md in step.reader.metadata.state_dict_metadata.items()
            if k.startswith(prefix) and isinstance(md, TensorStorageMetadata)}


def check_dense_optimizers(pieces: List[LocalPiece], tables: Set[Table], chain: List[ChainStep]) -> None:
    """Raises ValueError (naming both optimizers) when a table saved FUSED and tiered now
    (``tables``) was trained with another optimizer than this rank's shards of it.

    Raises:
        ChainError: no step of the chain holds the table's weights.
    """
    sources = dense_sources(chain, tables)
    for piece in pieces:
        table = table_of(piece.spec)
        if table in tables:
            check_fused_optimizer(table, piece.spec.optimizer_name, _saved_fused_state(chain[sources[table]], table),
                                  piece.spec.cols, fused_saved=True)


def check_fused_targets(state: Dict[str, Any], tables: Set[Table], chain: List[ChainStep]) -> None:
    """Raises ValueError (naming both optimizers) when a table saved tiered and FUSED now
    (``tables``) was saved with another optimizer's state than its FUSED optimizer keeps, or
    with the Adam family's (a FUSED table's rows take one part of state: ``FusedRows``)."""
    optim_state = state.get("optim", {}).get("state", {})
    for spec in chain_specs(chain, fused=False):
        table = table_of(spec)
        if table not in tables:
            continue
        now = optim_state.get(weight_key(table), {})
        prefix = f"{table[1]}."
        fused_state = {k[len(prefix):]: tuple(v.size()) for k, v in now.items()
                       if k.startswith(prefix) and hasattr(v, "size")}
        check_fused_optimizer(table, spec.optimizer_name, fused_state, spec.cols, fused_saved=False)
        if len(spec.state_parts) > 1:
            raise ValueError(f"table {table[0]}{table[1]}: restoring the {spec.optimizer_name} state of a tiered "
                             "table into TorchRec's FUSED table is not supported (only one part of state: "
                             "momentum1)")


def table_state(state: Dict[str, Any], tables: Set[Table]) -> Dict[str, Any]:
    """The part of a state (``{"model": ..., "optim": ...}``) that holds ``tables`` (the same
    values: loading it loads them into ``state``)."""
    optim_state = state.get("optim", {}).get("state", {})
    part: Dict[str, Any] = {"model": {}, "optim": {"state": {}}}
    for table in sorted(tables):
        key = weight_key(table)
        if key in state["model"]:
            part["model"][key] = state["model"][key]
        if key in optim_state:
            part["optim"]["state"][key] = optim_state[key]
    return part


def restore_from_dense(
    pieces: List[LocalPiece], tables: Set[Table], chain: List[ChainStep], block_rows: int = 1 << 16
) -> None:
    """Writes the tiered shards of ``tables`` (FUSED when saved) from the saved ShardedTensors
    of their ``dense_sources`` step, a block of rows at a time (the rows of later deltas
    are applied after, like any chunk). An Adam-family table takes both of FBGEMM's parts
    (``read_dense_rows``); TorchRec's FUSED kernel saves no step count, so the kernel's is
    the chain's tiered tables' (``restore_optimizer_steps``), else 0.

    Raises:
        ValueError: the table was saved with another optimizer's state (``check_dense_optimizers``).
    """
    check_dense_optimizers(pieces, tables, chain)  # before any row is written
    sources = dense_sources(chain, tables)
    for piece in pieces:
        spec = piece.spec
        table = table_of(spec)
        if table not in tables:
            continue
        for lo, hi in _blocks(spec.rows, block_rows):
            # Row-wise: the first column shard's values, at the rows' own offset.
            weights, state = read_dense_rows(chain[sources[table]], spec, lo, hi, spec.row_offset + lo)
            piece.emb.set_rows(piece.t, torch.arange(lo, hi), weights, state)


def tiered_tables(model: nn.Module) -> Set[Table]:
    """The (prefix, table, module dict) of every tiered table of the model (from its
    sharding plans)."""
    from torchrec_mtrains.checkpoint.tiered_parts import collections_of

    return {(prefix, name, m.TABLES_ATTR) for prefix, m in collections_of(model) for name in m.tiered_table_names()}
