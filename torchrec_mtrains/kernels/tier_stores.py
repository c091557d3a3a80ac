"""Creates the backing store of one table on a tier: a lookup table keyed by Tier."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Optional, Tuple

import torch

from torchrec_mtrains.storage import BlockStore, DramStore, RowStore, ScmStore
from torchrec_mtrains.types import Tier

__all__ = ["StoreSpec", "create_store", "ssd_file", "TIER_FACTORIES"]


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """Everything needed to create one table's backing store."""

    name: str
    num_rows: int
    row_width_dim: int  # weights per row
    state_slots: int  # optimizer-state values per row, in the store dtype
    dtype: torch.dtype
    init_range: Tuple[float, float]
    seed: int
    storage_dir: Optional[str]
    ssd_dram_cache_mb: float = 0.0


def _dram(spec: StoreSpec) -> RowStore:
    return DramStore(spec.num_rows, spec.row_width_dim, spec.state_slots, spec.dtype,
                     spec.init_range, spec.seed, name=spec.name)


def _needs_dir(spec: StoreSpec, tier: Tier) -> str:
    if spec.storage_dir is None:
        raise ValueError(f"table {spec.name}: tier {tier.name} needs storage_dir")
    try:
        os.makedirs(spec.storage_dir, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"table {spec.name}: cannot create storage_dir {spec.storage_dir}: {e.strerror}") from None
    return spec.storage_dir


def _scm(spec: StoreSpec) -> RowStore:
    path = os.path.join(_needs_dir(spec, Tier.SCM), f"{spec.name}.scm")
    return ScmStore(path, spec.num_rows, spec.row_width_dim, spec.state_slots, spec.dtype,
                    spec.init_range, spec.seed, overwrite=True)


def ssd_file(storage_dir: str, name: str) -> str:
    """The block-store file of SSD table ``name`` in ``storage_dir``."""
    return os.path.join(storage_dir, f"{name}.blk")


def _ssd(spec: StoreSpec) -> RowStore:
    path = ssd_file(_needs_dir(spec, Tier.SSD), spec.name)
    return BlockStore(path, spec.num_rows, spec.row_width_dim, spec.state_slots, spec.dtype,
                      dram_cache_mb=spec.ssd_dram_cache_mb, init_range=spec.init_range,
                      seed=spec.seed, overwrite=True)


def _hbm(spec: StoreSpec) -> RowStore:
    raise ValueError(
        f"table {spec.name}: Tier.HBM backs a table with GPU memory, which this CPU build has "
        "not; use Tier.DRAM (the cache in front is then host memory as well)"
    )


TIER_FACTORIES: Dict[Tier, Callable[[StoreSpec], RowStore]] = {
    Tier.HBM: _hbm,
    Tier.DRAM: _dram,
    Tier.SCM: _scm,
    Tier.SSD: _ssd,
}


def create_store(tier: Tier, spec: StoreSpec) -> RowStore:
    """Creates the table's store on ``tier`` (files go in ``spec.storage_dir``; existing
    files of the same table name there are replaced: they are working storage)."""
    if not isinstance(tier, Tier):
        raise ValueError(f"tier={tier!r} must be a torchrec_mtrains.Tier")
    return TIER_FACTORIES[tier](spec)
