"""Tiered rows through torch.distributed.checkpoint, one chunk in memory at a time.

Saving: ``RowChunkPlanner`` (a DCP ``DefaultSavePlanner``) adds one DCP tensor per chunk of
rows (and one of their ids) to the plan and reads the rows from the tiers only when DCP's
writer asks for them; ``RowChunkWriter`` (a DCP ``FileSystemWriter``) writes the chunks to
files of bounded size, so no file's tensors pile up in memory. Reading: ``StepReader`` loads
chosen tensors of one checkpoint step without a collective.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import zlib
from typing import Callable, Dict, List, Optional, Tuple

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
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.types import ChainError, ChunkSpec
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["PlannedChunk", "RowChunkPlanner", "RowChunkWriter", "StepReader", "plan_chunks", "ids_dtype"]

_SCAN_ROWS = 1 << 20  # rows whose ids are listed at a time while planning chunks
IdSelector = Callable[[int, int], torch.Tensor]  # (start, stop) -> shard-local ids, ascending


def ids_dtype(rows: int) -> torch.dtype:
    """The dtype of a shard's saved row ids (``PieceSpec.id_bytes``)."""
    return torch.int32 if rows < 2**31 else torch.int64


@dataclasses.dataclass
class PlannedChunk:
    """Rows ``select(row_lo, row_hi)`` of a local piece, to be saved as DCP tensor ``key``."""

    piece: LocalPiece
    key: str
    row_lo: int
    row_hi: int
    count: int
    select: IdSelector
    crc32: int = 0

    @property
    def dense(self) -> bool:
        return self.count == self.row_hi - self.row_lo

    @property
    def nbytes(self) -> int:
        """Bytes of the chunk's rows and ids."""
        spec = self.piece.spec
        return self.count * (spec.row_bytes + (0 if self.dense else spec.id_bytes))

    def spec(self) -> ChunkSpec:
        return ChunkSpec(self.key, self.row_lo, self.row_hi, self.count, self.crc32)


def plan_chunks(piece: LocalPiece, select: IdSelector, max_rows: int, prefix: str) -> List[PlannedChunk]:
    """Splits the rows ``select`` lists of a piece into chunks of at most ``max_rows``,
    each a row range ``[row_lo, row_hi)`` whose listed rows are exactly the chunk's."""
    chunks: List[PlannedChunk] = []
    lo, count, last = -1, 0, -1

    def emit() -> None:
        key = f"{piece.spec.key}/{prefix}{len(chunks)}"
        chunks.append(PlannedChunk(piece, key, lo, last + 1, count, select))

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
                emit()
                count = 0
    if count:
        emit()
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

    def __init__(self, chunks: List[PlannedChunk]) -> None:
        super().__init__()
        self.chunks = chunks
        self._rows = {c.key: c for c in chunks}
        self._ids = {f"{c.key}/ids": c for c in chunks if not c.dense}
        self._last: Optional[Tuple[str, torch.Tensor]] = None  # (chunk key, its ids)

    def create_local_plan(self):
        plan = super().create_local_plan()
        items = list(plan.items)
        for c in self.chunks:
            spec = c.piece.spec
            if not c.dense:
                items.append(_write_item(f"{c.key}/ids", (c.count,), ids_dtype(spec.rows)))
            items.append(_write_item(c.key, (c.count, spec.row_width), spec.torch_dtype))
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def chunk_keys(self) -> Dict[str, str]:
        """DCP key -> its chunk's rows key, for every tensor this planner adds."""
        return {**{k: k for k in self._rows}, **{k: c.key for k, c in self._ids.items()}}

    def _chunk_ids(self, c: PlannedChunk) -> torch.Tensor:
        if self._last is not None and self._last[0] == c.key:
            return self._last[1]
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
        if fqn in self._ids:
            return self._chunk_ids(self._ids[fqn]).to(ids_dtype(self._ids[fqn].piece.spec.rows))
        c = self._rows.get(fqn)
        if c is None:
            return super().resolve_data(write_item)
        ids = self._chunk_ids(c)
        rows = c.piece.emb.store_rows(c.piece.t, ids)
        crc = 0 if c.dense else zlib.crc32(ids.to(ids_dtype(c.piece.spec.rows)).numpy().view("uint8"))
        c.crc32 = zlib.crc32(rows.view(torch.uint8).numpy(), crc)
        self._last = None
        return rows


class RowChunkWriter(FileSystemWriter):
    """DCP's file writer, single-threaded, with the state_dict in one file and the row
    chunks in files of at most ``file_bytes`` each (DCP's writer keeps a file's tensors
    until it is closed). Fault point ``checkpoint.write``: this rank's files are written."""

    def __init__(self, path: str, chunk_keys: Dict[str, str], file_bytes: int) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._chunk_keys = chunk_keys
        self._file_bytes = file_bytes
        self.state_files: List[str] = []  # files of the state_dict's tensors (no row chunks)

    def write_data(self, plan, planner):
        prefix = plan.storage_data.prefix
        buckets: List[List[WriteItem]] = [[]]
        chunk_files: List[List[WriteItem]] = []
        size = 0
        by_chunk: Dict[str, List[WriteItem]] = {}
        for item in plan.items:
            key = self._chunk_keys.get(item.index.fqn)
            if key is None:
                buckets[0].append(item)
            else:
                by_chunk.setdefault(key, []).append(item)
        for items in by_chunk.values():
            items.sort(key=lambda i: not i.index.fqn.endswith("/ids"))  # ids before rows
            nbytes = sum(_item_bytes(i) for i in items)
            if not chunk_files or size + nbytes > self._file_bytes:
                chunk_files.append([])
                size = 0
            chunk_files[-1].extend(items)
            size += nbytes
        file_queue: queue.Queue = queue.Queue()
        for n, bucket in enumerate(b for b in buckets + chunk_files if b):
            name = f"{prefix}{n}{DEFAULT_SUFFIX}"
            if bucket is buckets[0]:
                self.state_files.append(name)
            file_queue.put((self.fs.concat_path(self.path, name), name, bucket))
        future = self._write_data(planner, file_queue)
        future.wait()
        fault_point("checkpoint.write")
        return future


def _item_bytes(item: WriteItem) -> int:
    n = 1
    for s in item.tensor_data.size:
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
        info = self.metadata.storage_data.get(MetadataIndex(key, torch.Size([0] * len(self._size(key)))))
        return os.path.join(self.path, info.relative_path) if info is not None else self.path

    def _size(self, key: str) -> torch.Size:
        md = self.metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise ChainError(f"checkpoint {self.path} (step {self.step}) has no tensor {key!r}", self.path, self.step)
        return md.size

    def read(self, keys: List[str]) -> Dict[str, torch.Tensor]:
        """The tensors ``keys`` (whole), loaded with DCP."""
        out = {}
        for key in keys:
            md = self.metadata.state_dict_metadata.get(key)
            if not isinstance(md, TensorStorageMetadata):
                message = f"checkpoint {self.path} (step {self.step}) has no tensor {key!r}"
                raise ChainError(message, self.path, self.step)
            out[key] = torch.empty(md.size, dtype=md.properties.dtype)
        try:
            dcp.load(out, storage_reader=self._reader, planner=DefaultLoadPlanner(), no_dist=True)
        except Exception as e:  # a damaged file fails inside torch.load with any error type
            where = self.file_of(keys[0])
            raise ChainError(
                f"checkpoint file {where} (step {self.step}) cannot be read: {type(e).__name__}: {e}", where, self.step
            ) from None
        return out
