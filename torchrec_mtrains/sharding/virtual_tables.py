"""Virtual tables in TorchRec's vocabulary, trained on the tiered kernel on the CPU.

TorchRec marks a table virtual in its config (``use_virtual_table=True``,
``total_num_buckets``, ``virtual_table_eviction_policy``) and plans it with one of three
compute kernels, which FBGEMM runs on CUDA only. Here they run on the tiered kernel
(``kernels/virtual_rows.py``):

| compute kernel | rows live on |
| --- | --- |
| ``dram_virtual_table`` | Tier.DRAM |
| ``ssd_virtual_table`` | Tier.SSD (the block store), ``KeyValueParams`` as for ``key_value`` |
| ``dram_ssd_virtual_table`` | Tier.SSD with the block store's DRAM cache (``l2_cache_size``, default 1 GB) |

Each plan entry becomes a ``TieredParameterSharding`` (CUSTOMIZED_KERNEL) before TorchRec
shards the module; the kernel then reads the table's config to make it virtual. Row-wise
sharding is TorchRec's by buckets: ``total_num_buckets`` split over the ranks in runs, each
rank's ids local to its run.

Every field of the eviction policies is honoured, ignored with one warning naming it, or
refused with a ValueError where ignoring it would change what training computes (the
registries below; docs/virtual-tables.md has the table).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ParameterSharding
from torchrec.modules.embedding_configs import (
    CountBasedEvictionPolicy,
    CountTimestampMixedEvictionPolicy,
    FeatureL2NormBasedEvictionPolicy,
    NoEvictionPolicy,
    TimestampBasedEvictionPolicy,
    VirtualTableEvictionPolicy,
)

from torchrec_mtrains.kernels.virtual_rows import EvictionSpec
from torchrec_mtrains.types import Tier

__all__ = ["DEFAULT_VIRTUAL_ROWS", "VIRTUAL_KERNELS", "eviction_spec_of", "virtual_shard_rows"]

VIRTUAL_KERNELS: Mapping[str, Tier] = {
    EmbeddingComputeKernel.DRAM_VIRTUAL_TABLE.value: Tier.DRAM,
    EmbeddingComputeKernel.SSD_VIRTUAL_TABLE.value: Tier.SSD,
    EmbeddingComputeKernel.DRAM_SSD_VIRTUAL_TABLE.value: Tier.SSD,
}
"""TorchRec's virtual-table compute kernels -> the tier their rows live on here."""
DRAM_SSD_CACHE_GB = 1.0
"""``dram_ssd_virtual_table``'s block-store DRAM cache when ``l2_cache_size`` is unset."""
DEFAULT_VIRTUAL_ROWS = 1 << 20
"""Rows (live ids) of a virtual table shard when neither ``TieredParams.virtual_rows`` nor
the policy's ``training_id_eviction_trigger_count`` sizes it."""

# Fields TorchRec itself sets on every policy (the metadata header FBGEMM keeps in a row):
# nothing for a user to set.
_INTERNAL = frozenset({"meta_header_len", "embedding_dim", "initialized"})
_HONOURED: Mapping[type, frozenset] = {
    NoEvictionPolicy: frozenset(),
    CountBasedEvictionPolicy: frozenset({"training_id_eviction_trigger_count", "eviction_threshold", "decay_rate"}),
    TimestampBasedEvictionPolicy: frozenset({"training_id_eviction_trigger_count", "eviction_ttl_mins"}),
    CountTimestampMixedEvictionPolicy: frozenset({"training_id_eviction_trigger_count", "eviction_threshold",
                                                  "decay_rate", "eviction_ttl_mins"}),
    FeatureL2NormBasedEvictionPolicy: frozenset({"training_id_eviction_trigger_count", "eviction_threshold"}),
}
# Ignored, with why (one warning per field): they act when a model is published for
# inference, which this plugin does not do; training computes the same without them.
_IGNORED: Mapping[str, str] = {
    "inference_eviction_threshold": "it applies when a model is published for inference",
    "inference_eviction_ttl_mins": "it applies when a model is published for inference",
    "max_inference_id_num_per_rank": "it caps the ids a model keeps when published for inference",
}
# Policies refused, with why: their rules need what the CPU kernels do not keep yet.
_REFUSED: Mapping[str, str] = {
    "FeatureScoreBasedEvictionPolicy": "feature-score eviction needs per-id scores from the input's weights, "
                                       "which the CPU kernels do not collect yet; use a count or timestamp policy",
}


def _default_of(policy: Any, name: str) -> Any:
    """A field's value as the policy's own __post_init__ would make it from defaults."""
    linked = {"inference_eviction_threshold": "eviction_threshold",
              "inference_eviction_ttl_mins": "eviction_ttl_mins"}
    if name in linked:
        return getattr(policy, linked[name])
    field = next(f for f in dataclasses.fields(policy) if f.name == name)
    return field.default if field.default is not dataclasses.MISSING else None


def eviction_spec_of(table: str, policy: Optional[VirtualTableEvictionPolicy],
                     notes: Optional[Dict[str, Tuple[str, List[str]]]] = None) -> EvictionSpec:
    """The tiered kernel's eviction of a table with TorchRec's ``policy`` (None: none).

    Args:
        table: the table's name (messages).
        policy: its ``virtual_table_eviction_policy``.
        notes: collects the fields ignored (field -> (why, tables)), for one warning each.

    Raises:
        ValueError: a policy refused here, or a bad value, naming it.
    """
    if policy is None:
        return EvictionSpec()
    kind = type(policy)
    if kind.__name__ in _REFUSED:
        raise ValueError(f"table {table}: {kind.__name__} is not supported on the CPU ({_REFUSED[kind.__name__]})")
    if kind not in _HONOURED:
        raise ValueError(f"table {table}: virtual_table_eviction_policy {kind.__name__} is not known to the "
                         "tiered kernel; use NoEvictionPolicy, CountBasedEvictionPolicy, "
                         "TimestampBasedEvictionPolicy, CountTimestampMixedEvictionPolicy or "
                         "FeatureL2NormBasedEvictionPolicy")
    notes = {} if notes is None else notes
    for f in dataclasses.fields(policy):
        value = getattr(policy, f.name)
        if f.name in _INTERNAL or f.name in _HONOURED[kind] or value == _default_of(policy, f.name):
            continue
        why = _IGNORED.get(f.name, "the tiered kernel has no such setting")
        notes.setdefault(f"{kind.__name__}.{f.name}", (why, []))[1].append(table)
    trigger = getattr(policy, "training_id_eviction_trigger_count", 0) or 0
    if (isinstance(trigger, bool) or not isinstance(trigger, (int, float)) or not math.isfinite(trigger)
            or trigger < 0 or trigger != int(trigger)):
        raise ValueError(f"table {table}: {kind.__name__}: training_id_eviction_trigger_count={trigger!r} must be "
                         "a whole number >= 0")
    trigger = int(trigger)
    if kind is FeatureL2NormBasedEvictionPolicy:  # FBGEMM's L2WeightBasedEvict: a rule of its own
        l2 = policy.eviction_threshold
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not math.isfinite(l2) or l2 < 0:
            raise ValueError(f"table {table}: {kind.__name__}: eviction_threshold={l2!r} must be a finite "
                             "L2 norm >= 0 (0: no eviction)")
        return EvictionSpec(trigger_ids=trigger, l2_threshold=float(l2))
    threshold = float(getattr(policy, "eviction_threshold", 0) or 0)
    decay = float(getattr(policy, "decay_rate", 1.0))
    ttl_mins = int(getattr(policy, "eviction_ttl_mins", 0) or 0)
    try:
        return EvictionSpec(trigger_ids=trigger, count_threshold=threshold, decay_rate=decay,
                            ttl_seconds=ttl_mins * 60)
    except ValueError as e:
        raise ValueError(f"table {table}: {kind.__name__}: {e}") from None


def warn_ignored(notes: Dict[str, Tuple[str, List[str]]]) -> None:
    """One warning per ignored policy field, naming its tables."""
    for field, (why, tables) in sorted(notes.items()):
        warnings.warn(f"{field} is ignored for virtual tables {', '.join(sorted(set(tables)))} on the tiered "
                      f"kernel: {why}", stacklevel=3)


def virtual_shard_rows(table: str, virtual_rows: Optional[int], eviction: EvictionSpec, local_rows: int,
                       num_embeddings: int) -> int:
    """Rows (live ids) of a shard of a virtual table of ``num_embeddings`` ids holding
    ``local_rows`` of them: its share of ``virtual_rows`` (the whole table's), else room
    for the policy's trigger (per rank) and a quarter more, else ``DEFAULT_VIRTUAL_ROWS``
    (with a warning). Never more than the shard's ids."""
    if virtual_rows is not None:
        rows = math.ceil(virtual_rows * local_rows / num_embeddings)
    elif eviction.trigger_ids:
        rows = eviction.trigger_ids + max(eviction.trigger_ids // 4, 4096)
    else:
        rows = DEFAULT_VIRTUAL_ROWS
        if local_rows > rows:
            warnings.warn(f"virtual table {table}: neither TieredParams.virtual_rows nor the eviction policy's "
                          f"training_id_eviction_trigger_count sizes it; each shard holds up to {rows} live ids",
                          stacklevel=3)
    return max(1, min(rows, local_rows))


def virtual_kernel_entries(params: Mapping[str, ParameterSharding]) -> List[str]:
    """The tables whose plan entry asks for a virtual-table compute kernel."""
    return [name for name, ps in params.items() if ps.compute_kernel in VIRTUAL_KERNELS]
