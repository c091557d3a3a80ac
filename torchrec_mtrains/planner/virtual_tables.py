"""Virtual tables in the StorageAwarePlanner: sized by the ids they hold, not their id space.

A virtual table (``use_virtual_table=True``) names a space of ids far larger than it will
ever hold (2^40, 2^62); its rows are made on first use and evicted by its policy
(docs/virtual-tables.md). The planner therefore sizes it by its live ids, from the first
of:

1. ``locality[name]["live_ids"]``: the live ids of the whole table, e.g. a trace's distinct
   ids over the policy's eviction window;
2. the policy's ``training_id_eviction_trigger_count`` (live ids per rank before an
   eviction pass) times the ranks, with the room a shard keeps above it;
3. ``DEFAULT_VIRTUAL_ROWS`` per rank, with a warning.

Its rows then go on a tier like any table's (a constraint naming a virtual-table kernel
pins that kernel's tier), behind a row cache, and its id index (at most
``INDEX_BYTES_PER_ID`` per live id, csrc/kernel/id_index.h) counts in host DRAM.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional

from torchrec_mtrains.planner.model.model_spec import ModelTable
from torchrec_mtrains.sharding.virtual_tables import DEFAULT_VIRTUAL_ROWS, eviction_spec_of, virtual_shard_rows

__all__ = ["INDEX_BYTES_PER_ID", "as_virtual", "virtual_live_ids"]

INDEX_BYTES_PER_ID = 16.0
"""Host DRAM of a virtual table's id index per live id (its bound; 13-16 B measured)."""


def virtual_live_ids(config: Any, live_ids: Optional[Any], world_size: int) -> int:
    """The live ids a virtual table (TorchRec ``config``) holds across ``world_size`` ranks.

    Raises:
        ValueError: a bad ``live_ids``, or a policy the tiered kernel refuses.
    """
    name = config.name
    if live_ids is not None:
        if isinstance(live_ids, bool) or not isinstance(live_ids, int) or live_ids < 1:
            raise ValueError(f"locality[{name!r}].live_ids={live_ids!r} must be a positive int")
        return min(int(live_ids), int(config.num_embeddings))
    eviction = eviction_spec_of(name, config.virtual_table_eviction_policy)
    per_rank = config.num_embeddings // max(1, world_size)
    if not eviction.trigger_ids:
        warnings.warn(f"virtual table {name}: neither locality[{name!r}]['live_ids'] nor its eviction policy's "
                      f"training_id_eviction_trigger_count sizes it; planned for {DEFAULT_VIRTUAL_ROWS} live ids "
                      "per rank", stacklevel=3)
        return min(int(config.num_embeddings), DEFAULT_VIRTUAL_ROWS * world_size)
    return min(int(config.num_embeddings),
               virtual_shard_rows(name, None, eviction, per_rank, config.num_embeddings) * world_size)


def as_virtual(table: ModelTable) -> ModelTable:
    """``table`` (already sized by its live ids) as a virtual table: its index in DRAM, all
    its rows written (each live id's row exists once it is made)."""
    return dataclasses.replace(table, virtual=True, index_bytes_per_row=INDEX_BYTES_PER_ID, rows_written=None)
