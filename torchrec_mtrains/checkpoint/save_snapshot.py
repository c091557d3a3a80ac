"""What a checkpoint step holds, fixed at the step that saves it, so that the rows can be
written while training goes on (``DifferentialCheckpointer.async_save``) or at once.

At the saving step, between training steps:

- each copied tiered shard's rows to save (a delta: the rows marked dirty; a full step:
  the rows its tier holds as written) become a ``RowSnapshot`` of its kernel: the tier is
  flushed, and any later write to it keeps the old value of a row not read yet;
- each tracked FUSED shard's changed rows (a delta) are copied out of TorchRec's tensors;
- the dense state (with the FUSED tables of a full step) is copied (``stage``);
- the dirty marks are taken: training marks from a clear bitmap, and a save that fails
  gives its marks back, so the next save holds those rows too.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot

__all__ = ["HeldRows", "PieceSnapshot", "SnapshotRows", "stage", "taken_marks"]

_SCAN_ROWS = 1 << 22  # rows whose written ids are listed at a time


class SnapshotRows:
    """A tiered shard's rows as of the snapshot (the row interface a save reads through)."""

    def __init__(self, snapshot: RowSnapshot) -> None:
        self.snapshot = snapshot

    def store_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        return self.snapshot.read(ids)

    def storage_order(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        """The tier's fastest order of ``ids`` (the block store's log order), or None."""
        return self.snapshot.store.storage_order(ids)


class HeldRows:
    """Rows copied at the snapshot: ``ids`` ascending, ``rows`` theirs."""

    def __init__(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        self.ids, self.rows = ids, rows

    def store_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(self.ids, ids)
        if ids.numel() and (int(at.max()) >= self.ids.numel() or not bool(torch.equal(self.ids[at], ids))):
            raise RuntimeError("rows asked of a checkpoint's snapshot that it did not copy")
        return self.rows[at]


class PieceSnapshot:
    """One shard as a save holds it: ``piece`` (reading through the snapshot), the rows it
    saves (``selected``: a DirtyRows, or a virtual shard's SortedIds), and the dirty marks
    taken from the live shard (``marks``)."""

    def __init__(self, piece: LocalPiece, selected: Any, marks: DirtyRows, live: DirtyRows,
                 release: Optional[Any] = None, fused: bool = False, virtual: Optional[Any] = None) -> None:
        self.piece, self.selected, self.marks, self._live = piece, selected, marks, live
        self.fused = fused  # a FUSED shard (else a copied tiered one)
        self.virtual = virtual  # a virtual shard's VirtualSave (virtual_pieces.py)
        self._release = release

    def give_back_marks(self) -> None:
        """The save failed: its rows go into the next one too."""
        self._live.bits.bitwise_or_(self.marks.bits)

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None


def taken_marks(live: DirtyRows) -> DirtyRows:
    """A copy of ``live``'s marks, which are cleared."""
    marks = DirtyRows(live.num_rows)
    marks.bits.copy_(live.bits)
    live.clear()
    return marks


def written_rows(piece: LocalPiece) -> DirtyRows:
    """The rows its tier holds as written, as a bitmap (a full step holds these and the
    rows the cache holds: ``snapshot_rows(..., add_cached=True)``)."""
    out = DirtyRows(piece.spec.rows)
    for lo in range(0, piece.spec.rows, _SCAN_ROWS):
        out.mark(piece.emb.written_ids(piece.t, lo, min(piece.spec.rows, lo + _SCAN_ROWS)))
    return out


def tiered_snapshot(piece: LocalPiece, full: bool) -> PieceSnapshot:
    """Snapshots a copied tiered shard (between steps; its tier need not be flushed)."""
    emb, t = piece.emb, piece.t
    live = emb.dirty_rows(t)
    selected = written_rows(piece) if full else None
    marks = taken_marks(live)
    selected = selected if full else marks
    snapshot = emb.snapshot_rows(t, selected, add_cached=full)
    return PieceSnapshot(LocalPiece(SnapshotRows(snapshot), t, piece.spec, piece.optimizer_step), selected, marks, live,
                         lambda: emb.release_snapshot(t))


def fused_snapshot(piece: LocalPiece, full: bool) -> PieceSnapshot:
    """Snapshots a tracked FUSED shard: a delta's changed rows are copied now."""
    live = piece.emb.dirty_rows(piece.t)
    marks = taken_marks(live)
    if full:  # whole in the (staged) dense state
        return PieceSnapshot(piece, DirtyRows(piece.spec.rows), marks, live, fused=True)
    ids = marks.ids()
    held = HeldRows(ids, piece.emb.store_rows(piece.t, ids))
    return PieceSnapshot(LocalPiece(held, piece.t, piece.spec), marks, marks, live, fused=True)


def stage(state: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of a state (``{"model": ..., "optim": ..., ...}``) that training cannot change:
    each tensor and each ShardedTensor's local shards copied once, the rest deep-copied.
    (DCP's ``_create_cpu_state_dict`` deep-copies a ShardedTensor and ``_copy_state_dict``
    then copies it again: twice the time training stops for, on the FUSED tables.)"""
    if isinstance(state, dict):
        return {k: stage(v) for k, v in state.items()}
    if isinstance(state, list):
        return [stage(v) for v in state]
    if type(state) is tuple:  # noqa: E721 (a named tuple is a leaf: deep-copied whole)
        return tuple(stage(v) for v in state)
    if isinstance(state, ShardedTensor):
        shards = [Shard(s.tensor.detach().clone(), copy.deepcopy(s.metadata)) for s in state.local_shards()]
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, copy.deepcopy(state.metadata()), process_group=state._process_group)
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    return copy.deepcopy(state)


def snapshots_of(pieces: List[LocalPiece], fused: List[LocalPiece], full: bool,
                 virtual_snapshot: Callable[[LocalPiece, bool], PieceSnapshot]) -> List[PieceSnapshot]:
    """Snapshots of the copied tiered shards (a virtual one's by ``virtual_snapshot``),
    then of the tracked FUSED ones."""
    out: List[PieceSnapshot] = []
    try:
        for p in pieces:
            out.append(virtual_snapshot(p, full) if p.spec.virtual else tiered_snapshot(p, full))
        for p in fused:
            out.append(fused_snapshot(p, full))
    except BaseException:
        for s in out:
            s.give_back_marks()
            s.release()
        raise
    return out
