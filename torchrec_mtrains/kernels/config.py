"""TieredConfig: every setting of a TieredEmbeddingBags, its default written once, checked
when the config is made (before any table file exists)."""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from collections.abc import Iterable
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from torchrec_mtrains.kernels.tbe_settings import (
    TbeContext,
    as_settings,
    check_optimizer_supported,
    check_tbe_settings,
    shared_tables,
)
from torchrec_mtrains.kernels.virtual_rows import VirtualTableSpec
from torchrec_mtrains.layout import OPTIMIZERS, TableLayout, optimizer_name, precision_name
from torchrec_mtrains.slot_map import uses_dense_map
from torchrec_mtrains.types import Tier

__all__ = ["CACHE_ALGORITHMS", "DEFAULTS", "DEFAULT_CACHE_LOAD_FACTOR", "TieredConfig", "resolve_config"]

DEFAULT_CACHE_LOAD_FACTOR = 0.2
"""Cache size as a fraction of a table's rows when neither cache_rows nor a load factor is given."""
CACHE_ALGORITHMS = ("lru", "lfu", "tinylfu")
_POOLING_MODES = (PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE)  # NONE: a row per id (sequences)
_MAX_CACHE_WAYS = 1024  # the C++ cache's limit

InitRange = Tuple[float, float]


MAX_LOOKAHEAD = 256
"""The most batches a kernel's look-ahead window holds (each costs its ids' memory)."""


@dataclasses.dataclass(frozen=True)
class TieredConfig:
    """The settings of a ``TieredEmbeddingBags`` (see its docstring for each one).

    Sequences (``tier``, ``cache_rows`` and ``init_range`` per table, ``table_names``,
    ``feature_table_map``) are kept as tuples; ``optimizer`` and ``weights_precision`` may
    be given as FBGEMM's enums or their string values and are kept as the enums;
    ``tbe_settings`` (FBGEMM TBE keywords passed to the kernel's TBE: ``tbe_settings.py``)
    as a mapping or pairs, kept as sorted (keyword, value) pairs. ``dense_slot_map`` (None,
    True or False) is whether every table's cache index keeps a dense row-to-slot map: None
    leaves it to the rule of ``torchrec_mtrains/slot_map.py``. Settings
    that depend on the number of tables are checked against the tables by the methods
    taking them (``tiers``, ``cache_sizes``, ``init_ranges``, ``names``).

    Raises:
        ValueError: naming the bad setting and its value.
    """

    tier: Union[Tier, Tuple[Tier, ...]] = Tier.SSD
    cache_rows: Optional[Union[int, Tuple[int, ...]]] = None
    cache_load_factor: Optional[float] = None
    storage_dir: Optional[str] = None
    optimizer: EmbOptimType = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    learning_rate: float = 0.01
    eps: float = 1.0e-8
    pooling_mode: PoolingMode = PoolingMode.SUM
    cache_algorithm: str = "lru"
    prefetch_pipeline: Optional[bool] = True
    weights_precision: SparseType = SparseType.FP32
    cache_ways: int = 32
    init_range: Optional[Union[InitRange, Tuple[InitRange, ...]]] = None
    seed: int = 0
    table_names: Optional[Tuple[str, ...]] = None
    ssd_dram_cache_mb: float = 0.0
    feature_table_map: Optional[Tuple[int, ...]] = None
    virtual_tables: Optional[Tuple[Optional[VirtualTableSpec], ...]] = None
    tbe_settings: Union[Mapping[str, Any], Tuple[Tuple[str, Any], ...]] = ()
    dense_slot_map: Optional[bool] = None
    lookahead: int = 0

    def __post_init__(self) -> None:
        check_optimizer_supported(self.optimizer, OPTIMIZERS)
        self._replace("optimizer", EmbOptimType(optimizer_name(self.optimizer, "optimizer")))
        self._replace("weights_precision", SparseType(precision_name(self.weights_precision, "weights_precision")))
        self._replace("tier", _tier(self.tier))
        _check_choices(self)
        for name in ("learning_rate", "eps", "ssd_dram_cache_mb"):
            self._replace(name, _number(name, getattr(self, name), lo=0.0))
        _check_int("cache_ways", self.cache_ways, 1, _MAX_CACHE_WAYS)
        _check_int("seed", self.seed, 0)
        _check_int("lookahead", self.lookahead, 0, MAX_LOOKAHEAD)
        if self.prefetch_pipeline is not None:
            self._replace("prefetch_pipeline", bool(self.prefetch_pipeline))
        if self.dense_slot_map is not None and not isinstance(self.dense_slot_map, bool):
            raise ValueError(f"dense_slot_map={self.dense_slot_map!r} must be None (the rule picks the tables), "
                             "True or False")
        self._replace("cache_rows", _cache_rows(self.cache_rows, self.cache_load_factor))
        self._replace("init_range", _init_range(self.init_range))
        self._replace("table_names", _table_names(self.table_names))
        self._replace("storage_dir", _storage_dir(self.storage_dir))
        self._replace("feature_table_map", _feature_table_map(self.feature_table_map))
        self._replace("virtual_tables", _virtual_tables(self.virtual_tables))
        context = TbeContext(self.optimizer, self.weights_precision, self.pooling_mode,
                             shared_tables(self.feature_table_map))
        self._replace("tbe_settings", check_tbe_settings(as_settings(self.tbe_settings), context))

    def _replace(self, name: str, value: Any) -> None:
        """Puts a setting's normalised value in place of the given one (the config is frozen)."""
        object.__setattr__(self, name, value)

    def layout(self, dim: int) -> TableLayout:
        """The row layout of a table of ``dim`` columns under these settings."""
        return TableLayout(dim, self.weights_precision, self.optimizer)

    def tiers(self, num_tables: int) -> List[Tier]:
        """Each table's tier (``tier`` is one for all tables, or one per table).

        Raises:
            ValueError: ``tier`` given per table for another number of tables.
        """
        if isinstance(self.tier, Tier):
            return [self.tier] * num_tables
        if len(self.tier) != num_tables:
            raise ValueError(f"tier={[t.name for t in self.tier]} must be one Tier or one per table "
                             f"({num_tables} tables)")
        return list(self.tier)

    def cache_sizes(self, num_rows: Sequence[int]) -> List[int]:
        """Cache slots of each table, given each table's rows.

        Raises:
            ValueError: ``cache_rows`` given per table for another number of tables.
        """
        if self.cache_rows is None:
            lf = DEFAULT_CACHE_LOAD_FACTOR if self.cache_load_factor is None else self.cache_load_factor
            return [max(1, int(math.ceil(rows * lf))) for rows in num_rows]
        if isinstance(self.cache_rows, int):
            return [self.cache_rows] * len(num_rows)
        if len(self.cache_rows) != len(num_rows):
            raise ValueError(f"cache_rows={list(self.cache_rows)!r} must be a positive int or one per table")
        return list(self.cache_rows)

    def dense_maps(self, num_rows: Sequence[int], cache_sizes: Sequence[int], row_bytes: Sequence[int]) -> List[bool]:
        """Whether each table's cache index keeps a dense row-to-slot map, given each table's
        rows, cache slots and row bytes (weights + optimizer state): ``dense_slot_map`` if
        set, else the rule (``slot_map.dense_map_pays``).

        Raises:
            ValueError: the map forced on over a cache too large for its 32-bit slots.
        """
        names = self.names(len(num_rows))
        return [uses_dense_map(self.dense_slot_map, rows, slots, nbytes, name)
                for rows, slots, nbytes, name in zip(num_rows, cache_sizes, row_bytes, names)]

    def init_ranges(self, num_rows: Sequence[int]) -> List[InitRange]:
        """Each table's initial-weight range; default ``(-1/sqrt(rows), 1/sqrt(rows))``
        per table, as in TorchRec.

        Raises:
            ValueError: ``init_range`` given per table for another number of tables.
        """
        if self.init_range is None:
            return [(-math.sqrt(1.0 / rows), math.sqrt(1.0 / rows)) for rows in num_rows]
        if _is_pair(self.init_range):
            return [self.init_range] * len(num_rows)  # type: ignore[list-item]
        if len(self.init_range) != len(num_rows):
            raise ValueError(f"init_range must be one (lo, hi) or one per table, got {self.init_range!r}")
        return list(self.init_range)  # type: ignore[arg-type]

    def virtual_specs(self, num_tables: int) -> List[Optional[VirtualTableSpec]]:
        """Each table's VirtualTableSpec, None for a dense table.

        Raises:
            ValueError: ``virtual_tables`` given for another number of tables.
        """
        if self.virtual_tables is None:
            return [None] * num_tables
        if len(self.virtual_tables) != num_tables:
            raise ValueError(f"virtual_tables has {len(self.virtual_tables)} entries; give one per table "
                             f"({num_tables} tables), None for a dense one")
        return list(self.virtual_tables)

    def names(self, num_tables: int) -> List[str]:
        """The tables' names (default ``table_<t>``).

        Raises:
            ValueError: ``table_names`` given for another number of tables.
        """
        if self.table_names is None:
            return [f"table_{t}" for t in range(num_tables)]
        if len(self.table_names) != num_tables:
            raise ValueError(
                f"table_names={list(self.table_names)!r} must be {num_tables} distinct non-empty names without '/'"
            )
        return list(self.table_names)


def resolve_config(config: Optional[TieredConfig], settings: Mapping[str, Any]) -> TieredConfig:
    """The config of a ``TieredEmbeddingBags``: ``config`` if given (every other setting
    must then keep its default), else one made of ``settings``.

    Raises:
        ValueError: ``config`` is not a TieredConfig, or comes with settings changed from
            their defaults (naming them); or a bad setting.
    """
    if config is None:
        return TieredConfig(**settings)
    if not isinstance(config, TieredConfig):
        raise ValueError(f"config must be a TieredConfig, got {type(config).__name__}")
    changed = sorted(k for k, v in settings.items() if not _is_default(v, getattr(DEFAULTS, k)))
    if changed:
        raise ValueError(f"give config or the settings {changed}, not both")
    return config


def _is_default(value: Any, default: Any) -> bool:
    """Whether a setting as given is its default (values compared only for scalars)."""
    scalar = isinstance(value, (bool, int, float, str, enum.Enum))
    return value is default or (default is not None and scalar and value == default)


def _check_choices(config: TieredConfig) -> None:
    if config.pooling_mode not in _POOLING_MODES:
        raise ValueError(f"pooling_mode={config.pooling_mode} must be PoolingMode.SUM, MEAN or NONE")
    if config.cache_algorithm not in CACHE_ALGORITHMS:
        raise ValueError(f"cache_algorithm={config.cache_algorithm!r} must be 'lru', 'lfu' or 'tinylfu'")


def _tier(tier: Any) -> Union[Tier, Tuple[Tier, ...]]:
    """One Tier for every table, or a tuple of one per table."""
    if isinstance(tier, Tier):
        return tier
    tiers = tuple(tier) if isinstance(tier, Iterable) and not isinstance(tier, str) else ()
    if not tiers or not all(isinstance(t, Tier) for t in tiers):
        raise ValueError(f"tier={tier!r} must be a torchrec_mtrains.Tier or one per table")
    return tiers


def _number(name: str, value: Any, lo: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < lo:
        raise ValueError(f"{name}={value!r} must be a finite number >= {lo:g}")
    return float(value)


def _check_int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}={value!r} must be an integer {bounds}")


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _cache_rows(cache_rows: Any, load_factor: Any) -> Optional[Union[int, Tuple[int, ...]]]:
    if cache_rows is not None and load_factor is not None:
        raise ValueError("give cache_rows or cache_load_factor, not both")
    if load_factor is not None and (
        isinstance(load_factor, bool) or not isinstance(load_factor, (int, float)) or not 0 < load_factor <= 1e6
    ):
        raise ValueError(f"cache_load_factor={load_factor!r} must be a number > 0")
    if cache_rows is None or _positive_int(cache_rows):
        return cache_rows
    sizes = tuple(cache_rows) if isinstance(cache_rows, Iterable) and not isinstance(cache_rows, str) else None
    if not sizes or not all(_positive_int(s) for s in sizes):
        raise ValueError(f"cache_rows={cache_rows!r} must be a positive int or one per table")
    return sizes


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    )


def _init_range(init_range: Any) -> Optional[Union[InitRange, Tuple[InitRange, ...]]]:
    """One (lo, hi) tuple for every table, or a tuple of one per table."""
    if init_range is None:
        return None
    single = _is_pair(init_range)
    ranges = [init_range] if single else list(init_range) if isinstance(init_range, Iterable) else None
    if not ranges or not all(
        isinstance(r, (list, tuple)) and len(r) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in r
        ) and r[0] <= r[1]
        for r in ranges
    ):
        raise ValueError(f"init_range={init_range!r} must be one (lo, hi) or one per table, finite, lo <= hi")
    pairs = tuple((float(r[0]), float(r[1])) for r in ranges)
    return pairs[0] if single else pairs


def _table_names(names: Any) -> Optional[Tuple[str, ...]]:
    if names is None:
        return None
    names = (names,) if isinstance(names, str) or not isinstance(names, Iterable) else tuple(names)
    if len(set(names)) != len(names) or not all(isinstance(x, str) and x and "/" not in x for x in names):
        raise ValueError(f"table_names={list(names)!r} must be distinct non-empty names without '/'")
    return names


def _storage_dir(storage_dir: Any) -> Optional[str]:
    if storage_dir is None:
        return None
    if not isinstance(storage_dir, (str, os.PathLike)):
        raise ValueError(f"storage_dir={storage_dir!r} must be a path (str or os.PathLike)")
    return os.fspath(storage_dir)


def _feature_table_map(feature_table_map: Any) -> Optional[Tuple[int, ...]]:
    """As a tuple; its table numbers are checked against the tables by the kernel."""
    if feature_table_map is None:
        return None
    if isinstance(feature_table_map, str) or not isinstance(feature_table_map, Iterable):
        raise ValueError(f"feature_table_map={feature_table_map!r} must be a sequence of table numbers")
    return tuple(feature_table_map)


def _virtual_tables(specs: Any) -> Optional[Tuple[Optional[VirtualTableSpec], ...]]:
    """As a tuple of one VirtualTableSpec or None per table; the number of tables is
    checked by the kernel."""
    if specs is None:
        return None
    if isinstance(specs, (str, VirtualTableSpec)) or not isinstance(specs, Iterable):
        raise ValueError(f"virtual_tables={specs!r} must be a sequence of VirtualTableSpec or None, one per table")
    specs = tuple(specs)
    if not all(s is None or isinstance(s, VirtualTableSpec) for s in specs):
        raise ValueError("virtual_tables must hold a VirtualTableSpec or None per table")
    return specs if any(s is not None for s in specs) else None


DEFAULTS = TieredConfig()
"""Every setting at its default: ``TieredEmbeddingBags``' defaults."""
