"""Virtual table shards in differential checkpoints: rows keyed by id, not by row.

A virtual shard's kernel rows hold whichever ids its index gave them, and an evicted id's
row goes to another id, so a step saves ids, not rows:

- **Live ids.** Every step lists the shard's live ids with the policy's metadata (access
  count, last-use seconds): ``VirtualRecord.live``, chunks of ``[count, 3]`` int64.
- **Rows.** A full step saves the row of every live id; a delta those whose rows changed
  since the parent step: trained (the dirty marks of their rows) or made (a new id, or an
  evicted one come back, starts from its initial value). The chunks are the usual ones
  (``row_io``), with the shard-local ids of the saved rows as their ids and the shard's id
  space as its rows. Rows are read through a ``RowSnapshot`` of the kernel rows, so an
  async save is exact while training goes on (copy-on-write).
- **Restore.** A target shard takes the live ids of the chain's last step that fall in its
  id range (its buckets, on any world size), and each id's row from the newest step that
  holds it -- where it last changed. Its index then holds exactly those ids
  (``TieredEmbeddingBags.restore_virtual``), with the saved metadata.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Callable, Dict, List, Optional, Tuple

import torch

from torchrec_mtrains.checkpoint.restore import check_same_optimizer, read_chunk
from torchrec_mtrains.checkpoint.row_io import PlannedChunk
from torchrec_mtrains.checkpoint.save_snapshot import PieceSnapshot, taken_marks
from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.types import ChainError, ChunkSpec, PieceRecord, PieceSpec, VirtualRecord, table_of
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot

__all__ = [
    "LIVE_CHUNK_IDS", "SortedIds", "VirtualSave", "apply_virtual", "check_virtual", "export_virtual", "live_chunks",
    "plan_virtual_chunks", "virtual_snapshot",
]

LIVE_CHUNK_IDS = 1 << 20  # live ids per chunk of the live list (24 MiB)


class SortedIds:
    """A set of shard-local ids (ascending), listed by range as a ``DirtyRows`` is."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def ids_in(self, lo: int, hi: int) -> torch.Tensor:
        a, b = torch.searchsorted(self.ids, torch.tensor([lo, hi], dtype=torch.int64)).tolist()
        return self.ids[a:b]

    def count(self) -> int:
        return int(self.ids.numel())


class VirtualSnapshotRows:
    """A virtual shard's saved rows as of the snapshot, asked for by shard-local id."""

    def __init__(self, snapshot: RowSnapshot, ids: torch.Tensor, rows: torch.Tensor) -> None:
        self.snapshot, self.ids, self.rows = snapshot, ids, rows  # ids ascending, rows theirs

    def store_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(self.ids, ids)
        if ids.numel() and (int(at.max()) >= self.ids.numel() or not bool(torch.equal(self.ids[at], ids))):
            raise RuntimeError("ids asked of a virtual table's checkpoint snapshot that it did not select")
        return self.snapshot.read(self.rows[at])


@dataclasses.dataclass
class VirtualSave:
    """What a step saves of a virtual shard besides its rows: the live list, ascending by
    id (``[n, 3]`` int64: id, count's fp32 bits, last-use seconds), and its kernel's state."""

    live: torch.Tensor
    pending: int
    next_pass_at: int


def virtual_snapshot(piece: LocalPiece, full: bool) -> PieceSnapshot:
    """Snapshots a virtual shard between steps: its live ids and metadata now, and the rows
    to save (a full step: every live id's; a delta: those marked changed) as a
    ``RowSnapshot`` of their kernel rows."""
    emb, t = piece.emb, piece.t
    state = emb.virtual_state(t)  # drains; the pending steps' new rows are marked changed
    live_marks = emb.dirty_rows(t)
    marks = taken_marks(live_marks)
    ids, rows = state["ids"], state["rows"]
    if not full:
        keep = marks.test(rows)
        ids, rows = ids[keep], rows[keep]
    selected = DirtyRows(live_marks.num_rows)
    selected.mark(rows)
    try:
        snapshot = emb.snapshot_rows(t, selected)
    except BaseException:
        live_marks.bits.bitwise_or_(marks.bits)
        raise
    order = torch.argsort(ids)
    reader = VirtualSnapshotRows(snapshot, ids[order], rows[order])
    by_id = torch.argsort(state["ids"])
    live = torch.stack([state["ids"], state["counts"].view(torch.int32).to(torch.int64), state["times"]], 1)[by_id]
    saved = VirtualSave(live.contiguous(), int(state["pending"]), int(state["next_pass_at"]))
    return PieceSnapshot(LocalPiece(reader, t, piece.spec, piece.optimizer_step), SortedIds(reader.ids), marks, live_marks,
                         lambda: emb.release_snapshot(t), virtual=saved)


def plan_virtual_chunks(piece: LocalPiece, selected: SortedIds, max_rows: int, prefix: str,
                        quantize: str = "") -> List[PlannedChunk]:
    """The saved ids of a virtual shard cut into chunks of at most ``max_rows`` rows (by
    id: a shard's id space is far too large to scan as a dense table's rows are)."""
    ids = selected.ids
    chunks: List[PlannedChunk] = []
    for start in range(0, ids.numel(), max_rows):
        part = ids[start : start + max_rows]
        chunks.append(PlannedChunk(piece, f"{piece.spec.key}/{prefix}{len(chunks)}", int(part[0]),
                                   int(part[-1]) + 1, int(part.numel()), selected.ids_in, quantize=quantize))
    return chunks


def _live_crc(live: torch.Tensor) -> int:
    return zlib.crc32(live.contiguous().numpy().view("uint8"))


def live_chunks(snapshots: List[PieceSnapshot]) -> Tuple[Dict[str, VirtualRecord], Dict[str, torch.Tensor]]:
    """Per virtual shard (by piece key) its record, and the DCP tensors of its live lists."""
    records: Dict[str, VirtualRecord] = {}
    tensors: Dict[str, torch.Tensor] = {}
    for s in snapshots:
        if s.virtual is None:
            continue
        key, live = s.piece.spec.key, s.virtual.live
        specs = []
        for n, start in enumerate(range(0, live.shape[0], LIVE_CHUNK_IDS)):
            part = live[start : start + LIVE_CHUNK_IDS]
            chunk_key = f"{key}/live{n}"
            tensors[chunk_key] = part
            specs.append(ChunkSpec(chunk_key, int(part[0, 0]), int(part[-1, 0]) + 1, int(part.shape[0]),
                                   _live_crc(part)))
        records[key] = VirtualRecord(specs, s.virtual.pending, s.virtual.next_pass_at)
    return records, tensors


# ---------------------------------------------------------------------- restore ----
def _read_live(step: ChainStep, chunk: ChunkSpec) -> torch.Tensor:
    """A live-list chunk, checked against its manifest entry."""
    live = step.reader.read([chunk.key])[chunk.key]
    bad = None
    if live.dtype != torch.int64 or tuple(live.shape) != (chunk.count, 3):
        bad = f"holds {live.dtype} of shape {tuple(live.shape)}, expected int64 {chunk.count} x 3"
    elif _live_crc(live) != chunk.crc32:
        bad = "fails its checksum"
    elif chunk.count and (int(live[0, 0]) < chunk.row_lo or int(live[-1, 0]) >= chunk.row_hi
                          or not bool((live[1:, 0] > live[:-1, 0]).all())):
        bad = f"has ids outside [{chunk.row_lo}, {chunk.row_hi}) or out of order"
    if bad is not None:
        where = step.reader.file_of(chunk.key)
        raise ChainError(f"checkpoint file {where} (step {step.step}): live ids {chunk.key} {bad}", where, step.step)
    return live


def _overlaps(target: PieceSpec, source: PieceSpec) -> bool:
    return (table_of(target) == table_of(source)
            and source.row_offset < target.row_offset + target.rows
            and target.row_offset < source.row_offset + source.rows)


def _chunk_overlaps(target: PieceSpec, source: PieceSpec, chunk: ChunkSpec) -> bool:
    """Whether a chunk of ``source`` (its ids ``[row_lo, row_hi)``, source-local) may hold
    ids of ``target``."""
    return (source.row_offset + chunk.row_lo < target.row_offset + target.rows
            and target.row_offset < source.row_offset + chunk.row_hi)


def _sources(target: PieceSpec, step: ChainStep) -> List[PieceRecord]:
    return [r for r in step.pieces() if _overlaps(target, r.spec)]


def _check_kinds(pieces: List[LocalPiece], chain: List[ChainStep]) -> None:
    for piece in pieces:
        for step in chain:
            for record in step.pieces():
                s = record.spec
                if table_of(s) == table_of(piece.spec) and s.virtual != piece.spec.virtual:
                    saved, now = ("a virtual", "not virtual") if s.virtual else ("not a virtual", "a virtual")
                    raise ValueError(f"table {s.table} was {saved} table when step {step.step} was saved and is "
                                     f"{now} one now: a checkpoint restores a virtual table only as one")


def _target_live(target: PieceSpec, chain: List[ChainStep]) -> Tuple[torch.Tensor, int, Optional[int]]:
    """The live list (global ids ascending, count bits, seconds) of the chain's last step
    that falls in the target's ids; the steps to replay; the next pass (None unless the
    target is the saved shard itself)."""
    last = chain[-1]
    lo, hi = target.row_offset, target.row_offset + target.rows
    parts, pending, next_pass_at = [], 0, None
    for record in _sources(target, last):  # each has its live ids (StepManifest.from_json checks)
        pending = max(pending, record.virtual.pending)
        if record.spec == target:
            next_pass_at = record.virtual.next_pass_at
        for chunk in record.virtual.live:
            if not _chunk_overlaps(target, record.spec, chunk):
                continue
            live = _read_live(last, chunk).clone()
            live[:, 0] += record.spec.row_offset
            keep = (live[:, 0] >= lo) & (live[:, 0] < hi)
            parts.append(live[keep])
    live = torch.cat(parts) if parts else torch.empty((0, 3), dtype=torch.int64)
    live = live[torch.argsort(live[:, 0])]
    return live, pending, next_pass_at


def _row_chunks(target: PieceSpec, chain: List[ChainStep]):
    """(step, record, chunk) of every row chunk that may hold target ids, newest step first."""
    for step in reversed(chain):
        for record in _sources(target, step):
            for chunk in record.chunks:
                if _chunk_overlaps(target, record.spec, chunk):
                    yield step, record, chunk


def _check_layout(target: PieceSpec, source: PieceSpec) -> None:
    check_same_optimizer(source, target)
    if (source.cols, source.dtype, source.state_values) != (target.cols, target.dtype, target.state_values):
        raise ValueError(f"virtual table {target.table}: its rows were saved as {source.cols} {source.dtype} "
                         f"weights and {source.state_values} optimizer values and are now {target.cols} "
                         f"{target.dtype} and {target.state_values}; a virtual table restores into the same layout")


RowSink = Callable[[torch.Tensor, torch.Tensor], None]  # (positions in the live list, their rows)


def _resolve(target: PieceSpec, chain: List[ChainStep], live: torch.Tensor, sink: Optional[RowSink]) -> None:
    """Finds each live id's row (``live``: the target's live list) in the newest step that
    holds it and gives it to ``sink`` (None: reads and checks only)."""
    ids = live[:, 0].contiguous()
    found = torch.zeros(ids.numel(), dtype=torch.bool)
    for step, record, chunk in _row_chunks(target, chain):
        if ids.numel() and bool(found.all()):
            break
        _check_layout(target, record.spec)
        saved, rows = read_chunk(step, record, chunk)
        if ids.numel() == 0:
            continue  # read all the same: a restore checks every chunk it could need
        saved = saved + record.spec.row_offset
        at = torch.searchsorted(ids, saved).clamp_(max=ids.numel() - 1)
        take = (ids[at] == saved) & ~found[at]  # a newer step holds it already
        at = at[take]
        found[at] = True
        if sink is not None and at.numel():
            sink(at, rows[take].contiguous())
    if not bool(found.all()):
        missing = ids[~found][:5].tolist()
        last = chain[-1]
        raise ChainError(f"step {last.step} lists live ids of virtual table {target.table} (e.g. {missing}) whose "
                         "rows no step of its chain holds", last.reader.path, last.step)


def _restore_piece(piece: LocalPiece, chain: List[ChainStep], write: bool) -> int:
    """Restores one virtual target (``write`` False: reads and checks only); returns the
    live ids it holds."""
    target = piece.spec
    live, pending, next_pass_at = _target_live(target, chain)
    capacity = piece.emb.virtual_capacity(piece.t)
    if live.shape[0] > capacity:
        raise ValueError(f"virtual table {target.table}: the checkpoint holds {live.shape[0]} live ids of this "
                         f"shard's buckets, more than its {capacity} rows; give it more (TieredParams.virtual_rows)")
    if not write:
        _resolve(target, chain, live, None)
        return int(live.shape[0])
    counts = live[:, 1].to(torch.int32).view(torch.float32)
    kernel_rows = piece.emb.restore_virtual(piece.t, live[:, 0] - target.row_offset, counts, live[:, 2],
                                            pending, next_pass_at)

    def write_rows(at: torch.Tensor, rows: torch.Tensor) -> None:
        piece.emb.set_store_rows(piece.t, kernel_rows[at], rows)

    _resolve(target, chain, live, write_rows)
    return int(live.shape[0])


def export_virtual(chain: List[ChainStep]) -> Dict[str, Tuple[PieceSpec, torch.Tensor, torch.Tensor]]:
    """Each virtual table of the chain's last step (by its weight's key): a spec of the
    whole table, its live ids (global, ascending) and their rows as the tiers store them.
    Holds a table's live rows in memory."""
    tables: Dict[str, PieceSpec] = {}
    for record in chain[-1].pieces():
        s = record.spec
        if s.virtual:
            tables[s.weight_key] = dataclasses.replace(s, row_offset=0, rows=s.table_rows)
    out = {}
    for name, spec in sorted(tables.items()):
        live, _, _ = _target_live(spec, chain)
        rows = torch.empty((live.shape[0], spec.row_width), dtype=spec.torch_dtype)

        def sink(at: torch.Tensor, got: torch.Tensor, rows: torch.Tensor = rows) -> None:
            rows[at] = got

        _resolve(spec, chain, live, sink)
        out[name] = (spec, live[:, 0].contiguous(), rows)
    return out


def check_virtual(pieces: List[LocalPiece], chain: List[ChainStep]) -> None:
    """Reads and checks what the restore of this rank's virtual shards needs.

    Raises:
        ChainError: a live list or chunk is missing or damaged, or a live id has no row.
        ValueError: a table that is virtual now was not when saved, or the other way.
    """
    _check_kinds(pieces, chain)
    for piece in pieces:
        if piece.spec.virtual:
            _restore_piece(piece, chain, write=False)


def apply_virtual(pieces: List[LocalPiece], chain: List[ChainStep]) -> int:
    """Restores this rank's virtual shards (after ``check_virtual``); returns their live ids."""
    return sum(_restore_piece(p, chain, write=True) for p in pieces if p.spec.virtual)
