"""Virtual tables in the StorageAwarePlanner: sized by the ids they hold, not their id space.

A virtual table (``use_virtual_table=True``) names a space of ids far larger than it will
ever hold (2^40, 2^62); its rows are made on first use and evicted by its policy
(docs/virtual-tables.md). The planner therefore sizes it by its live ids, from the first
of:

1. ``locality[name]["live_ids"]``: the live ids of the whole table, given;
2. a trace (``locality[name]["trace"]``): the most distinct ids the trace looks up in any
   window of W consecutive steps (``stats.distinct_ids_in_windows``), where
   - the policy has a TTL (``eviction_ttl_mins`` of TimestampBasedEvictionPolicy or
     CountTimestampMixedEvictionPolicy) and the planner has a rate (``target_qps`` /
     ``batch_size`` steps per second): W = floor(TTL seconds x steps per second) + 1, the
     steps an id stays live after its last lookup and the step looking it up. Not capped by
     the trigger: a pass keeps every id looked up within the TTL. (The mixed policy also
     keeps older ids its count holds: give ``live_ids`` where those matter.)
   - otherwise (a count policy, no TTL, no ``target_qps``): the whole trace's distinct ids,
     capped by rule 3's live ids when the policy has a trigger (its passes keep the live
     ids near the trigger).
   The planner reads the trace once and hands it on for the table's locality curve;
3. the policy's ``training_id_eviction_trigger_count`` (live ids per rank before an
   eviction pass) times the ranks, with the room a shard keeps above it
   (``virtual_shard_rows``);
4. ``DEFAULT_VIRTUAL_ROWS`` per rank, with a warning.

Never more than the table's ``num_embeddings``. A trace's ids are the table's raw ids, any
int64 values: they are counted as they are, not folded into ``num_embeddings``.

Its rows then go on a tier like any table's (a constraint naming a virtual-table kernel
pins that kernel's tier), behind a row cache, and its id index (at most
``INDEX_BYTES_PER_ID`` per live id, csrc/kernel/id_index.h) counts in host DRAM.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Optional

from torchrec_mtrains.kernels.virtual_rows import EvictionSpec
from torchrec_mtrains.planner.model.model_spec import ModelTable
from torchrec_mtrains.sharding.virtual_tables import DEFAULT_VIRTUAL_ROWS, eviction_spec_of, virtual_shard_rows
from torchrec_mtrains.stats.types import TableTrace
from torchrec_mtrains.stats.windows import distinct_ids_in_windows

__all__ = ["INDEX_BYTES_PER_ID", "as_virtual", "trace_live_ids", "virtual_live_ids"]

INDEX_BYTES_PER_ID = 16.0
"""Host DRAM of a virtual table's id index per live id (its bound; 13-16 B measured)."""


def virtual_live_ids(config: Any, live_ids: Optional[Any], world_size: int, trace: Optional[TableTrace] = None,
                     steps_per_second: Optional[float] = None) -> int:
    """The live ids a virtual table (TorchRec ``config``) holds across ``world_size`` ranks.

    Args:
        config: the table's ``EmbeddingBagConfig``.
        live_ids: ``locality[name]["live_ids"]`` (None: not given).
        world_size: ranks.
        trace: the table's trace, in steps of the planner's batch (None: none).
        steps_per_second: the training steps a second the job runs at (None: unknown), to
            turn a TTL into steps.

    Raises:
        ValueError: a bad ``live_ids`` or ``steps_per_second``, or a policy the tiered kernel
            refuses.
    """
    name = config.name
    if live_ids is not None:
        if isinstance(live_ids, bool) or not isinstance(live_ids, int) or live_ids < 1:
            raise ValueError(f"locality[{name!r}].live_ids={live_ids!r} must be a positive int")
        return min(int(live_ids), int(config.num_embeddings))
    eviction = eviction_spec_of(name, config.virtual_table_eviction_policy)
    per_rank = config.num_embeddings // max(1, world_size)
    bound = None
    if eviction.trigger_ids:
        bound = virtual_shard_rows(name, None, eviction, per_rank, config.num_embeddings) * world_size
    if trace is not None:
        return min(int(config.num_embeddings), trace_live_ids(name, trace, eviction, steps_per_second, bound))
    if bound is None:
        warnings.warn(f"virtual table {name}: neither locality[{name!r}]['live_ids'], a trace nor its eviction "
                      f"policy's training_id_eviction_trigger_count sizes it; planned for {DEFAULT_VIRTUAL_ROWS} "
                      "live ids per rank", stacklevel=3)
        return min(int(config.num_embeddings), DEFAULT_VIRTUAL_ROWS * world_size)
    return min(int(config.num_embeddings), bound)


def trace_live_ids(name: str, trace: TableTrace, eviction: EvictionSpec, steps_per_second: Optional[float],
                   bound: Optional[int]) -> int:
    """A virtual table's live ids from its ``trace`` under ``eviction`` (rule 2 of the module
    docstring); ``bound``: the trigger's live ids for the whole table (None: no trigger)."""
    if steps_per_second is not None and (isinstance(steps_per_second, bool)
                                         or not isinstance(steps_per_second, (int, float))
                                         or not 0 < steps_per_second < math.inf):
        raise ValueError(f"virtual table {name}: steps_per_second={steps_per_second!r} must be a finite number > 0")
    if eviction.ttl_seconds and steps_per_second is not None:
        window = math.floor(eviction.ttl_seconds * steps_per_second) + 1
        return max(1, distinct_ids_in_windows(trace, window))
    whole = max(1, distinct_ids_in_windows(trace, max(1, trace.num_steps)))
    return whole if bound is None else min(whole, bound)


def as_virtual(table: ModelTable) -> ModelTable:
    """``table`` (already sized by its live ids) as a virtual table: its index in DRAM, all
    its rows written (each live id's row exists once it is made)."""
    return dataclasses.replace(table, virtual=True, index_bytes_per_row=INDEX_BYTES_PER_ID, rows_written=None)
