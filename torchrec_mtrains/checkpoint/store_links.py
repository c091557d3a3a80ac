"""Zero-copy checkpoints of SSD tables: a step links the block store's file and saves its
location map, not its rows.

The block store is log-structured: a row's new version goes to a new log slot, and the old
one stays where it was until the garbage collector reuses its segment. ``pin_snapshot``
keeps the collector away from every segment the map points into, so the rows as of the
save stay readable in the file for as long as the step exists; the step holds a hard link
to the file (which survives the live store's path being replaced by a new store) and the
map entries (row, location). A save then costs the map (16 bytes a written row) instead of
the rows; the pinned segments cost disk only for rows superseded after the save.

Restoring the same shard onto an SSD table (a resume) adopts the file itself: the live
store's path is linked to it and the store reopened with the step's map
(``TieredEmbeddingBags.adopt_store_file``). Any other restore (another sharding, tier or
world size) and an export read the rows through a read-only reader of the linked file.
Pins live in the process that holds the store: every rank drops the pins of steps no
longer on disk after each save, and an adopted store pins again the other steps that link
the same file.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import zlib
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from torchrec_mtrains.checkpoint.steps import step_name, step_of
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece, local_pieces
from torchrec_mtrains.checkpoint.types import (
    LINKS_DIR,
    MAP_ENTRY_BYTES,
    ChainError,
    ChunkSpec,
    PieceRecord,
    SnapshotSpec,
    StepManifest,
)
from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.fsync import fsync_path

__all__ = [
    "Adoption",
    "adopt",
    "link_pieces",
    "linked_store",
    "plan_adoption",
    "read_linked_rows",
    "read_map_chunk",
    "release_pins",
]

_MAP_WINDOW_ROWS = 1 << 22  # rows whose map entries are listed (and saved as one chunk) at a time


def linked_store(piece: LocalPiece, directory: str) -> Optional[BlockStore]:
    """The piece's block store when a step in ``directory`` can link its file (an SSD table
    of one file, on the checkpoint's filesystem: a hard link cannot cross one), else None.
    A virtual table's rows are copied: its rows hold other ids over time, so a map of rows
    is not a map of ids."""
    if piece.spec.virtual:
        return None
    linkable = getattr(piece.emb, "linkable_store", None)
    store = linkable(piece.t) if linkable is not None else None
    if store is None:
        return None
    try:
        same_fs = os.stat(store.path).st_dev == os.stat(directory).st_dev
    except OSError:
        return None
    return store if same_fs else None


def _names(piece: LocalPiece) -> Tuple[str, str]:
    spec = piece.spec
    stem = f"{spec.module}{spec.table_prefix}{spec.table}.r{spec.row_offset}_c{spec.col_offset}"
    return f"{stem}.blk", f"{stem}.map"


def link_pieces(pieces: List[LocalPiece], path: str, step: int) -> List[PieceRecord]:
    """Saves each piece (with a ``linked_store``) into step directory ``path`` by pinning
    its store's current rows under tag ``step``, hard-linking the store's file and writing
    the location map. Call after the tiers were flushed, between steps.

    Raises:
        OSError: a link or the map could not be written (the pins stay until the step is
            known to be gone: ``release_pins``).
    """
    if not pieces:
        return []
    links = os.path.join(path, LINKS_DIR)
    os.makedirs(links, exist_ok=True)
    records = []
    for piece in pieces:
        store = piece.emb.linkable_store(piece.t)
        store.pin_snapshot(step)
        file_name, map_name = _names(piece)
        link = os.path.join(links, file_name)
        if os.path.lexists(link):
            os.unlink(link)
        os.link(store.path, link)
        chunks = _write_map(store, step, piece.spec.rows, os.path.join(path, map_name), map_name)
        entries = sum(c.count for c in chunks)
        snapshot = SnapshotSpec(step, file_name, map_name, entries, store.table_uuid)
        records.append(PieceRecord(piece.spec, entries == piece.spec.rows, chunks, snapshot,
                                   optimizer_step=piece.optimizer_step))
    fsync_path(links)
    fsync_path(path)
    return records


def _write_map(store: BlockStore, tag: int, rows: int, where: str, name: str) -> List[ChunkSpec]:
    chunks = []
    offset = 0
    with open(where, "wb") as f:
        for lo in range(0, rows, _MAP_WINDOW_ROWS):
            hi = min(rows, lo + _MAP_WINDOW_ROWS)
            ids, locations = store.snapshot_entries(tag, lo, hi)
            if ids.numel() == 0:
                continue
            data = ids.numpy().tobytes() + locations.numpy().tobytes()
            f.write(data)
            chunks.append(ChunkSpec(f"{name}@{offset}", lo, hi, int(ids.numel()), zlib.crc32(data)))
            offset += len(data)
        f.flush()
        os.fsync(f.fileno())
    return chunks


def _step_dir(directory: str, snapshot: SnapshotSpec) -> str:
    return os.path.join(directory, step_name(snapshot.step))


def read_map_chunk(directory: str, record: PieceRecord, chunk: ChunkSpec) -> Tuple[torch.Tensor, torch.Tensor]:
    """(shard-local ids, locations) of one chunk of a linked piece's map, checked.

    Raises:
        ChainError: the map file is missing, short or fails the chunk's CRC-32.
    """
    snapshot = record.snapshot
    where = os.path.join(_step_dir(directory, snapshot), snapshot.map_file)
    offset = int(chunk.key.rsplit("@", 1)[1])
    nbytes = chunk.count * MAP_ENTRY_BYTES
    try:
        with open(where, "rb") as f:
            f.seek(offset)
            data = f.read(nbytes)
    except OSError as e:
        raise ChainError(f"checkpoint file {where} (step {snapshot.step}) cannot be read: {e.strerror}",
                         where, snapshot.step) from None
    bad = None
    if len(data) != nbytes:
        bad = f"is short: {len(data)} of the {nbytes} bytes of chunk {chunk.key}"
    elif zlib.crc32(data) != chunk.crc32:
        bad = f"fails the checksum of chunk {chunk.key}"
    if bad is None:
        entries = torch.frombuffer(bytearray(data), dtype=torch.int64)
        ids, locations = entries[: chunk.count], entries[chunk.count :]
        if chunk.count and (int(ids[0]) < chunk.row_lo or int(ids[-1]) >= chunk.row_hi):
            bad = f"has ids outside [{chunk.row_lo}, {chunk.row_hi}) in chunk {chunk.key}"
        else:
            return ids, locations
    raise ChainError(f"checkpoint file {where} (step {snapshot.step}) {bad}", where, snapshot.step)


def _read_map(directory: str, record: PieceRecord) -> Tuple[torch.Tensor, torch.Tensor]:
    parts = [read_map_chunk(directory, record, c) for c in record.chunks]
    if not parts:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _link_path(directory: str, snapshot: SnapshotSpec) -> str:
    return os.path.join(_step_dir(directory, snapshot), LINKS_DIR, snapshot.file)


def read_linked_rows(directory: str, record: PieceRecord, chunk: ChunkSpec,
                     readers: Dict[str, BlockStore]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(shard-local ids, rows) of one chunk of a linked piece, read from its linked file
    (``readers`` caches a read-only reader per file).

    Raises:
        ChainError: the map chunk is damaged, the file is missing or of another table, or a
            row fails its block's checks.
    """
    ids, locations = read_map_chunk(directory, record, chunk)
    snapshot = record.snapshot
    where = _link_path(directory, snapshot)
    try:
        reader = readers.get(where)
        if reader is None:
            reader = BlockStore.open_read_only(where)
            readers[where] = reader
        if reader.table_uuid != snapshot.table_uuid:
            raise ValueError(f"holds table {reader.table_uuid:#x}, the step saved {snapshot.table_uuid:#x}")
        return ids, reader.read_locations(ids, locations)
    except (OSError, ValueError, IndexError) as e:  # CorruptionError is a ValueError
        raise ChainError(f"checkpoint file {where} (step {snapshot.step}) cannot be read: {e}",
                         where, snapshot.step) from None


@dataclasses.dataclass
class Adoption:
    """A local piece to be restored by adopting a linked store file: its map, read and
    checked before anything is restored."""

    piece: LocalPiece
    record: PieceRecord
    source: str
    ids: torch.Tensor
    locations: torch.Tensor


def plan_adoption(piece: LocalPiece, record: PieceRecord, directory: str) -> Optional[Adoption]:
    """An ``Adoption`` when the piece can take the linked file of ``record`` as it is: the
    same shard, an SSD table whose store has the file's row layout; else None.

    Raises:
        ChainError: the map or the linked file is missing or damaged.
    """
    snapshot = record.snapshot
    live = linked_store(piece, directory)
    if snapshot is None or record.spec != piece.spec or live is None:
        return None
    source = _link_path(directory, snapshot)
    try:
        reader = BlockStore.open_read_only(source)
        try:
            same = (reader.table_uuid == snapshot.table_uuid and _geometry(reader) == _geometry(live))
        finally:
            reader.close()
    except (OSError, ValueError) as e:
        raise ChainError(f"checkpoint file {source} (step {snapshot.step}) cannot be read: {e}",
                         source, snapshot.step) from None
    if not same:
        return None
    ids, locations = _read_map(directory, record)
    return Adoption(piece, record, source, ids, locations)


def _geometry(store: BlockStore) -> Tuple:
    layout = store.layout
    return tuple(layout.get(k) for k in ("num_rows", "dim", "state_dim", "dtype", "block_size", "seed",
                                          "init_lo", "init_hi"))


def adopt(adoption: Adoption, directory: str) -> None:
    """Restores the piece by adopting its linked file, then pins in the adopted store the
    rows of every other step in ``directory`` that links the same file."""
    piece, snapshot = adoption.piece, adoption.record.snapshot
    store = piece.emb.adopt_store_file(piece.t, adoption.source, adoption.ids, adoption.locations, snapshot.step)
    adoption.ids = adoption.locations = torch.empty(0, dtype=torch.int64)  # the store has them now
    inode = os.stat(store.path).st_ino
    for step, record in _other_links(directory, piece.spec.key, snapshot.step):
        try:
            if os.stat(_link_path(directory, record.snapshot)).st_ino != inode:
                continue
            _, locations = _read_map(directory, record)
        except (OSError, ChainError) as e:
            print(f"checkpoint: warning: step {step} of {directory} cannot be read ({e}); its rows of "
                  f"{piece.spec.table} may be overwritten by training", file=sys.stderr)
            continue
        store.pin_locations(step, locations)


def _other_links(directory: str, key: str, but: int) -> List[Tuple[int, PieceRecord]]:
    """(step, record) of the linked records of shard ``key`` in the other steps on disk."""
    out = []
    for name in sorted(os.listdir(directory)):
        step = step_of(name)
        if step is None or step == but:
            continue
        here = os.path.join(directory, name)
        for manifest_name in os.listdir(here) if os.path.isdir(here) else []:
            if not (manifest_name.startswith("tiered.rank") and manifest_name.endswith(".json")):
                continue
            where = os.path.join(here, manifest_name)
            try:
                with open(where) as f:
                    manifest = StepManifest.from_json(f.read(), where, step)
            except (OSError, ChainError):
                continue
            out += [(step, r) for r in manifest.pieces if r.snapshot is not None and r.spec.key == key]
    return out


def release_pins(model: nn.Module, directory: str) -> None:
    """Drops, in this rank's stores, the pins of steps no longer in ``directory``."""
    kept = {s for n in os.listdir(directory) if (s := step_of(n)) is not None}
    for piece in local_pieces(model):
        store = piece.emb.linkable_store(piece.t)
        if store is None:
            continue
        for tag in store.pin_tags():
            if tag not in kept:
                store.unpin_snapshot(tag)
