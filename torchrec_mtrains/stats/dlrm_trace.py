"""Trace files in the format of Meta's public synthetic DLRM traces (dlrm_datasets).

Each file (``torch.save``, optionally gzip-compressed ``.pt.gz``) holds one global batch as
the tuple ``(indices, offsets, lengths)``:

- ``lengths``: int [T, B], ids of table t in sample b;
- ``offsets``: int [T * B + 1], table-major prefix sums of ``lengths`` (starting at 0);
- ``indices``: int [offsets[-1]], the ids, table after table.

This is how dlrm_datasets' ``fbgemm_t856_bs65536_*.pt`` files are read (``indices, offsets,
lengths = torch.load(f)``, ``num_tables, batch_size = lengths.shape``). A file's batch can be
split into training steps of ``batch_size`` samples.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from torchrec_mtrains.stats.types import TableTrace, Trace

__all__ = ["DlrmBatch", "check_dlrm_batch", "load_dlrm_trace", "read_dlrm_file", "trace_from_dlrm_batches", "write_dlrm_file"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class DlrmBatch:
    """One checked dlrm_datasets batch (int64 tensors)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.lengths.shape[1])


def _int_tensor(name: str, t: object, dim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64).contiguous()


def check_dlrm_batch(indices: object, offsets: object, lengths: object) -> DlrmBatch:
    """Checks a batch's tensors against each other.

    Raises:
        ValueError: naming the field: a non-integer or wrongly shaped tensor, negative
            lengths or ids, offsets not ``T * B + 1`` long, not starting at 0, not the
            prefix sums of ``lengths``, or not ending at ``len(indices)``.
    """
    indices = _int_tensor("indices", indices, 1)
    offsets = _int_tensor("offsets", offsets, 1)
    lengths = _int_tensor("lengths", lengths, 2)
    t, b = lengths.shape
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {int(lengths.min())}")
    if offsets.numel() != t * b + 1:
        raise ValueError(f"offsets has {offsets.numel()} entries; expected T * B + 1 = {t * b + 1} "
                         f"for lengths of shape [{t}, {b}]")
    if int(offsets[0]) != 0:
        raise ValueError(f"offsets must start at 0, got {int(offsets[0])}")
    diff = offsets[1:] - offsets[:-1]
    bad = (diff != lengths.reshape(-1)).nonzero()
    if bad.numel():
        k = int(bad[0, 0])
        raise ValueError(f"offsets do not match lengths: offsets[{k + 1}] - offsets[{k}] = {int(diff[k])} "
                         f"but lengths[{k // b}, {k % b}] = {int(lengths.reshape(-1)[k])}")
    if int(offsets[-1]) != indices.numel():
        raise ValueError(f"lengths sum to {int(offsets[-1])} ids but indices has {indices.numel()}")
    if indices.numel() and int(indices.min()) < 0:
        pos = int((indices < 0).nonzero()[0, 0])
        raise ValueError(f"indices must be >= 0: indices[{pos}] = {int(indices[pos])}")
    return DlrmBatch(indices, offsets, lengths)


def read_dlrm_file(path: PathLike) -> DlrmBatch:
    """Reads and checks one trace file (``.pt`` or gzip-compressed ``.pt.gz``)."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        obj = torch.load(f, weights_only=True)
    if not isinstance(obj, (tuple, list)) or len(obj) != 3:
        raise ValueError(f"{path}: expected a tuple (indices, offsets, lengths), got {type(obj).__name__}"
                         + (f" of {len(obj)}" if isinstance(obj, (tuple, list)) else ""))
    return check_dlrm_batch(*obj)


def write_dlrm_file(path: PathLike, batch: DlrmBatch) -> None:
    """Writes a batch as ``(indices, offsets, lengths)`` (gzip-compressed if ``path`` ends in .gz)."""
    batch = check_dlrm_batch(batch.indices, batch.offsets, batch.lengths)
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        torch.save((batch.indices, batch.offsets, batch.lengths), f)


def load_dlrm_trace(
    paths: Union[PathLike, Sequence[PathLike]],
    batch_size: Optional[int] = None,
    table_names: Optional[Sequence[str]] = None,
    num_rows: Optional[Sequence[int]] = None,
) -> Trace:
    """A trace from one or more files, file after file.

    Args:
        paths: trace files; every file must have the same number of tables.
        batch_size: samples per training step; a file's batch is cut into steps of this
            many samples (the last one shorter if it does not divide). Default: one step per
            file.
        table_names: names of the tables (default "table_<t>").
        num_rows: rows of each table, if known.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    batches = [read_dlrm_file(p) for p in paths]
    if not batches:
        raise ValueError("paths must name at least one trace file")
    return trace_from_dlrm_batches(batches, batch_size, table_names, num_rows)


def trace_from_dlrm_batches(
    batches: Sequence[DlrmBatch],
    batch_size: Optional[int] = None,
    table_names: Optional[Sequence[str]] = None,
    num_rows: Optional[Sequence[int]] = None,
) -> Trace:
    """A trace from checked batches (see ``load_dlrm_trace``)."""
    t_count = batches[0].num_tables
    for i, b in enumerate(batches):
        if b.num_tables != t_count:
            raise ValueError(f"lengths of batch {i} has {b.num_tables} tables, batch 0 has {t_count}")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer")
    names = [f"table_{t}" for t in range(t_count)] if table_names is None else list(table_names)
    if len(names) != t_count or len(set(names)) != t_count:
        raise ValueError(f"table_names={names!r} must be {t_count} distinct names")
    if num_rows is not None and len(num_rows) != t_count:
        raise ValueError(f"num_rows has {len(num_rows)} entries, expected {t_count}")
    tables = {}
    for t, name in enumerate(names):
        ids: List[np.ndarray] = []
        offsets: List[int] = [0]
        samples: List[int] = []
        for b in batches:
            bs = b.batch_size
            step = bs if batch_size is None else batch_size
            off = b.offsets.numpy()
            lo_t = int(off[t * bs])
            ids.append(b.indices.numpy()[lo_t: int(off[(t + 1) * bs])])
            for s0 in range(0, bs, step) if bs else []:
                s1 = min(bs, s0 + step)
                offsets.append(offsets[-1] + int(off[t * bs + s1]) - int(off[t * bs + s0]))
                samples.append(s1 - s0)
        rows = None if num_rows is None else int(num_rows[t])
        if rows is not None:
            top = max((int(x.max()) for x in ids if x.size), default=-1)
            if top >= rows:
                raise ValueError(f"indices of table {name} reach {top}, outside num_rows={rows}")
        tables[name] = TableTrace(
            np.concatenate(ids).astype(np.int64), np.asarray(offsets, dtype=np.int64),
            np.asarray(samples, dtype=np.int64), rows,
        )
    return Trace(tables)
