"""Restores tiered rows from a chain: the full step, then each delta in order.

A target shard takes rows from every saved shard of its table that overlaps it, whatever
the world size, sharding type or tier it was saved from: rows are matched by their global
row id and columns. A saved full step that lists only the written rows of a shard implies
the initial values of the others; those are rewritten unless the target starts from the
very same values. Every chunk is read and checked (count, CRC-32) before any row is
written, so a damaged chain restores nothing.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from torchrec_mtrains.checkpoint.quantize import dequantize_rows
from torchrec_mtrains.checkpoint.row_io import chunk_crc32
from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.tiered_parts import LocalPiece
from torchrec_mtrains.checkpoint.store_links import read_linked_rows, read_map_chunk
from torchrec_mtrains.checkpoint.types import ChainError, ChunkSpec, PieceRecord, PieceSpec, Table, table_of
from torchrec_mtrains.storage.lazy_init import lazy_init_rows

__all__ = ["apply_rows", "chain_specs", "check_rows", "check_same_optimizer", "init_rows", "join_rows", "read_chunk",
           "restore_optimizer_steps", "split_rows"]


def chain_specs(chain: List[ChainStep], fused: Optional[bool] = None) -> List[PieceSpec]:
    """Every shard the chain's last step saved (``fused``: only the FUSED ones, True, or only
    the tiered ones, False). A linked shard's record is in the full step only
    (``chain.read_chain`` moves it there), the others are in every step."""
    records = (p for s in (chain[0], chain[-1]) for p in s.pieces() if fused is None or p.fused == fused)
    return list({p.spec.key: p.spec for p in records}.values())


def read_chunk(step: ChainStep, record: PieceRecord, chunk: ChunkSpec) -> Tuple[torch.Tensor, torch.Tensor]:
    """(shard-local ids int64, rows) of a saved chunk, checked against its manifest entry."""
    if record.snapshot is not None:
        return read_linked_rows(step.directory, record, chunk, step.links)
    spec = record.spec
    keys = [chunk.key] if chunk.dense else [f"{chunk.key}/ids", chunk.key]
    data = step.reader.read(keys)
    rows = data[chunk.key]
    ids = torch.arange(chunk.row_lo, chunk.row_hi) if chunk.dense else data[f"{chunk.key}/ids"]
    crc = chunk_crc32(spec, None if chunk.dense else ids, rows)
    bad = None
    width = spec.quantized_row_bytes(chunk.quantize) if chunk.quantize else spec.row_width
    if tuple(rows.shape) != (chunk.count, width) or ids.numel() != chunk.count:
        bad = (f"holds {ids.numel()} ids and rows of shape {tuple(rows.shape)}, "
               f"expected {chunk.count} x {width}")
    elif crc != chunk.crc32:
        bad = f"fails its checksum (CRC-32 {crc:#010x}, recorded {chunk.crc32:#010x})"
    elif chunk.count and (int(ids[0]) < chunk.row_lo or int(ids[-1]) >= chunk.row_hi):
        bad = f"has ids outside [{chunk.row_lo}, {chunk.row_hi})"
    if bad is not None:
        where = step.reader.file_of(chunk.key)
        raise ChainError(f"checkpoint file {where} (step {step.step}): chunk {chunk.key} {bad}", where, step.step)
    if chunk.quantize:
        rows = dequantize_rows(spec, rows, chunk.quantize)
    return ids.to(torch.int64), rows


def split_rows(spec: PieceSpec, rows: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weights ``[n, cols]``, fp32 optimizer state ``[n, state_values]`` or None)."""
    weights = rows[:, : spec.cols]
    if spec.state_values == 0:
        return weights, None
    return weights, rows[:, spec.cols :].contiguous().view(torch.float32)


def join_rows(weights: torch.Tensor, state: Optional[torch.Tensor]) -> torch.Tensor:
    """Rows as the tiers store them: the weights, then the fp32 optimizer state's bytes
    (``[n]`` row-wise or ``[n, values]``) as more elements of the weights' dtype."""
    if state is None:
        return weights
    state = state.unsqueeze(1) if state.dim() == 1 else state
    return torch.cat([weights, state.to(torch.float32).contiguous().view(weights.dtype)], dim=1)


def init_rows(spec: PieceSpec, ids: torch.Tensor) -> torch.Tensor:
    """The initial rows of shard-local ``ids`` of a saved shard."""
    return lazy_init_rows(ids, spec.cols, spec.state_slots, tuple(spec.init_range), spec.seed, spec.torch_dtype)


def _overlap(a: PieceSpec, b: PieceSpec) -> bool:
    return (
        table_of(a) == table_of(b)
        and a.row_offset < b.row_offset + b.rows and b.row_offset < a.row_offset + a.rows
        and a.col_offset < b.col_offset + b.cols and b.col_offset < a.col_offset + a.cols
    )


def _target_rows(target: PieceSpec, source: PieceSpec) -> Tuple[int, int]:
    """The source-local row range that falls inside the target shard."""
    lo = max(target.row_offset, source.row_offset) - source.row_offset
    hi = min(target.row_offset + target.rows, source.row_offset + source.rows) - source.row_offset
    return lo, hi


def _apply(piece: LocalPiece, source: PieceSpec, ids: torch.Tensor, rows: torch.Tensor) -> int:
    """Writes source rows (source-local ``ids``) that fall inside the target shard."""
    target = piece.spec
    global_ids = ids + source.row_offset
    keep = (global_ids >= target.row_offset) & (global_ids < target.row_offset + target.rows)
    if not bool(keep.all()):
        global_ids, rows = global_ids[keep], rows[keep]
    local = global_ids - target.row_offset
    if local.numel() == 0:
        return 0
    check_same_optimizer(source, target)
    same_layout = (source.col_offset, source.cols, source.dtype, source.state_values) == (
        target.col_offset, target.cols, target.dtype, target.state_values)
    if same_layout:
        piece.emb.set_store_rows(piece.t, local, rows.contiguous())
        return int(local.numel())
    weights, state = split_rows(target, piece.emb.store_rows(piece.t, local))
    src_w, src_s = split_rows(source, rows)
    a = max(source.col_offset, target.col_offset)
    b = min(source.col_offset + source.cols, target.col_offset + target.cols)
    to_cols = slice(a - target.col_offset, b - target.col_offset)
    from_cols = slice(a - source.col_offset, b - source.col_offset)
    weights = weights.clone()
    weights[:, to_cols] = src_w[:, from_cols].to(weights.dtype)
    if state is not None:
        state = _move_state(source, target, state.clone(), src_s, to_cols, from_cols)
        state = state.reshape(-1) if target.state_values == 1 else state
    piece.emb.set_rows(piece.t, local, weights.contiguous(), state)
    return int(local.numel())


def check_same_optimizer(source: PieceSpec, target: PieceSpec) -> None:
    """Raises ValueError unless the saved rows carry the state of the target's optimizer:
    another optimizer's values (Adagrad's dim against partial row-wise Adam's dim + 1, or
    Adam's momenta against LAMB's) would be restored as if they were its own."""
    if source.optimizer_name != target.optimizer_name:
        raise ValueError(
            f"table {target.table}: cannot restore the optimizer state of {source.optimizer_name} "
            f"({source.state_values} values per row) into a table trained with {target.optimizer_name} "
            f"({target.state_values}): another optimizer")


def _move_state(source: PieceSpec, target: PieceSpec, state: torch.Tensor, src_s: torch.Tensor,
                to_cols: slice, from_cols: slice) -> torch.Tensor:
    """``state`` (the target's ``[n, state_values]`` rows) with the source's state of the
    shared columns, part by part (FBGEMM's parts: ``state_parts``): a per-element part's
    shared columns; a row-wise part (one value per row) from the source shard holding the
    target's first column, as TorchRec keeps it."""
    state = state if state.dim() == 2 else state.unsqueeze(1)
    src_s = src_s if src_s.dim() == 2 else src_s.unsqueeze(1)
    holds_first = source.col_offset <= target.col_offset < source.col_offset + source.cols
    to_start = from_start = 0
    for to_width, from_width in zip(target.state_parts, source.state_parts):
        if to_width == 1:
            if holds_first:
                state[:, to_start] = src_s[:, from_start]
        else:
            state[:, to_start + to_cols.start:to_start + to_cols.stop] = \
                src_s[:, from_start + from_cols.start:from_start + from_cols.stop]
        to_start, from_start = to_start + to_width, from_start + from_width
    return state


def restore_optimizer_steps(pieces: List[LocalPiece], chain: List[ChainStep]) -> None:
    """Sets each kernel's optimizer step count (the Adam family's, FBGEMM's ``iter``) to the
    count the chain's newest records of its tables saved, so training continues exactly.

    Raises:
        ValueError: the tables of one kernel (one count) were saved with different counts.
    """
    saved: Dict[Table, set] = {}
    for step in reversed(chain):  # a table's newest records (a step may hold none of a linked table's)
        found: Dict[Table, set] = {}
        for record in step.pieces():
            if not record.fused and table_of(record.spec) not in saved:
                found.setdefault(table_of(record.spec), set()).add(record.optimizer_step)
        saved.update(found)
    kernels: Dict[int, Tuple[Any, Dict[str, set]]] = {}
    for piece in pieces:
        if not hasattr(piece.emb, "set_optimizer_step"):
            continue  # a FUSED shard's rows (kind_change.FusedRows)
        _, by_table = kernels.setdefault(id(piece.emb), (piece.emb, {}))
        by_table[piece.spec.table] = saved.get(table_of(piece.spec), {0})
    for emb, by_table in kernels.values():
        steps = set().union(*by_table.values())
        if len(steps) > 1:
            raise ValueError(f"tables {', '.join(sorted(by_table))} share one optimizer step count (one kernel), "
                             f"but were saved with step counts {sorted(steps)}")
        step = steps.pop()
        if step or emb.optimizer_step:
            emb.set_optimizer_step(step)


_Work = Tuple[str, LocalPiece, ChainStep, PieceRecord, Optional[ChunkSpec]]


def _work(pieces: List[LocalPiece], chain: List[ChainStep]) -> Iterator[_Work]:
    """In restore order: ("fill", piece, step, source, None) and ("chunk", ..., chunk)."""
    for piece in pieces:
        if piece.spec.virtual:  # rows by id: virtual_pieces.py
            continue
        for n, step in enumerate(chain):
            for record in step.pieces():
                source = record.spec
                if source.virtual or not _overlap(piece.spec, source):
                    continue
                if n == 0 and not record.complete:
                    yield "fill", piece, step, record, None
                lo, hi = _target_rows(piece.spec, source)
                for chunk in record.chunks:
                    if chunk.row_lo < hi and chunk.row_hi > lo:
                        yield "chunk", piece, step, record, chunk


def _fill(piece: LocalPiece, source: PieceSpec, block_rows: int) -> None:
    """Rewrites the target rows a sparse full step implies to be initial values."""
    lo, hi = _target_rows(piece.spec, source)
    same = piece.spec == source
    for start in range(lo, hi, block_rows):
        stop = min(hi, start + block_rows)
        if same:  # only rows the target may hold as written differ from the same initial values
            ids = piece.emb.written_ids(piece.t, start, stop)
        else:
            ids = torch.arange(start, stop)
        if ids.numel():
            _apply(piece, source, ids, init_rows(source, ids))


def check_rows(pieces: List[LocalPiece], chain: List[ChainStep]) -> None:
    """Reads and checks every chunk the restore of ``pieces`` needs.

    Raises:
        ChainError: a chunk is missing or damaged.
    """
    seen = set()
    for kind, _, step, record, chunk in _work(pieces, chain):
        if kind == "chunk" and (step.step, chunk.key) not in seen:
            if record.snapshot is not None:  # the map; its rows are checked as they are read
                read_map_chunk(step.directory, record, chunk)
            else:
                read_chunk(step, record, chunk)
            seen.add((step.step, chunk.key))


def apply_rows(pieces: List[LocalPiece], chain: List[ChainStep], block_rows: int = 1 << 16) -> int:
    """Writes the chain's rows into this rank's tiered shards (after ``check_rows``);
    returns the rows written."""
    written = 0
    for kind, piece, step, record, chunk in _work(pieces, chain):
        if kind == "fill":
            _fill(piece, record.spec, block_rows)
        else:
            ids, rows = read_chunk(step, record, chunk)
            written += _apply(piece, record.spec, ids, rows)
    return written
