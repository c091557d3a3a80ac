"""Tiered rows through torch.distributed.checkpoint, one chunk in memory at a time.

Saving: ``RowChunkPlanner`` (a DCP ``DefaultSavePlanner``) adds one DCP tensor per chunk of
rows (and one of their ids) to the plan and reads the rows from the tiers only when DCP's
writer asks for them; ``RowChunkWriter`` (a ``GroupedFileWriter``, DCP's ``FileSystemWriter``
with files of bounded size) writes them, so no file's tensors pile up in memory. Reading:
``StepReader`` loads chosen tensors of one checkpoint step, or blocks of them, without a
collective.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import zlib
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from torchrec_mtrains.checkpoint.quantize import quantize_rows
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.types import ChainError, ChunkSpec, PieceSpec
from torchrec_mtrains.storage.fsync import fsync_path
from torchrec_mtrains.testing.faults import fault_point

__all__ = [
    "GroupedFileWriter", "PlannedChunk", "RowChunkPlanner", "RowChunkWriter", "StepReader", "chunk_crc32",
    "plan_chunks",
]

_SCAN_ROWS = 1 << 20  # rows whose ids are listed at a time while planning chunks
_ORDER_ROWS = 1 << 23  # selected rows put in storage order at a time (a window: ~50 B a row while ordered)
IdSelector = Callable[[int, int], torch.Tensor]  # (start, stop) -> shard-local ids, ascending
StorageOrder = Callable[[torch.Tensor], Optional[torch.Tensor]]  # ids -> fastest permutation, or None


def chunk_crc32(spec: PieceSpec, ids: Optional[torch.Tensor], rows: torch.Tensor) -> int:
    """The CRC-32 a chunk's manifest entry records: of its ids as saved (none for a dense
    chunk), then of its rows."""
    crc = 0 if ids is None else zlib.crc32(ids.to(spec.ids_dtype).numpy().view("uint8"))
    return zlib.crc32(rows.view(torch.uint8).numpy(), crc)


class OrderedWindow:
    """The ``count`` rows ``select`` lists in ``[start, stop)``, put in the tier's storage
    order (``order``) when the first of their chunks is written: chunk ``k`` is the k-th
    ``max_rows`` of that order, its ids ascending. The ordered ids are kept until every
    chunk's rows are written (``done``), then dropped: a save holds one window's ids."""

    def __init__(self, select: IdSelector, start: int, stop: int, count: int, order: StorageOrder,
                 max_rows: int, chunks: int) -> None:
        self.select, self.start, self.stop, self.count = select, start, stop, count
        self._order, self._max_rows, self._left = order, max_rows, chunks
        self._ordered: Optional[torch.Tensor] = None

    def ids(self, k: int, table: str) -> torch.Tensor:
        if self._ordered is None:
            ids = self.select(self.start, self.stop)
            if ids.numel() != self.count:
                raise RuntimeError(f"table {table}: rows [{self.start}, {self.stop}) changed while a checkpoint "
                                   f"saved them ({ids.numel()} listed, {self.count} planned)")
            perm = self._order(ids)
            self._ordered = ids if perm is None else ids[perm]
        at = k * self._max_rows
        return torch.sort(self._ordered[at : at + self._max_rows]).values

    def done(self) -> None:
        """A chunk's rows were written."""
        self._left -= 1
        if self._left <= 0:
            self._ordered = None


@dataclasses.dataclass
class PlannedChunk:
    """Rows ``select(row_lo, row_hi)`` of a local piece, to be saved as DCP tensor ``key``;
    or, with a ``window``, its ``index``-th chunk in storage order (saved with its ids; the
    row range is the window's until the ids are known, then theirs)."""

    piece: LocalPiece
    key: str
    row_lo: int
    row_hi: int
    count: int
    select: IdSelector
    crc32: int = 0
    quantize: str = ""  # the rows' lossy encoding (quantize.py); "": as the tier stores them
    window: Optional[OrderedWindow] = None
    index: int = 0

    @property
    def dense(self) -> bool:
        return self.count == self.row_hi - self.row_lo

    @property
    def with_ids(self) -> bool:
        """Whether the step holds the chunk's ids (restore ignores them where ``dense``)."""
        return self.window is not None or not self.dense

    @property
    def nbytes(self) -> int:
        """Bytes of the chunk's rows and ids."""
        return self.piece.spec.chunk_bytes(self.count, not self.with_ids, self.quantize)

    def spec(self) -> ChunkSpec:
        return ChunkSpec(self.key, self.row_lo, self.row_hi, self.count, self.crc32, self.quantize)


def plan_chunks(piece: LocalPiece, select: IdSelector, max_rows: int, prefix: str,
                quantize: str = "", order: Optional[StorageOrder] = None) -> List[PlannedChunk]:
    """Splits the rows ``select`` lists of a piece into chunks of at most ``max_rows``
    (``quantize``: their lossy encoding, ``quantize.py``).

    Without a storage order (``order`` None, or it returns None: DRAM and SCM rows, whose
    ids are their places) each chunk is a row range ``[row_lo, row_hi)`` whose listed rows
    are exactly the chunk's. With one (the block store's log), the listed rows are put in
    that order a window of about ``_ORDER_ROWS`` at a time, and each window cut into
    chunks: reading a chunk reads a stretch of the log sequentially. Such a chunk holds its
    ids (ascending); chunks' row ranges overlap. A table with more rows than a window is
    read in as many sequential passes over its log.
    """
    if order is not None and order(torch.empty(0, dtype=torch.int64)) is None:
        order = None  # the tier has no faster order than the ids'
    chunks: List[PlannedChunk] = []

    def key() -> str:
        return f"{piece.spec.key}/{prefix}{len(chunks)}"

    if order is not None:
        def add_window(start: int, stop: int, count: int) -> None:
            n = -(-count // max_rows)
            window = OrderedWindow(select, start, stop, count, order, max_rows, n)
            for k in range(n):
                chunks.append(PlannedChunk(piece, key(), start, stop, min(max_rows, count - k * max_rows), select,
                                           quantize=quantize, window=window, index=k))

        first, count = 0, 0
        for start in range(0, piece.spec.rows, _SCAN_ROWS):
            n = select(start, min(piece.spec.rows, start + _SCAN_ROWS)).numel()
            if count and count + n > _ORDER_ROWS:
                add_window(first, start, count)
                first, count = start, 0
            count += n
        if count:
            add_window(first, piece.spec.rows, count)
        return chunks

    lo, count, last = -1, 0, -1
    for start in range(0, piece.spec.rows, _SCAN_ROWS):
        ids = select(start, min(piece.spec.rows, start + _SCAN_ROWS))
        pos = 0
        while pos < ids.numel():
            if count == 0:
                lo = int(ids[pos])
            take = min(max_rows - count, ids.numel() - pos)
            pos += take
            count += take
            last = int(ids[pos - 1])
            if count == max_rows:
                chunks.append(PlannedChunk(piece, key(), lo, last + 1, count, select, quantize=quantize))
                count = 0
    if count:
        chunks.append(PlannedChunk(piece, key(), lo, last + 1, count, select, quantize=quantize))
    return chunks


def _write_item(fqn: str, shape: Tuple[int, ...], dtype: torch.dtype) -> WriteItem:
    size = torch.Size(shape)
    offsets = torch.Size([0] * len(shape))
    return WriteItem(
        index=MetadataIndex(fqn, offsets),
        type=WriteItemType.TENSOR,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=offsets, sizes=size),
            properties=TensorProperties(dtype=dtype),
            size=size,
        ),
    )


class RowChunkPlanner(DefaultSavePlanner):
    """DCP's default planner for the state_dict, plus the row chunks, read on demand."""

    def __init__(self, chunks: List[PlannedChunk], extra: Optional[Dict[str, torch.Tensor]] = None) -> None:
        super().__init__()
        self.chunks = chunks
        self._extra = dict(extra or {})  # more tensors, each in the files of the chunks
        self._rows = {c.key: c for c in chunks}
        self._ids = {f"{c.key}/ids": c for c in chunks if c.with_ids}
        self._last: Optional[Tuple[str, torch.Tensor]] = None  # (chunk key, its ids)

    def create_local_plan(self):
        plan = super().create_local_plan()
        items = list(plan.items)
        for c in self.chunks:
            spec = c.piece.spec
            if c.with_ids:
                items.append(_write_item(f"{c.key}/ids", (c.count,), spec.ids_dtype))
            if c.quantize:
                items.append(_write_item(c.key, (c.count, spec.quantized_row_bytes(c.quantize)), torch.uint8))
            else:
                items.append(_write_item(c.key, (c.count, spec.row_width), spec.torch_dtype))
        for key, tensor in self._extra.items():
            items.append(_write_item(key, tuple(tensor.shape), tensor.dtype))
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def chunk_keys(self) -> Dict[str, str]:
        """DCP key -> its chunk's rows key, for every tensor this planner adds."""
        return {**{k: k for k in self._rows}, **{k: c.key for k, c in self._ids.items()},
                **{k: k for k in self._extra}}

    def _chunk_ids(self, c: PlannedChunk) -> torch.Tensor:
        if self._last is not None and self._last[0] == c.key:
            return self._last[1]
        if c.window is not None:
            ids = c.window.ids(c.index, c.piece.spec.table)
            c.row_lo, c.row_hi = int(ids[0]), int(ids[-1]) + 1  # what the manifest records
            self._last = (c.key, ids)
            return ids
        ids = c.select(c.row_lo, c.row_hi)
        if ids.numel() != c.count:
            raise RuntimeError(
                f"table {c.piece.spec.table}: rows [{c.row_lo}, {c.row_hi}) changed while a checkpoint "
                f"saved them ({ids.numel()} listed, {c.count} planned)"
            )
        self._last = (c.key, ids)
        return ids

    def resolve_data(self, write_item: WriteItem):
        fqn = write_item.index.fqn
        if fqn in self._extra:
            return self._extra[fqn]
        if fqn in self._ids:
            return self._chunk_ids(self._ids[fqn]).to(self._ids[fqn].piece.spec.ids_dtype)
        c = self._rows.get(fqn)
        if c is None:
            return super().resolve_data(write_item)
        ids = self._chunk_ids(c)
        rows = c.piece.emb.store_rows(c.piece.t, ids)
        if c.quantize:
            rows = quantize_rows(c.piece.spec, rows, c.quantize)
        c.crc32 = chunk_crc32(c.piece.spec, None if c.dense else ids, rows)  # as restore checks it
        self._last = None
        if c.window is not None:
            c.window.done()
        return rows


class GroupedFileWriter(FileSystemWriter):
    """DCP's file writer, single-threaded: the items ``group_of`` gives no group (the
    state_dict's) in one file, then each group's items together, in files of at most
    ``file_bytes`` (a larger group gets a file of its own). DCP's writer keeps a file's
    tensors until the file is closed, so this bounds what a save holds at a time."""

    def __init__(self, path: str, group_of: Callable[[WriteItem], Optional[Hashable]], file_bytes: int) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._group_of, self._file_bytes = group_of, file_bytes
        self.state_files: List[str] = []  # files of the ungrouped items

    def write_data(self, plan, planner):
        ungrouped: List[WriteItem] = []
        groups: Dict[Hashable, List[WriteItem]] = {}
        for item in plan.items:
            key = self._group_of(item)
            if key is None:
                ungrouped.append(item)
            else:
                groups.setdefault(key, []).append(item)
        files: List[List[WriteItem]] = []
        size = 0
        for items in groups.values():
            nbytes = sum(_item_bytes(i) for i in items)
            if not files or size + nbytes > self._file_bytes:
                files.append([])
                size = 0
            files[-1].extend(items)
            size += nbytes
        file_queue: queue.Queue = queue.Queue()
        names: List[str] = []
        for n, items in enumerate(f for f in [ungrouped] + files if f):
            name = f"{plan.storage_data.prefix}{n}{DEFAULT_SUFFIX}"
            names.append(name)
            if items is ungrouped:
                self.state_files.append(name)
            file_queue.put((self.fs.concat_path(self.path, name), name, items))
        future = self._write_data(planner, file_queue)
        future.wait()
        # DCP fsyncs each file before closing its buffered stream: what was still buffered
        # then (a file's tail) is synced only here, once the files are closed.
        for name in names:
            _fsync(os.path.join(self.path, name))
        return future

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        # As in write_data: DCP's fsync of .metadata runs before its bytes leave the
        # stream's buffer. The directory's entries (the renamed .metadata) go with it.
        _fsync(os.path.join(self.path, ".metadata"))
        _fsync(str(self.path))


class RowChunkWriter(GroupedFileWriter):
    """The writer of a save: each chunk's ids and rows together. Fault point
    ``checkpoint.write``: this rank's files are written."""

    def __init__(self, path: str, chunk_keys: Dict[str, str], file_bytes: int) -> None:
        super().__init__(path, lambda item: chunk_keys.get(item.index.fqn), file_bytes)

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        fault_point("checkpoint.write")
        return future


_fsync = fsync_path


def _item_bytes(item: WriteItem) -> int:
    n = 1
    for s in item.tensor_data.chunk.sizes:
        n *= s
    return n * torch.empty(0, dtype=item.tensor_data.properties.dtype).element_size()


class _CachedReader(FileSystemReader):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._metadata: Optional[Metadata] = None

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if self._metadata is None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata


class _BlockPlanner(DefaultLoadPlanner):
    """Loads blocks ``(offsets, tensor)`` of saved tensors into the given tensors, through
    DCP's resharding reads (any saved chunks that overlap a block)."""

    def __init__(self, blocks: Dict[str, Tuple[List[int], torch.Tensor]]) -> None:
        super().__init__()
        self.blocks = blocks

    def create_local_plan(self) -> LoadPlan:
        items = []
        for key, (offsets, tensor) in self.blocks.items():
            md = self.metadata.state_dict_metadata[key]
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=tensor.size())
            items += create_read_items_for_chunk_list(key, md, [chunk])
        return LoadPlan(items)

    def resolve_tensor(self, read_item):
        tensor = self.blocks[read_item.dest_index.fqn][1]
        for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            tensor = tensor.narrow(dim, start, length)
        return tensor


class StepReader:
    """Reads tensors of one checkpoint step (a DCP directory) by key, on this rank alone."""

    def __init__(self, path: str, step: Optional[int]) -> None:
        self.path, self.step = path, step
        self._reader = _CachedReader(path)
        try:
            self.metadata = self._reader.read_metadata()
        except Exception as e:  # DCP raises whatever unpickling a damaged file raises
            where = os.path.join(path, ".metadata")
            message = f"checkpoint {where} (step {step}) cannot be read: {type(e).__name__}: {e}"
            raise ChainError(message, where, step) from None

    def file_of(self, key: str) -> str:
        """The file holding tensor ``key`` (its first chunk), or the step's directory."""
        info = self.metadata.storage_data.get(MetadataIndex(key, torch.Size([0] * len(self._tensor(key).size))))
        return os.path.join(self.path, info.relative_path) if info is not None else self.path

    def _tensor(self, key: str) -> TensorStorageMetadata:
        md = self.metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            message = f"checkpoint {self.path} (step {self.step}) has no tensor {key!r}"
            raise ChainError(message, self.path, self.step)
        return md

    def read(self, keys: List[str]) -> Dict[str, torch.Tensor]:
        """The tensors ``keys`` (whole), loaded with DCP."""
        out = {}
        for key in keys:
            md = self._tensor(key)
            out[key] = torch.empty(md.size, dtype=md.properties.dtype)
        self._load(out, DefaultLoadPlanner(), keys[0])
        return out

    def read_block(self, key: str, offsets: List[int], shape: Tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The block ``offsets`` + ``shape`` of the saved tensor ``key``."""
        self._tensor(key)
        out = torch.empty(shape, dtype=dtype)
        self._load({}, _BlockPlanner({key: (list(offsets), out)}), key)
        return out

    def _load(self, state: Dict[str, torch.Tensor], planner: DefaultLoadPlanner, key: str) -> None:
        try:
            dcp.load(state, storage_reader=self._reader, planner=planner, no_dist=True)
        except Exception as e:  # a damaged file fails inside torch.load with any error type
            where = self.file_of(key)
            message = f"checkpoint file {where} (step {self.step}) cannot be read: {type(e).__name__}: {e}"
            raise ChainError(message, where, self.step) from None
