"""Value types of the sharding package: a table's tier settings and how they ride in a plan.

A tiered table's settings travel through TorchRec unchanged: the plan holds a
``TieredParameterSharding`` (a ``ParameterSharding`` with one more field), and the sharded
module copies its ``TieredParams`` into the table's ``fused_params`` under the keys below,
so TorchRec groups tables with different settings into different kernels by itself. The
settings a kernel holds per table -- tier, cache size, rows written -- are kept out of its
grouping: a kernel's tables may sit on several tiers (one TBE per rank), and the tier and
rows written of every tiered table ride in one map (``TABLE_TIERS_KEY``) that all of them
carry alike.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Dict, List, Optional, Protocol, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_types import ShardedEmbeddingTable
from torchrec.distributed.types import ParameterSharding

from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.kernels.config import DEFAULT_CACHE_LOAD_FACTOR, DEFAULTS, TieredConfig
from torchrec_mtrains.sharding.staging import StagingArea
from torchrec_mtrains.types import Tier

__all__ = ["CACHE_LOAD_FACTOR", "FUSED_PARAM_KEYS", "SEED_KEY", "TABLE_TIERS_KEY", "TieredParameterSharding",
           "TieredParams", "TieredShardSource", "per_table_fused_params"]

CACHE_LOAD_FACTOR = "cache_load_factor"  # TorchRec's key; its table grouping leaves it out

_PREFIX = "mtrains_"
FUSED_PARAM_KEYS = tuple(
    _PREFIX + k
    for k in ("tier", "cache_rows", "cache_load_factor", "cache_algorithm", "storage_dir", "state_dict_ram_mb",
              "rows_written", "ssd_dram_cache_mb", "virtual_rows", "lookahead")
)
TABLE_TIERS_KEY = _PREFIX + "table_tiers"
"""fused_params key: ``((table name, tier value, rows_written), ...)`` of every tiered table."""
SEED_KEY = _PREFIX + "seed"
"""fused_params key: the seed of the tiered tables' initial rows (``TieredConfig.seed``)."""
_STATE_DICT_RAM_MB = 1024.0


@dataclasses.dataclass(frozen=True)
class TieredParams:
    """Where one table lives and how it is cached.

    The settings it shares with the kernel (tier, cache size, cache algorithm) are checked
    by the kernel's ``TieredConfig``, and ``kernel_config`` makes the kernel's config.

    Args:
        tier: the table's backing tier (Tier.DRAM, Tier.SCM or Tier.SSD on CPU).
        cache_rows: row-cache slots for the whole table; a shard gets its share by rows.
        cache_load_factor: cache size as a fraction of the rows (default
            ``DEFAULT_CACHE_LOAD_FACTOR`` when neither this nor ``cache_rows`` is given).
        cache_algorithm: "lru", "lfu" or "tinylfu".
        storage_dir: where SCM/SSD files go; each rank uses ``storage_dir/rank_<r>``.
        state_dict_ram_mb: in MiB; a local shard larger than this is staged for ``state_dict()``
            in a memory-mapped file in the rank's storage directory instead of in RAM.
        rows_written: the distinct rows of the whole table the job is expected to write
            (None: all). An SSD table takes disk only for rows written (they are initialised
            lazily), so the free-space check asks for this share of the shards' rows.
        ssd_dram_cache_mb: DRAM cache (MiB) of the SSD block stores of one kernel, under
            the row cache, split evenly between its SSD shards (as FBGEMM's ``l2_cache_size``
            is one per TBE); 0: none.
        virtual_rows: for a virtual table (``use_virtual_table`` in its config), the live
            ids the whole table holds (each shard its share); None: room for the eviction
            policy's trigger, else ``DEFAULT_VIRTUAL_ROWS`` per shard
            (``virtual_tables.virtual_shard_rows``). Ignored for other tables.
        lookahead: the look-ahead window of the table's kernel, in batches (0: none; the
            ``StorageAwarePlanner`` picks one for SSD tables): its plans keep every row the
            next ``lookahead`` batches use. ``TieredTrainPipeline(lookahead=...)`` prefetches
            that far ahead (a plain TorchRec pipeline prefetches one batch: the window then
            holds none). TorchRec groups tables into kernels by their fused_params, so tables
            of different windows get kernels of their own.
    """

    tier: Tier
    cache_rows: Optional[int] = None
    cache_load_factor: Optional[float] = None
    cache_algorithm: str = DEFAULTS.cache_algorithm
    storage_dir: Optional[str] = None
    state_dict_ram_mb: float = _STATE_DICT_RAM_MB
    rows_written: Optional[int] = None
    ssd_dram_cache_mb: float = 0.0
    virtual_rows: Optional[int] = None
    lookahead: int = 0

    def __post_init__(self) -> None:
        for name in ("rows_written", "virtual_rows"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"TieredParams: {name}={value!r} must be a positive int")
        written = self.rows_written
        if written is not None and (isinstance(written, bool) or not isinstance(written, int) or written < 1):
            raise ValueError(f"TieredParams: rows_written={written!r} must be a positive int")
        rows = self.cache_rows
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
            raise ValueError(f"TieredParams: cache_rows={rows!r} must be a positive int")  # the whole table's
        try:
            self.kernel_config(cache_rows=rows, cache_load_factor=self.cache_load_factor, storage_dir=self.storage_dir,
                               ssd_dram_cache_mb=self.ssd_dram_cache_mb, lookahead=self.lookahead)
        except ValueError as e:
            raise ValueError(f"TieredParams: {e}") from None
        if self.tier in (Tier.SCM, Tier.SSD) and not self.storage_dir:
            raise ValueError(f"TieredParams: tier {self.tier.name} needs storage_dir")
        if not isinstance(self.state_dict_ram_mb, (int, float)) or not self.state_dict_ram_mb >= 0:
            raise ValueError(f"TieredParams: state_dict_ram_mb={self.state_dict_ram_mb!r} must be >= 0")

    def kernel_config(self, **settings: Any) -> TieredConfig:
        """The config of a kernel of this table's shards: this tier (unless ``settings``
        give one per table) and cache algorithm, every other setting (the shards' cache
        rows, the rank's storage directory, the optimizer, ...) from ``settings``.

        Raises:
            ValueError: a bad setting, naming it.
        """
        return TieredConfig(**{"tier": self.tier, **settings, "cache_algorithm": self.cache_algorithm})

    def to_fused_params(self) -> Dict[str, Any]:
        """The settings as ``fused_params`` entries (hashable values, for TorchRec's grouping)."""
        values = (self.tier.value, self.cache_rows, self.cache_load_factor, self.cache_algorithm,
                  None if self.storage_dir is None else os.fspath(self.storage_dir), float(self.state_dict_ram_mb),
                  self.rows_written, float(self.ssd_dram_cache_mb), self.virtual_rows, self.lookahead)
        return dict(zip(FUSED_PARAM_KEYS, values))

    @staticmethod
    def from_fused_params(fused_params: Dict[str, Any], table: Optional[str] = None) -> "TieredParams":
        """Reads the settings back (those of ``table`` when its tier and rows written are in
        the ``TABLE_TIERS_KEY`` map); ValueError naming what is missing or wrong."""
        per_table = {name: (tier, written) for name, tier, written in fused_params.get(TABLE_TIERS_KEY) or ()}
        if table in per_table:
            fused_params = dict(fused_params)
            fused_params[FUSED_PARAM_KEYS[0]], fused_params[FUSED_PARAM_KEYS[6]] = per_table[table]
        if fused_params.get(FUSED_PARAM_KEYS[0]) is None:
            raise ValueError(
                "a CUSTOMIZED_KERNEL table has no tier settings: build its plan entry with "
                "tiered_sharding_plan() or the StorageAwarePlanner (a TieredParameterSharding)"
            )
        tier, rows, lf, algo, storage_dir, ram_mb, written, dram_mb, virtual_rows, lookahead = (
            fused_params.get(k) for k in FUSED_PARAM_KEYS)
        try:
            tier = Tier(tier)
        except ValueError:
            raise ValueError(f"fused_params[{FUSED_PARAM_KEYS[0]!r}]={tier!r} is not a tier") from None
        return TieredParams(tier, rows, lf, algo or DEFAULTS.cache_algorithm, storage_dir,
                            _STATE_DICT_RAM_MB if ram_mb is None else ram_mb, written, dram_mb or 0.0, virtual_rows,
                            lookahead or 0)

    def load_factor(self, num_embeddings: int) -> float:
        """The cache size as a fraction of the table's rows."""
        if self.cache_rows is not None:
            return self.cache_rows / num_embeddings
        return DEFAULT_CACHE_LOAD_FACTOR if self.cache_load_factor is None else float(self.cache_load_factor)

    def shard_cache_rows(self, local_rows: int, num_embeddings: int) -> int:
        """Cache slots for a shard of ``local_rows`` of a table of ``num_embeddings`` rows."""
        if self.cache_rows is not None:
            return max(1, math.ceil(self.cache_rows * local_rows / num_embeddings))
        lf = DEFAULT_CACHE_LOAD_FACTOR if self.cache_load_factor is None else self.cache_load_factor
        return max(1, math.ceil(local_rows * lf))


def per_table_fused_params(tiered: Dict[str, "TieredParams"]) -> Dict[str, Any]:
    """The ``fused_params`` entries that every tiered table carries alike: the tier and rows
    written of each (by table name), and None for the per-table keys they replace, so
    tables differing only in these share a kernel."""
    entries = tuple(sorted((name, p.tier.value, p.rows_written) for name, p in tiered.items()))
    return {TABLE_TIERS_KEY: entries, FUSED_PARAM_KEYS[0]: None, FUSED_PARAM_KEYS[6]: None}


@dataclasses.dataclass
class TieredParameterSharding(ParameterSharding):
    """A ``ParameterSharding`` of a table on a tier behind a row cache (the compute kernel is
    ``CUSTOMIZED_KERNEL``); ``tiered`` carries the settings."""

    tiered: Optional[TieredParams] = None


class TieredShardSource(Protocol):
    """What a sharded module's state_dict (sharding/checkpoint.py) needs of a tiered kernel:
    its local shards, staged out of the tiers and loaded back one at a time, and the group
    its shards are sharded over. ``TieredBatchedEmbeddingBag`` is the one in this package."""

    params: "TieredParams"  # the settings of the kernel's tables (staging RAM, storage)
    storage_dir: Optional[str]  # this rank's directory of table files, if any

    @property
    def process_group(self) -> Optional[dist.ProcessGroup]: ...

    @property
    def emb_module(self) -> TieredEmbeddingBags: ...

    def shards(self) -> List[Tuple[int, ShardedEmbeddingTable]]: ...

    def has_optimizer_state(self) -> bool: ...

    def stage_shard(self, t: int, part: str, area: StagingArea) -> torch.Tensor: ...

    def load_shard(self, t: int, part: str, source: torch.Tensor) -> None: ...

    def stage_step(self, t: int) -> torch.Tensor: ...
