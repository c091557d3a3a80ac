"""The FUSED table shards a checkpoint step saves as pieces of their own.

A full step leaves TorchRec's FUSED tables in the dense state, as TorchRec saves them, so
plain DCP readers read it; a delta takes them out of the dense state and saves, as row
chunks of each local shard, the rows its training looked up since the parent step
(``fused_tracking``), with their optimizer state. Tables whose fused optimizer keeps
state other than ``momentum1`` (one value per row or per element) stay whole in every
step's dense state: a row chunk holds the weights and that one state.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

import torch

from torchrec_mtrains.checkpoint.collectives import all_gather
from torchrec_mtrains.checkpoint.fused_tracking import FusedShardRows
from torchrec_mtrains.checkpoint.kind_change import FusedRows, Table, fused_pieces, state_key, table_of, weight_key
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.kernels.dirty_rows import DirtyRows

__all__ = ["TrackedFusedRows", "delta_tables", "fused_save_pieces"]


class TrackedFusedRows(FusedRows):
    """A FUSED shard's rows with the bitmap of the rows trained since the last save."""

    def __init__(self, weights: torch.Tensor, state: Optional[torch.Tensor], dirty: DirtyRows) -> None:
        super().__init__(weights, state)
        self.dirty = dirty

    def dirty_rows(self, t: int) -> DirtyRows:
        return self.dirty


def delta_tables(state: Dict[str, Any], shards: List[FusedShardRows]) -> Set[Table]:
    """The FUSED tables whose deltas hold only their changed rows (collective: the same set
    on every rank, whichever rank holds a table's shards)."""
    optim_state = state.get("optim", {}).get("state", {})
    fits, does_not = set(), set()
    for table in {table_of(s) for s in shards}:
        keys = set(optim_state.get(weight_key(table), {}))
        (fits if keys <= {state_key(table)} else does_not).add(table)
    every = all_gather((sorted(fits), sorted(does_not)))
    return {tuple(t) for f, _ in every for t in f} - {tuple(t) for _, n in every for t in n}


def fused_save_pieces(state: Dict[str, Any], shards: List[FusedShardRows], tables: Set[Table]) -> List[LocalPiece]:
    """This rank's shards of ``tables`` as pieces over the state's tensors and their bitmaps."""
    by_key = {s.key: s for s in shards}
    out = []
    for piece in fused_pieces(state, tables):
        shard = by_key.get(piece.spec.key)
        if shard is None or shard.dirty.num_rows != piece.spec.rows:
            raise RuntimeError(f"FUSED table shard {piece.spec.key} of the model's state_dict is not one its "
                               "kernels track")
        rows = TrackedFusedRows(piece.emb.weights, piece.emb.state, shard.dirty)
        out.append(LocalPiece(rows, 0, piece.spec))
    return out
