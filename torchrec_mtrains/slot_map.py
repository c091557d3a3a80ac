"""The cache index's dense row-to-slot map: what it costs and which tables it pays on.

A tiered table's cache index (``csrc/cache/set_associative_cache.h``) finds a row's cache
slot by scanning the tags of the row's 32-way set (4 cache lines), then touches the slot's
state (a fifth). With a dense map -- one 32-bit entry per table row holding the row's slot --
a lookup is one load and an all-hit plan touches 2 cache lines per id: the plan of an
all-hit batch costs about half as much (``benchmarks/bench_plan.py``: 4.9-5.4 against
9.8-10.6 CPU ns per id at 1M cached rows of a 1M-row table). Plans are the same with and
without it; only their speed differs.

The map takes ``DENSE_MAP_BYTES_PER_ROW`` bytes of host DRAM per *table* row whatever the
cache's size, so it pays where those bytes are small beside what the cache itself takes: the
rule (``dense_map_pays``) keeps one where the map's bytes are at most
``DENSE_MAP_MAX_SHARE`` of the cache slots' row bytes (row bytes x slots). A table with a
cache of a fifth of its rows (the default load factor) gets it from 160-byte rows on (dim 40
in fp32 with row-wise Adagrad); a cache of 1% of the rows, from 3,200-byte rows. The rule is
a ratio, so a table's shards (row-wise: rows and cache split alike) decide as the whole table.

``TieredConfig.dense_slot_map`` forces the map on or off for every table of a kernel; the
``StorageAwarePlanner`` counts the map's bytes in host DRAM wherever the rule picks it.

Imports neither torch nor the extension: the planner's model code uses it too.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "DENSE_MAP_BYTES_PER_ROW",
    "DENSE_MAP_MAX_SHARE",
    "DENSE_MAP_MAX_SLOTS",
    "dense_map_bytes",
    "dense_map_pays",
    "uses_dense_map",
]

DENSE_MAP_BYTES_PER_ROW = 4
"""Bytes of the map per table row: a 32-bit slot (``SetAssociativeCache::kMapBytesPerRow``)."""
DENSE_MAP_MAX_SHARE = 0.125
"""The rule's bound: the map's bytes over the cache slots' row bytes."""
DENSE_MAP_MAX_SLOTS = 2**32 - 1
"""A cache with a map has fewer slots than this: its entries are 32-bit
(``SetAssociativeCache::kMaxMapSlots``)."""


def dense_map_bytes(num_rows: float) -> float:
    """Host-DRAM bytes of a dense map over a table of ``num_rows`` rows."""
    return float(num_rows) * DENSE_MAP_BYTES_PER_ROW


def dense_map_pays(num_rows: float, cache_slots: float, row_bytes: float) -> bool:
    """Whether the rule keeps a dense map for a table of ``num_rows`` rows of ``row_bytes``
    bytes (weights + optimizer state, as stored) behind a cache of ``cache_slots`` slots: its
    bytes are at most ``DENSE_MAP_MAX_SHARE`` of the slots' row bytes."""
    if cache_slots <= 0 or cache_slots >= DENSE_MAP_MAX_SLOTS:
        return False
    return dense_map_bytes(num_rows) <= DENSE_MAP_MAX_SHARE * float(cache_slots) * float(row_bytes)


def uses_dense_map(setting: Optional[bool], num_rows: int, cache_slots: int, row_bytes: int,
                   table: str = "table") -> bool:
    """Whether a table's cache keeps a dense map under ``setting`` (``dense_slot_map``: None
    follows ``dense_map_pays``, True and False force it).

    Raises:
        ValueError: the map forced on over a cache of ``DENSE_MAP_MAX_SLOTS`` slots or more
            (naming the table).
    """
    if setting is None:
        return dense_map_pays(num_rows, cache_slots, row_bytes)
    if setting and cache_slots >= DENSE_MAP_MAX_SLOTS:
        raise ValueError(f"dense_slot_map=True: table {table}'s cache of {cache_slots} slots is too large for the "
                         f"map's 32-bit slots (at most {DENSE_MAP_MAX_SLOTS - 1})")
    return bool(setting)
