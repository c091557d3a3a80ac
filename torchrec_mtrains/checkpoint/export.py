"""One plain torch.distributed.checkpoint (DCP) checkpoint from a differential chain.

``export_full_checkpoint`` writes what ``dcp.save({"model": model.state_dict(), "optim":
model.fused_optimizer.state_dict(), "dense_optim": dense_optimizer.state_dict()})`` of the
trained model writes when its tiered tables are laid out as TorchRec's FUSED kernel lays
out its own (``torchrec_mtrains.sharding.checkpoint``):

* ``model.<module>embedding_bags.<table>.weight``: ``[table_rows, table_cols]`` of the
  table's dtype;
* ``optim.state.<module>embedding_bags.<table>.weight.<table>.momentum1``: fp32, one value
  per row of each shard for a row-wise optimizer (column-wise shards stacked), or
  ``[table_rows, table_cols]`` for an element-wise one; absent for SGD. An Adam-family table
  has FBGEMM's two parts of its state (``split_optimizer_states``) as TorchRec's FUSED kernel
  names them: ``...<table>.momentum1`` (exp_avg, ``[table_rows, table_cols]``) and
  ``...<table>.exp_avg_sq`` (``[table_rows, table_cols]``, or one value per row, stacked as
  above, for the partial row-wise ones), and ``...<table>.step``, the step count of its bias
  correction (a 0-d int64 tensor: the tiered fused optimizer's; TorchRec's FUSED kernel
  keeps none and ignores it);
* a virtual table (its rows keyed by id): ``model.<module>embedding_bags.<table>.weight_id``,
  its live ids (int64, global, ascending), beside ``...weight`` ``[live ids, table_cols]`` and
  the optimizer state of those ids (``optim.state....momentum1``, and ``...exp_avg_sq``:
  one value or a row each);
  a table's live rows are held in memory while they are written;
* every other item of the chain's last step (dense parameters, FUSED tables, the fused
  and dense optimizers' remaining state) as that step saved it.

Each saved shard is written as chunks of at most ``block_rows`` rows, each built when DCP's
writer asks for it: the initial rows a sparse full step implies, then the full step's rows,
then each delta's rows. A file holds whole blocks, up to the bytes of ``block_rows`` rows of
the widest table, since DCP's writer keeps a file's tensors until the file is closed.

A step whose chunks of a shard overlap (saved in the block store's log order: each chunk's
ids span the shard) is read once into a file-backed array in id order beside the
destination (the shard's saved rows' bytes, removed when the shard is done), and its
blocks are cut from there: otherwise every block would read every chunk.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor import TensorProperties as ShardProperties
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from torchrec_mtrains.checkpoint import chain as chain_dir
from torchrec_mtrains.checkpoint.integrity import check_files
from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.kind_change import dense_sources, read_dense_rows, table_of
from torchrec_mtrains.checkpoint.restore import init_rows, join_rows, read_chunk, split_rows
from torchrec_mtrains.checkpoint.row_io import GroupedFileWriter
from torchrec_mtrains.checkpoint.types import ChainError, ChunkSpec, PieceRecord, PieceSpec
from torchrec_mtrains.checkpoint.virtual_pieces import export_virtual
from torchrec_mtrains.kernels.tbe_settings import ADAM_FAMILY
from torchrec_mtrains.sharding.checkpoint import STATE_KEYS, STEP_KEY, rowwise_metadata

__all__ = ["export_full_checkpoint"]

_PARTIAL = ".export-partial"  # suffix of the directory an export is written to, then renamed
_SPILL = ".export-spill"  # beside it: steps saved in storage order, put in id order (removed after)
Offsets = Tuple[int, ...]
_UNREAD = object()  # a non-tensor item DCP has not loaded yet


def export_full_checkpoint(checkpoint: str, destination: str, block_rows: int = 1 << 16) -> None:
    """Writes the chain ending at step directory ``checkpoint`` as one plain DCP checkpoint.

    The result loads with ``dcp.load`` into a model whose tables are all TorchRec's own
    (FUSED), or tiered, of any world size and sharding, and with
    ``DifferentialCheckpointer.restore(model, path=destination)``. Runs in this process
    alone (no process group needed) and holds about ``block_rows`` rows of a table at a time,
    plus the saved chunk each step of the chain is read from.

    Args:
        checkpoint: a step directory of a differential checkpoint (``.../step_00000300``).
        destination: the directory to create (must not exist); it gets the DCP files and
            the step's ``trainer.json`` without the chain's own keys.
        block_rows: rows of a table per written chunk (>= 1).

    Raises:
        ValueError: ``block_rows`` is not a positive integer.
        FileExistsError: ``destination`` exists.
        ChainError: a step of the chain is missing or damaged; no destination is left.
    """
    if isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 1:
        raise ValueError(f"block_rows={block_rows!r} must be an integer >= 1")
    if os.path.lexists(destination):
        raise FileExistsError(f"export destination {destination} exists")
    chain = chain_dir.read_chain(checkpoint)
    check_files(chain)
    last = chain[-1]
    chain_dir.read_trainer(last.reader.path, last.step)  # the step is complete
    pieces = _export_pieces(chain)
    virtual = _virtual_items(export_virtual(chain))
    virtual.update(_table_steps(chain))  # items of their own, like a virtual table's
    dense, mappings = _read_dense(last, pieces, set(virtual))
    for fqn, (value, mapping) in virtual.items():
        dense[fqn], mappings[fqn] = value, mapping
    partial = os.path.abspath(destination) + _PARTIAL
    shutil.rmtree(partial, ignore_errors=True)  # what an export killed half-way left
    spill = os.path.abspath(destination) + _SPILL
    shutil.rmtree(spill, ignore_errors=True)
    try:
        planner = _ExportPlanner(chain, pieces, block_rows, mappings, spill)
        writer = GroupedFileWriter(partial, planner.file_group, _file_bytes(pieces, block_rows))
        try:
            dcp.save(dense, storage_writer=writer, planner=planner, no_dist=True)
        except CheckpointException as e:
            error = _chain_error_in(e)
            if error is None:
                raise
            raise error from None
        # The caller's state as it was saved (rank 0's manifest, checksummed): a plain
        # checkpoint's trainer.json.
        chain_dir.write_atomic(os.path.join(partial, "trainer.json"), json.dumps(last.manifests[0].trainer))
        os.rename(partial, destination)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    chain_dir.fsync_dir(os.path.dirname(os.path.abspath(destination)))


# ------------------------------------------------------------------ the tiered items ----
@dataclasses.dataclass(frozen=True)
class _StatePart:
    """One of FBGEMM's parts of a shard's optimizer state, as TorchRec's FUSED kernel keys
    and lays it out: ``<table>.momentum1`` (part 0), ``<table>.exp_avg_sq`` (part 1)."""

    key: str  # "<table>.momentum1" / "<table>.exp_avg_sq"
    start: int  # its first value in a row's state block
    width: int  # values per row: 1 (row-wise) or the shard's cols (per element)
    offsets: Offsets  # of the shard's part in its tensor
    size: Tuple[int, ...]  # of that tensor: 1 dimension (row-wise) or 2 (per element)

    @property
    def rowwise(self) -> bool:
        return self.width == 1


@dataclasses.dataclass
class _ExportPiece:
    """A saved shard: its record in each step of the chain (None where a step has none) and
    where its rows go in the export."""

    spec: PieceSpec
    records: List[Optional[PieceRecord]]
    param: str  # the table's weight in the model's state_dict: "<module>embedding_bags.<table>.weight"
    parts: List[_StatePart]  # its optimizer state's parts (none for SGD)
    source: Optional[int] = None  # a FUSED shard: the step whose dense state holds it (deltas on top)

    @property
    def weight_fqn(self) -> str:
        return f"model.{self.param}"

    def state_fqn(self, part: _StatePart) -> str:
        """The DCP key of one part of the optimizer state."""
        return f"optim.state.{self.param}.{part.key}"

    def state_fqns(self) -> List[str]:
        return [self.state_fqn(part) for part in self.parts]

    def mappings(self) -> Dict[str, Tuple[str, ...]]:
        """How DCP unflattens the piece's items into the state_dict of the old layout."""
        out = {self.weight_fqn: ("model", self.param)}
        for part in self.parts:
            out[self.state_fqn(part)] = ("optim", "state", self.param, part.key)
        return out


def _export_pieces(chain: List[ChainStep]) -> List[_ExportPiece]:
    """The chain's shards, checked: every step saved the layout of its full step, and each
    table's shards cover it."""
    full = chain[0]
    by_key: Dict[str, List[Optional[PieceRecord]]] = {}
    specs: Dict[str, PieceSpec] = {}
    for n, step in enumerate(chain):
        for record in step.pieces():
            if record.spec.virtual:  # by id: _virtual_items
                continue
            key = record.spec.key
            if n == 0 and key in specs:
                raise _layout_error(full, f"saves shard {key} twice")
            if specs.get(key, record.spec if n == 0 else None) != record.spec:
                raise _layout_error(step, f"saves shard {key}, which its chain's full step {full.step} does not")
            specs[key] = record.spec
            by_key.setdefault(key, [None] * len(chain))[n] = record
    tables: Dict[Tuple[str, str], List[PieceSpec]] = {}
    for spec in specs.values():
        tables.setdefault(table_of(spec), []).append(spec)
    fused = {table_of(r.spec) for records in by_key.values() for r in records if r is not None and r.fused}
    sources = dense_sources(chain, fused)
    out = []
    for table, table_specs in tables.items():
        _check_cover(full, table_specs)
        out += _table_pieces(table_specs, by_key, sources.get(table))
    return sorted(out, key=lambda p: p.spec.key)


def _layout_error(step: ChainStep, what: str) -> ChainError:
    return ChainError(f"checkpoint {step.reader.path} (step {step.step}) {what}", step.reader.path, step.step)


def _check_cover(full: ChainStep, specs: List[PieceSpec]) -> None:
    first = specs[0]
    area = 0
    for s in specs:
        inside = s.row_offset >= 0 and s.col_offset >= 0 and s.row_offset + s.rows <= s.table_rows \
            and s.col_offset + s.cols <= s.table_cols
        if (s.table_rows, s.table_cols, s.dtype, s.state_values, s.optimizer_name) != (
                first.table_rows, first.table_cols, first.dtype, first.state_values, first.optimizer_name) \
                or not inside:
            raise _layout_error(full, f"saves shards of table {first.module}{first.table} that do not fit together")
        area += s.rows * s.cols
    if area != first.table_rows * first.table_cols:
        raise _layout_error(
            full,
            f"saves {area} of the {first.table_rows * first.table_cols} values of table {first.module}{first.table}"
        )


def _table_pieces(specs: List[PieceSpec], records: Dict[str, List[Optional[PieceRecord]]],
                  source: Optional[int]) -> List[_ExportPiece]:
    """One table's shards with the keys and optimizer-state layout of TorchRec's FUSED kernel:
    each of FBGEMM's parts of the state (``PieceSpec.state_parts``) under TorchRec's name,
    a row-wise part stacked per column shard, a per-element part at the weights' offsets."""
    first = specs[0]
    param = first.weight_key
    widths = first.state_parts
    if len(widths) > len(STATE_KEYS):
        raise ValueError(f"table {first.module}{first.table}: an optimizer state of {len(widths)} parts has no "
                         f"TorchRec names beyond {STATE_KEYS}")
    rowwise: Dict[Offsets, ShardMetadata] = {}
    rowwise_size: Tuple[int, ...] = ()
    if 1 in widths:
        weights = ShardedTensorMetadata(
            shards_metadata=[
                ShardMetadata([s.row_offset, s.col_offset], [s.rows, s.cols], "rank:0/cpu") for s in specs
            ],
            size=torch.Size([first.table_rows, first.table_cols]),
            tensor_properties=ShardProperties(dtype=first.torch_dtype),
        )
        rowwise, meta = rowwise_metadata(weights)
        rowwise_size = tuple(meta.size)
    out = []
    for s in specs:
        offsets = (s.row_offset, s.col_offset)
        parts, start = [], 0
        for key, width in zip(STATE_KEYS, s.state_parts):
            if width == 1:
                part = _StatePart(f"{s.table}.{key}", start, 1, tuple(rowwise[offsets].shard_offsets), rowwise_size)
            else:
                part = _StatePart(f"{s.table}.{key}", start, width, offsets, (s.table_rows, s.table_cols))
            parts.append(part)
            start += width
        out.append(_ExportPiece(s, records[s.key], param, parts, source))
    return out


def _table_steps(chain: List[ChainStep]) -> Dict[str, Tuple[Any, Tuple]]:
    """The optimizer step count of each tiered Adam-family table (its bias correction,
    FBGEMM's ``iter``), as the chain's newest records of the table saved it: the item
    ``optim.state.<param>.<table>.step`` (a 0-d int64 tensor, as the tiered fused
    optimizer's state_dict has it) and its unflattening.

    Raises:
        ChainError: the table's shards were saved with different step counts.
    """
    saved: Dict[Tuple[str, str], Tuple[PieceSpec, Set[int], ChainStep]] = {}
    for step in reversed(chain):  # a table's newest records (a step may hold none of a linked table's)
        found: Dict[Tuple[str, str], Tuple[PieceSpec, Set[int], ChainStep]] = {}
        for record in step.pieces():
            table = table_of(record.spec)
            if record.fused or table in saved or record.spec.optimizer_name not in ADAM_FAMILY:
                continue
            found.setdefault(table, (record.spec, set(), step))[1].add(int(record.optimizer_step))
        saved.update(found)
    out: Dict[str, Tuple[Any, Tuple]] = {}
    for spec, steps, step in saved.values():
        if len(steps) > 1:
            raise _layout_error(step, f"saves shards of table {spec.module}{spec.table} with different optimizer "
                                      f"step counts {sorted(steps)}")
        key = f"{spec.table}.{STEP_KEY}"
        out[f"optim.state.{spec.weight_key}.{key}"] = (torch.tensor(steps.pop(), dtype=torch.int64),
                                                       ("optim", "state", spec.weight_key, key))
    return out


def _item(fqn: str, size: Tuple[int, ...], offsets: Offsets, sizes: Tuple[int, ...], dtype: torch.dtype) -> WriteItem:
    return WriteItem(
        index=MetadataIndex(fqn, torch.Size(offsets)),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes)),
            properties=TensorProperties(dtype=dtype),
            size=torch.Size(size),
        ),
    )


# ----------------------------------------------------------------------- the blocks ----
class _BlockSource:
    """Builds blocks of a shard's rows from the chain, keeping the chunk each step is read
    from until a block past it is asked for."""

    def __init__(self, chain: List[ChainStep], spill_dir: str) -> None:
        self.chain, self._spill_dir = chain, spill_dir
        self._spilled: Dict[int, _SpilledRows] = {}  # step index -> the current shard's rows in id order
        self._cached: Dict[int, Tuple[str, torch.Tensor, torch.Tensor]] = {}  # step index -> (key, ids, rows)
        self._ends: Dict[Tuple[str, int], List[int]] = {}  # (shard, step index) -> its chunks' row_hi
        self._piece: Optional[str] = None  # the shard whose chunks are cached

    def rows(self, piece: _ExportPiece, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` (shard-local) of a shard in the store's row layout."""
        spec = piece.spec
        if self._piece != spec.key:
            self._cached.clear()
            self._drop_spilled()
            self._piece = spec.key
        full = piece.records[0]
        if piece.source is not None:
            out = self._dense_rows(piece, lo, hi)
        elif full is None or not full.complete:
            out = init_rows(spec, torch.arange(lo, hi))
        else:
            out = torch.empty(hi - lo, spec.row_width, dtype=spec.torch_dtype)
        for n, record in enumerate(piece.records):
            if record is None or (piece.source is not None and n <= piece.source):
                continue
            chunks = record.chunks
            if not _disjoint(chunks):  # saved in storage order
                spilled = self._spilled.get(n)
                if spilled is None:
                    spilled = self._spilled[n] = _SpilledRows(self._spill_dir, self.chain[n], record)
                spilled.overlay(out, lo, hi)
                continue
            ends = self._ends.setdefault((spec.key, n), [c.row_hi for c in chunks])
            first = bisect.bisect_right(ends, lo)
            for chunk in chunks[first:]:
                if chunk.row_lo >= hi:
                    break
                ids, rows = self._chunk(n, record, chunk)
                keep = (ids >= lo) & (ids < hi)
                out[ids[keep] - lo] = rows[keep]
        return out

    def _drop_spilled(self) -> None:
        for spilled in self._spilled.values():
            spilled.close()
        self._spilled.clear()

    def _dense_rows(self, piece: _ExportPiece, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` of a FUSED shard as its dense-state step saved them (a row-wise
        state at the shard's own place in the stacked tensor)."""
        rowwise = [part for part in piece.parts if part.rowwise]
        state_row = (rowwise[0].offsets[0] if rowwise else piece.spec.row_offset) + lo
        return join_rows(*read_dense_rows(self.chain[piece.source], piece.spec, lo, hi, state_row))

    def _chunk(self, n: int, record: PieceRecord, chunk: ChunkSpec) -> Tuple[torch.Tensor, torch.Tensor]:
        cached = self._cached.get(n)
        if cached is None or cached[0] != chunk.key:
            self._cached.pop(n, None)  # frees the previous chunk before the next is read
            ids, rows = read_chunk(self.chain[n], record, chunk)
            cached = (chunk.key, ids, rows)
            self._cached[n] = cached
        return cached[1], cached[2]


def _disjoint(chunks: List[ChunkSpec]) -> bool:
    """Whether the chunks' row ranges ascend without overlapping (saved in id order)."""
    return all(a.row_hi <= b.row_lo for a, b in zip(chunks, chunks[1:]))


class _SpilledRows:
    """One step's saved rows of a shard, in id order, in a file-backed array."""

    def __init__(self, directory: str, step: ChainStep, record: PieceRecord) -> None:
        spec = record.spec
        os.makedirs(directory, exist_ok=True)
        fd, self.path = tempfile.mkstemp(suffix=".rows", dir=directory)
        os.close(fd)
        row_bytes = spec.row_width * spec.torch_dtype.itemsize
        mapped = np.memmap(self.path, dtype=np.uint8, mode="w+", shape=(max(1, spec.rows * row_bytes),))
        self.rows = torch.from_numpy(mapped)[: spec.rows * row_bytes].view(spec.torch_dtype).view(spec.rows, -1)
        self.held = torch.zeros(spec.rows, dtype=torch.bool)
        for chunk in record.chunks:
            ids, rows = read_chunk(step, record, chunk)
            self.rows[ids] = rows
            self.held[ids] = True

    def overlay(self, out: torch.Tensor, lo: int, hi: int) -> None:
        """Writes over ``out`` (rows ``[lo, hi)``) the rows the step saved."""
        held = self.held[lo:hi]
        out[held] = self.rows[lo:hi][held]

    def close(self) -> None:
        self.rows = self.held = None
        os.unlink(self.path)


@dataclasses.dataclass(frozen=True)
class _Block:
    piece: _ExportPiece
    lo: int
    hi: int
    part: Optional[int]  # the block's item of this part of the optimizer state (None: the weights')


class _ExportPlanner(DefaultSavePlanner):
    """DCP's default planner for the dense items (read from the last step, flat, keyed as
    it saved them) plus one item per block of each shard's weights and optimizer state."""

    def __init__(self, chain: List[ChainStep], pieces: List[_ExportPiece], block_rows: int,
                 mappings: Dict[str, Tuple], spill_dir: str) -> None:
        super().__init__()
        self._pieces, self._block_rows, self._dense_mappings = pieces, block_rows, mappings
        self._source = _BlockSource(chain, spill_dir)
        self._blocks: Dict[Tuple[str, Offsets], _Block] = {}
        self._last: Optional[Tuple[_Block, torch.Tensor]] = None

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator: bool = False) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        # The dense items are flat already: keep the unflattening the last step recorded.
        self.mappings = {k: self._dense_mappings.get(k, v) for k, v in self.mappings.items()}

    def create_local_plan(self):
        plan = super().create_local_plan()
        items = list(plan.items)
        mappings = dict(plan.planner_data)
        for p in self._pieces:
            s = p.spec
            for lo in range(0, s.rows, self._block_rows):
                hi = min(s.rows, lo + self._block_rows)
                offsets = (s.row_offset + lo, s.col_offset)
                items.append(self._add(_Block(p, lo, hi, None), p.weight_fqn, (s.table_rows, s.table_cols),
                                       offsets, (hi - lo, s.cols), s.torch_dtype))
                for n, part in enumerate(p.parts):
                    if part.rowwise:
                        state_offsets, sizes = (part.offsets[0] + lo,), (hi - lo,)
                    else:
                        state_offsets, sizes = (part.offsets[0] + lo, part.offsets[1]), (hi - lo, s.cols)
                    items.append(self._add(_Block(p, lo, hi, n), p.state_fqn(part), part.size,
                                           state_offsets, sizes, torch.float32))
            mappings.update(p.mappings())
        self.plan = dataclasses.replace(plan, items=items, planner_data=mappings)
        return self.plan

    def _add(self, block: _Block, fqn: str, size, offsets: Offsets, sizes, dtype: torch.dtype) -> WriteItem:
        self._blocks[(fqn, tuple(offsets))] = block
        return _item(fqn, size, offsets, sizes, dtype)

    def _block_of(self, item: WriteItem) -> Optional[_Block]:
        if item.type != WriteItemType.SHARD:
            return None  # a dense item (whole tensors and bytes)
        return self._blocks.get((item.index.fqn, tuple(item.index.offset)))

    def file_group(self, item: WriteItem) -> Optional[Tuple[str, int]]:
        """(shard, first row) of a block's item, kept in one file; None for a dense item."""
        block = self._block_of(item)
        return None if block is None else (block.piece.spec.key, block.lo)

    def resolve_data(self, write_item: WriteItem):
        block = self._block_of(write_item)
        if block is None:
            return super().resolve_data(write_item)
        key = (block.piece.spec.key, block.lo)
        if self._last is None or (self._last[0].piece.spec.key, self._last[0].lo) != key:
            self._last = None
            self._last = (block, self._source.rows(block.piece, block.lo, block.hi))
        weights, state = split_rows(block.piece.spec, self._last[1])
        if block.part is None:
            return weights.contiguous()
        part = block.piece.parts[block.part]
        values = state[:, part.start:part.start + part.width]
        return values.reshape(-1) if part.rowwise else values.contiguous()


def _file_bytes(pieces: List[_ExportPiece], block_rows: int) -> int:
    widest = max((p.spec.cols * p.spec.element_bytes + p.spec.state_values * 4 for p in pieces), default=0)
    return block_rows * widest


# ---------------------------------------------------------------------- dense items ----
def _virtual_items(tables: Dict[str, Tuple[PieceSpec, torch.Tensor, torch.Tensor]]) -> Dict[str, Tuple[Any, Tuple]]:
    """A virtual table's export items (fqn -> (tensor, its unflattening)): its live ids
    (``.weight_id``, global, ascending), their weights (``.weight``, ``[n, cols]``) and
    optimizer state (as a FUSED table's, by live id: each of FBGEMM's parts under TorchRec's
    name, ``<table>.momentum1`` and ``<table>.exp_avg_sq``)."""
    out: Dict[str, Tuple[Any, Tuple]] = {}
    for spec, ids, rows in tables.values():
        param = spec.weight_key
        weights, state = split_rows(spec, rows)
        out[f"model.{param}"] = (weights.contiguous(), ("model", param))
        out[f"model.{param}_id"] = (ids, ("model", f"{param}_id"))
        start = 0
        for name, width in zip(STATE_KEYS, spec.state_parts):
            values = state[:, start:start + width]
            key = f"{spec.table}.{name}"
            out[f"optim.state.{param}.{key}"] = (values.reshape(-1) if width == 1 else values.contiguous(),
                                                 ("optim", "state", param, key))
            start += width
    return out


def _read_dense(last: ChainStep, pieces: List[_ExportPiece],
                virtual: Set[str]) -> Tuple[Dict[str, Any], Dict[str, Tuple]]:
    """Every item of the last step but its row chunks, virtual tables' live lists and the
    tiered tables' placeholders: (flat values, their unflattening as that step recorded it)."""
    metadata = last.reader.metadata
    skip = {f"{c.key}{end}" for m in last.manifests for r in m.pieces for c in r.chunks for end in ("", "/ids")}
    skip |= {c.key for m in last.manifests for r in m.pieces if r.virtual is not None for c in r.virtual.live}
    skip |= virtual
    placeholders = {p.weight_fqn for p in pieces if p.source is None}
    for fqn in sorted(placeholders):
        if fqn not in metadata.state_dict_metadata:
            where = os.path.join(last.reader.path, ".metadata")
            raise ChainError(f"checkpoint {where} (step {last.step}) has no placeholder {fqn!r} of a tiered table",
                             where, last.step)
    exported = {p.weight_fqn for p in pieces} | {fqn for p in pieces for fqn in p.state_fqns()}
    dense: Dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if fqn in skip or fqn in exported:
            continue
        tensor = isinstance(md, TensorStorageMetadata)
        dense[fqn] = torch.empty(md.size, dtype=md.properties.dtype) if tensor else _UNREAD
    # Flat and unflattened as it is, so that DCP loads the bytes items into this very dict.
    planner = DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False)
    try:
        dcp.load(dense, storage_reader=FileSystemReader(last.reader.path), planner=planner, no_dist=True)
        unread = sorted(k for k, v in dense.items() if v is _UNREAD)
        if unread:
            raise ValueError(f"items {unread} were not read")
    except Exception as e:  # a damaged file fails inside torch.load with any error type
        raise ChainError(f"checkpoint {last.reader.path} (step {last.step}): its dense state cannot be read: "
                         f"{type(e).__name__}: {e}", last.reader.path, last.step) from None
    planner_data = metadata.planner_data or {}
    return dense, {k: tuple(planner_data[k]) for k in dense if k in planner_data}


# -------------------------------------------------------------------------- helpers ----
def _chain_error_in(e: CheckpointException) -> Optional[ChainError]:
    """The ChainError a rank failed with inside DCP (DCP wraps every rank's failure)."""
    for failure in e.failures.values():
        exc = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(exc, ChainError):
            return exc
    return None
