"""Value types of the planner: the hardware a plan targets and the tables it places.

Capacities and rates are per rank and keyed by ``Tier``: adding a tier adds a map entry,
not a field.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Tuple

from torchrec_mtrains.types import Tier

__all__ = ["TierSpec", "ComputeSpec", "TieredTopology", "TablePlacement", "RankAssignment"]


@dataclasses.dataclass(frozen=True)
class TierSpec:
    """One tier of one rank.

    Args:
        capacity_bytes: bytes the rank may use for embeddings on this tier.
        read_bytes_per_s, write_bytes_per_s: sustained bandwidth for the kernel's access
            pattern (random rows). SSD writes are appended by the log-structured block
            store: there ``write_bytes_per_s`` is the row bytes it appends per second
            (the device's sequential write rate over the store's write amplification).
        read_iops, write_iops: random accesses per second (block tiers; None where the
            bandwidth alone bounds it).
        access_bytes: the unit one row access costs at least (64 for byte-addressable
            memory, the block size for block storage).
        row_cpu_s: host CPU seconds per row moved to or from the tier (copying, checksums,
            I/O submission); on a CPU node it shares the rank's cores with compute.
        miss_cpu_s: host CPU seconds per row the kernel loads from the tier (read, checksum,
            copy into its slot: the row path's loads as ``cache_stats()`` counts them);
            None: ``row_cpu_s``.
        write_back_cpu_s: host CPU seconds per evicted row the kernel writes back to the
            tier; None: ``row_cpu_s``.
        first_touch_cpu_s: host CPU seconds per row a lazy tier (SSD) makes on its first
            miss in a run (its slot planned, the row initialised in place, no read);
            None: ``miss_cpu_s``'s load cost.
    """

    capacity_bytes: float
    read_bytes_per_s: float
    write_bytes_per_s: float
    read_iops: Optional[float] = None
    write_iops: Optional[float] = None
    access_bytes: int = 64
    row_cpu_s: float = 0.0
    miss_cpu_s: Optional[float] = None
    write_back_cpu_s: Optional[float] = None
    first_touch_cpu_s: Optional[float] = None

    def cpu_per_miss(self) -> float:
        """Host CPU seconds one miss costs the row path: its load and its eviction's
        write-back (every miss of a full cache displaces a row; a clean one is not
        written, so this is an upper bound there)."""
        return self.load_cpu() + self.write_back_cpu()

    def cpu_per_first_touch(self) -> float:
        """Host CPU seconds a row's first miss costs the row path: made in place, and its
        eviction's write-back."""
        made = self.load_cpu() if self.first_touch_cpu_s is None else self.first_touch_cpu_s
        return made + self.write_back_cpu()

    def load_cpu(self) -> float:
        """Host CPU seconds one row's load from the tier costs the row path."""
        return self.row_cpu_s if self.miss_cpu_s is None else self.miss_cpu_s

    def write_back_cpu(self) -> float:
        """Host CPU seconds one evicted row's write-back costs the row path."""
        return self.row_cpu_s if self.write_back_cpu_s is None else self.write_back_cpu_s


@dataclasses.dataclass(frozen=True)
class ComputeSpec:
    """What one rank's embedding compute costs (the perf model's calibration).

    Args:
        tbe_bytes_per_s: row bytes per second of the lookups FBGEMM's TBE pools (forward
            and the gradient's pooling, rows hot in the CPU/GPU caches).
        tbe_row_update_bytes_per_s: row bytes per second of the distinct rows a step
            updates (the fused optimizer: random reads and writes of weights and state);
            0 folds that cost into ``tbe_bytes_per_s``.
        step_overhead_s: fixed cost of a step of one tiered kernel (plan, bookkeeping) on
            the step's critical path, seconds.
        cache_row_s: cost of cache management per unique row a step touches, seconds.
        dense_s_per_sample: the dense part (MLPs, loss) per sample, seconds: what a model
            whose dense layers the planner does not know costs.
        lookup_s: a tiered kernel's cost per lookup on the critical path beyond FBGEMM's
            (splitting, remapping), seconds.
        step_background_cpu_s: CPU seconds a tiered kernel's worker threads (prefetch
            plan, row I/O) take per step beyond what shows on the critical path; on a CPU
            node it competes with the step for the rank's cores.
        lookup_background_cpu_s: the same per lookup, seconds.
        dense_mac_s: seconds per multiply-accumulate of a dense layer, per sample, for a
            training step (forward, backward, optimizer); 0: use ``dense_s_per_sample``.
        dense_activation_s: seconds per output value of a dense layer, per sample
            (bias, activation, their gradients).
        dense_layer_s: fixed seconds per dense layer per step (op dispatch, optimizer).
        framework_step_s: the training framework's fixed seconds per step and rank beyond
            lookups and dense layers (the sharded collection's input and output
            distribution, interaction, loss, gradient reduction, the train pipeline).
        framework_table_s: the framework's seconds per step and rank per table of the model,
            beyond ``framework_table_sample_s``.
        framework_table_sample_s: the framework's seconds per step and rank per table and
            per sample of the rank's batch (each table's KeyedJaggedTensor slice, pooled
            output, interaction input and their gradients grow with the batch), beyond
            ``framework_output_byte_s``.
        framework_output_byte_s: the framework's seconds per step and rank per byte of a
            bag table's pooled output for a sample of the rank's batch (fp32, ``4 * dim``):
            the output all-to-all, the interaction and their gradients grow with the
            dimension, not only with the tables and the batch.
        row_wise_group_s: seconds per step on every rank for each row-wise table: the
            collectives of the row-wise sharding group (the ids' all-to-all, the pooled
            embeddings' reduce-scatter and its gradient) grow with every table it holds.
        row_wise_setup_s: seconds per step on every rank once any table is row-wise: what
            the row-wise sharding group's collectives cost whatever tables it holds.
    """

    tbe_bytes_per_s: float
    step_overhead_s: float = 0.0
    cache_row_s: float = 0.0
    dense_s_per_sample: float = 0.0
    tbe_row_update_bytes_per_s: float = 0.0
    lookup_s: float = 0.0
    step_background_cpu_s: float = 0.0
    lookup_background_cpu_s: float = 0.0
    dense_mac_s: float = 0.0
    dense_activation_s: float = 0.0
    dense_layer_s: float = 0.0
    framework_step_s: float = 0.0
    framework_table_s: float = 0.0
    framework_table_sample_s: float = 0.0
    row_wise_group_s: float = 0.0
    row_wise_setup_s: float = 0.0
    framework_output_byte_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class TieredTopology:
    """A training node type: ranks per node, each rank's tiers and compute.

    ``tiers`` holds the tiers a rank has (absent = none). ``compute_device`` is "cpu" or
    "cuda"; the cache of a tiered table lives in the fastest tier of the device (HBM on
    cuda, DRAM on cpu). ``host_device_bytes_per_s``: the host-device link (PCIe), cuda only.
    ``cores_per_node``: CPU cores of the node (None: unknown; a CPU node is then costed as
    one core per rank).
    """

    name: str
    compute_device: str
    ranks_per_node: int
    tiers: Mapping[Tier, TierSpec]
    compute: ComputeSpec
    host_device_bytes_per_s: Optional[float] = None
    source: str = ""  # where the figures come from (measured by probe-hw, a spec sheet, ...)
    cores_per_node: Optional[int] = None

    def cache_tier(self) -> Tier:
        return Tier.HBM if self.compute_device == "cuda" else Tier.DRAM

    def cores_per_rank(self) -> float:
        """CPU cores one rank has: the node's over its ranks (1 when the profile gives none)."""
        return self.cores_per_node / self.ranks_per_node if self.cores_per_node else 1.0


@dataclasses.dataclass(frozen=True)
class TablePlacement:
    """Where the planner put a table and what it predicts for it."""

    table: str
    tier: Tier
    cache_rows: int  # 0: the whole table is in the tier the kernel computes on
    hit_rate: float
    bandwidth_bytes_per_s: float  # the table's traffic to its tier at the target QPS
    ranks: Tuple[int, ...] = ()
    extra: Dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RankAssignment:
    """Where a plan put a table: its sharding type and the ranks of its shards."""

    sharding_type: str  # "table_wise" or "row_wise"
    ranks: Tuple[int, ...]
