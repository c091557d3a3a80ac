"""Initial values of never-written rows, identical on every tier.

Weight j of row r is ``lo + (hi - lo) * u(seed, r, j)`` (SplitMix64, csrc/storage/lazy_init.h),
optimizer state is zero. Every store (DRAM, SCM, SSD) starts a table from these values, so a
table's initial weights do not depend on where it is placed.
"""

from __future__ import annotations

from typing import Tuple

import torch

from torchrec_mtrains._ops import load_extension

__all__ = ["lazy_init_rows"]


def lazy_init_rows(
    ids: torch.Tensor,
    dim: int,
    state_dim: int,
    init_range: Tuple[float, float],
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Returns the initial ``[len(ids), dim + state_dim]`` rows of a table."""
    load_extension()
    return torch.ops.mtrains.lazy_init_rows(
        ids.to(torch.int64).contiguous(), dim, state_dim, seed, float(init_range[0]),
        float(init_range[1]), dtype,
    )
