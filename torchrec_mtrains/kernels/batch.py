"""Validation of a TBE batch (indices table-major, T * B + 1 offsets); the one-pass check of its
offsets and ids is C++ (csrc/kernel/batch_bounds.h, run by the step engine)."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


__all__ = ["BatchSizes", "check_embedding_specs", "check_feature_table_map", "check_index_tensor", "feature_batch_of",
           "raise_batch_problem"]

_INT_DTYPES = (torch.int64, torch.int32)
_BAD_ENDS, _DECREASING, _ID_OUT_OF_RANGE = 1, 2, 3  # csrc/kernel/batch_bounds.h BatchProblemKind


BatchSizes = List[List[int]]
"""FBGEMM's ``batch_size_per_feature_per_rank``: the bags of each feature from each rank
(variable batch per feature, VBE)."""


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
    # Each tensor call releases and retakes the GIL (a hand-off to the prefetch thread):
    # none when the tensor is already what it must be.
    if t.dtype is not torch.int64:
        t = t.to(torch.int64)
    return t if t.is_contiguous() else t.contiguous()


def feature_batch_of(offsets: torch.Tensor, batch_sizes: Optional[BatchSizes], num_features: int,
                     by_table: bool = True) -> List[int]:
    """Checks the length of a batch's ``offsets`` (int64, checked) and returns each feature's
    bags over every rank ([] when every feature has the same bags).

    Without ``batch_sizes`` offsets have ``F * B + 1`` entries; with it (FBGEMM's
    ``batch_size_per_feature_per_rank``: each feature's bags from each rank, feature by
    feature and rank by rank) one per bag plus one. ``by_table``: one feature per table
    (the error then says T).

    Raises:
        ValueError: offsets of the wrong length, or a malformed ``batch_sizes``.
    """
    if batch_sizes is not None:
        feature_batch = _feature_batch(batch_sizes, num_features)
        if offsets.numel() != sum(feature_batch) + 1:
            raise ValueError(f"offsets has {offsets.numel()} entries; expected one per bag of "
                             f"batch_size_per_feature_per_rank + 1 = {sum(feature_batch) + 1}")
        return feature_batch
    if offsets.numel() < 1 or (offsets.numel() - 1) % num_features:
        what = "T * B + 1 with T = {} tables" if by_table else "F * B + 1 with F = {} features"
        raise ValueError(f"offsets has {offsets.numel()} entries; expected {what.format(num_features)}")
    return []


def raise_batch_problem(problem: Tuple[int, int, int, int], indices: torch.Tensor, tables: object) -> None:
    """Raises what a batch check (``(kind, table, pos, value)``, C++ kernel/batch_bounds.h)
    found wrong, naming the table (``tables.names``, ``tables.id_specs``); nothing when
    kind is 0.

    Raises:
        ValueError: offsets that do not start at 0, end at ``len(indices)``, or decrease.
        IndexError: an id outside its table, naming the table, the id and its position.
    """
    kind, table, pos, value = problem
    if kind == _BAD_ENDS:
        raise ValueError(f"offsets must start at 0 and end at len(indices) = {indices.numel()}, got {pos} .. {value}")
    if kind == _DECREASING:
        raise ValueError(f"offsets must not decrease: offsets[{pos}] = {value} < offsets[{pos - 1}]")
    if kind == _ID_OUT_OF_RANGE:
        names, specs = tables.names, tables.id_specs  # type: ignore[attr-defined]
        raise IndexError(f"table {names[table]}: id {value} at position {pos} of indices is outside "
                         f"[0, {specs[table][0]})")


def _feature_batch(batch_sizes: object, num_features: int) -> List[int]:
    """Each feature's bags over every rank; ValueError unless ``batch_sizes`` has a list of
    non-negative ints per feature, as many for each."""
    ok = isinstance(batch_sizes, (list, tuple)) and len(batch_sizes) == num_features and all(
        isinstance(per_rank, (list, tuple)) and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in per_rank)
        for per_rank in batch_sizes)
    if not ok or len({len(per_rank) for per_rank in batch_sizes}) != 1:  # type: ignore[union-attr]
        raise ValueError(f"batch_size_per_feature_per_rank must hold, for each of the {num_features} features, "
                         f"one list of bag counts (ints >= 0) per rank, got {batch_sizes!r}")
    return [sum(per_rank) for per_rank in batch_sizes]  # type: ignore[union-attr]


def check_feature_table_map(feature_table_map: Optional[Sequence[int]], num_tables: int) -> Optional[List[int]]:
    """Returns the map as a list; ValueError unless it is non-decreasing and names every
    table in ``[0, num_tables)``."""
    if feature_table_map is None:
        return None
    ftm = list(feature_table_map)
    if (
        not ftm
        or any(isinstance(t, bool) or not isinstance(t, int) for t in ftm)
        or ftm[0] != 0
        or any(b - a not in (0, 1) for a, b in zip(ftm, ftm[1:]))
        or ftm[-1] != num_tables - 1
    ):
        raise ValueError(
            f"feature_table_map={ftm!r} must be non-decreasing table numbers covering every table "
            f"0..{num_tables - 1} (a table's features adjacent)"
        )
    return ftm


def check_embedding_specs(specs: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Returns the ``(num_rows, dim)`` of each table as a list; ValueError naming the first
    bad table unless rows are positive and dims positive multiples of 4 (FBGEMM's)."""
    if not isinstance(specs, (list, tuple)) or not specs:
        raise ValueError("embedding_specs must be a non-empty list of (num_rows, dim)")
    out = []
    for t, spec in enumerate(specs):
        if not isinstance(spec, (list, tuple)) or len(spec) != 2:
            raise ValueError(f"embedding_specs[{t}]={spec!r} must be (num_rows, dim)")
        rows, dim = spec
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"embedding_specs[{t}]: num_rows={rows!r} must be a positive integer")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 4 or dim % 4:
            raise ValueError(f"embedding_specs[{t}]: dim={dim!r} must be a positive multiple of 4 (FBGEMM)")
        out.append((rows, dim))
    return out
