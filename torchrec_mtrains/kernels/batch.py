"""Validation and per-table split of a TBE batch (indices table-major, T * B + 1 offsets)."""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import torch

__all__ = ["Batch", "check_index_tensor", "split_batch"]

_INT_DTYPES = (torch.int64, torch.int32)


@dataclasses.dataclass(frozen=True)
class Batch:
    """A checked batch: int64 ``indices`` and ``offsets``, and each table's indices (views)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    per_table: List[torch.Tensor]


def check_index_tensor(name: str, t: object) -> torch.Tensor:
    """Returns ``t`` as a contiguous 1-D int64 CPU tensor; ValueError naming ``name`` if it
    is not an int32/int64 1-D CPU tensor."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must be int64 or int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    return t.to(torch.int64).contiguous()


def split_batch(
    indices: torch.Tensor, offsets: torch.Tensor, specs: Sequence[Tuple[int, int]], names: Sequence[str]
) -> Batch:
    """Checks a batch and returns it split by table.

    Raises:
        ValueError: wrong dtypes or shapes, offsets that do not start at 0, decrease, or do
            not end at ``len(indices)``, or whose length is not ``T * B + 1``.
        IndexError: an id outside its table, naming the table, the id and its position.
    """
    indices = check_index_tensor("indices", indices)
    offsets = check_index_tensor("offsets", offsets)
    num_tables = len(specs)
    if offsets.numel() < 1 or (offsets.numel() - 1) % num_tables:
        raise ValueError(
            f"offsets has {offsets.numel()} entries; expected T * B + 1 with T = {num_tables} tables"
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != indices.numel():
        raise ValueError(
            f"offsets must start at 0 and end at len(indices) = {indices.numel()}, "
            f"got {int(offsets[0])} .. {int(offsets[-1])}"
        )
    if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
        pos = int((offsets[1:] < offsets[:-1]).nonzero()[0, 0]) + 1
        raise ValueError(f"offsets must not decrease: offsets[{pos}] = {int(offsets[pos])} < offsets[{pos - 1}]")
    batch_size = (offsets.numel() - 1) // num_tables
    bounds = offsets[:: batch_size].tolist() if batch_size else [0] * (num_tables + 1)
    per_table = []
    for t, (rows, _) in enumerate(specs):
        part = indices[bounds[t] : bounds[t + 1]]
        if part.numel():
            lo, hi = torch.aminmax(part)
            if int(lo) < 0 or int(hi) >= rows:
                pos = int(((part < 0) | (part >= rows)).nonzero()[0, 0])
                raise IndexError(
                    f"table {names[t]}: id {int(part[pos])} at position {bounds[t] + pos} of indices "
                    f"is outside [0, {rows})"
                )
        per_table.append(part)
    return Batch(indices, offsets, per_table)
