"""The perf model: what one table costs a step on a tier with a cache of a given size.

Per step (global batch ``B``), a table with pooling factor ``pf`` pools ``B * pf`` rows in
FBGEMM's TBE and updates its ``U`` distinct rows (compute: each at its measured rate).
On a backing tier behind a cache with hit rate ``h``, the ``U * (1 - h)`` misses are read
from the tier and as many evicted rows are written back (training dirties every row it
touches), except that on a lazy tier (SSD) a row's first miss in the run reads nothing: a
table that gives ``rows_written`` over ``run_steps`` has that many first touches a step
fewer reads (in a 1,000-step run of the beyond-RAM preset, 4 of every 5 misses of its
400M-row table); the device time is the larger of bytes over bandwidth and accesses over IOPS,
each access costing at least the tier's access unit. On a GPU node, the misses also cross
the host-device link; on a CPU node, moving them (copies, checksums, I/O submission) also
takes the rank's CPU. The prefetch pipeline overlaps tier I/O with compute, so a rank's
step takes the larger of its compute and its busiest tier.

A sequence table (an EmbeddingCollection's: a row per id out) also writes its output, ``B *
pf`` rows of ``dim`` fp32, and its output distribution moves them: their bytes, twice, at the
TBE's rate. A bag's pooled output (``pf`` times smaller) is left out.

A tiered table adds the kernel's own cost: a fixed cost per step and a cost per lookup on
the step's critical path, and its worker threads' CPU (prefetch plan, row I/O) per step and
per lookup. On a CPU node those threads share the rank's cores with the step, whose
operators (TBE, dense) use all of them while they run: the worker threads' CPU seconds
lengthen the step by themselves over the rank's cores (``TieredTopology.cores_per_rank``).
With one core per rank they add in full; with many they mostly hide.

The dense part costs, per rank, each weight matrix's multiply-accumulates and outputs per
sample of the rank's batch and a fixed cost per matrix and step (``dense_step_seconds``,
from the model's ``DenseSpec``), or the profile's ``dense_time_per_sample`` for a model
whose dense layers the planner was not given; the training framework adds a fixed cost per
step, one per table of the model (every rank handles every feature of its batch) and one
per byte of a sample's pooled outputs (the output all-to-all and the interaction grow with
the dimension), and the model's input pipeline its cost per sample
(``ModelSpec.input_s_per_sample``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict

from torchrec_mtrains.planner.model.model_spec import ModelSpec, ModelTable
from torchrec_mtrains.planner.types import TieredTopology, TierSpec
from torchrec_mtrains.types import Tier

__all__ = ["TableCost", "dense_step_seconds", "kernel_step_seconds", "table_cost", "step_seconds"]


@dataclasses.dataclass(frozen=True)
class TableCost:
    """One table's share of a step, summed over its shards."""

    compute_s: float  # TBE + cache management
    io_s: Dict[Tier, float]  # device busy time per tier
    hit_rate: float
    tier_bytes_per_step: float  # rows moved to and from the backing tier


def _device_seconds(spec: TierSpec, rows: float, row_bytes: int, write: bool, appended: bool = False) -> float:
    """Device time to read or write ``rows`` random rows. ``appended``: writes of the SSD
    tier's log-structured BlockStore, which packs written rows into appended segments, so
    they cost their bytes at the tier's write bandwidth (row bytes appended per second, write
    amplification included) rather than one random block each."""
    if rows <= 0:
        return 0.0
    if write and appended:
        return rows * row_bytes / spec.write_bytes_per_s
    bw = spec.write_bytes_per_s if write else spec.read_bytes_per_s
    iops = spec.write_iops if write else spec.read_iops
    units = math.ceil(row_bytes / spec.access_bytes)
    t = rows * units * spec.access_bytes / bw
    if iops:
        t = max(t, rows * units / iops)
    return t


def table_cost(
    table: ModelTable,
    tier: Tier,
    cache_rows: float,
    topo: TieredTopology,
    batch_size: int,
    policy: str = "lru",
    l2_rows: float = 0.0,
) -> TableCost:
    """Cost of ``table`` with its rows on ``tier``; ``cache_rows`` = 0 means the table is
    whole in the compute tier (no cache). ``l2_rows``: on a GPU node, a host-DRAM cache of
    a SCM/SSD table under the HBM one (inclusive: its hits are the L1 misses it holds)."""
    lookups = batch_size * table.pooling_factor
    unique = min(table.locality.unique_rows_per_step, table.num_embeddings)  # at the model's batch
    spec = topo.compute
    compute = lookups * table.row_bytes / spec.tbe_bytes_per_s
    if table.sequence:  # its output: a row per id, written, then moved by the output dist
        compute += 2 * lookups * table.embedding_dim * 4 / spec.tbe_bytes_per_s
    if spec.tbe_row_update_bytes_per_s:
        compute += unique * table.row_bytes / spec.tbe_row_update_bytes_per_s
    io: Dict[Tier, float] = {}
    if cache_rows <= 0:
        return TableCost(compute, io, 1.0, 0.0)
    # The kernel's cache never holds fewer than the two steps in flight (it grows an
    # overflow pool instead), whatever size it was given.
    effective = min(float(table.num_embeddings), max(cache_rows, 2.0 * unique))
    hit = table.locality.hit_rate(effective, policy)
    misses = unique * (1.0 - hit)
    # The kernel's fixed cost per step is the rank's, not the table's: a rank's tiered tables
    # share one kernel (``kernel_step_seconds``).
    compute += spec.cache_row_s * unique + spec.lookup_s * lookups
    background = spec.step_background_cpu_s + spec.lookup_background_cpu_s * lookups  # worker threads
    dev = topo.tiers[tier]
    device_misses = misses
    if l2_rows > effective and topo.compute_device == "cuda" and tier in (Tier.SCM, Tier.SSD):
        device_misses = unique * (1.0 - table.locality.hit_rate(min(float(table.num_embeddings), l2_rows), policy))
        dram = topo.tiers[Tier.DRAM]
        io[Tier.DRAM] = _device_seconds(dram, misses, table.row_bytes, False) + _device_seconds(
            dram, misses, table.row_bytes, True)
    # A row's first miss in the run reads nothing from a lazy tier (it is initialised in
    # place); its write-back when evicted is paid like any other.
    reads = max(0.0, device_misses - table.first_touches_per_step(tier))
    io[tier] = _device_seconds(dev, reads, table.row_bytes, False) + _device_seconds(
        dev, device_misses, table.row_bytes, True, appended=tier is Tier.SSD)
    if topo.compute_device == "cpu":  # the worker threads and their row moves share the rank's cores
        row_moves = reads * dev.cpu_per_miss() + (device_misses - reads) * dev.cpu_per_first_touch()
        compute += (background + row_moves) / topo.cores_per_rank()
    if topo.compute_device == "cuda" and topo.host_device_bytes_per_s:
        link = 2 * misses * table.row_bytes / topo.host_device_bytes_per_s
        io[Tier.HBM] = io.get(Tier.HBM, 0.0) + link  # the link, accounted under the cache tier
    return TableCost(compute, io, hit, 2 * misses * table.row_bytes)


def kernel_step_seconds(topo: TieredTopology, any_tiered: bool) -> float:
    """A rank's fixed cost per step of its tiered tables: one kernel (one TBE and one cache
    plan call) holds all of them, whatever their tiers."""
    return topo.compute.step_overhead_s if any_tiered else 0.0


def step_seconds(compute_s: float, io_s: Dict[Tier, float], dense_s: float) -> float:
    """A rank's step: compute (embeddings + dense) overlapped with each tier's I/O."""
    return max([compute_s + dense_s] + list(io_s.values()))


def dense_step_seconds(model: ModelSpec, topo: TieredTopology, world_size: int) -> float:
    """Seconds a rank spends per step on the dense part (forward, backward, optimizer) of
    its ``model.batch_size / world_size`` samples and on the training framework: the dense
    layers from the model's ``DenseSpec`` and the profile's per-MAC, per-output and
    per-layer costs when both are known, else the profile's ``dense_time_per_sample``; the
    framework's fixed cost per step and its cost per table (a fixed part and a part per
    sample of the rank's batch) and per byte of a sample's pooled outputs (a sequence
    table's output is charged with its lookups, ``table_cost``); the input pipeline's cost
    of the rank's samples."""
    spec, dense = topo.compute, model.dense
    samples = model.batch_size / world_size
    per_table = spec.framework_table_s + spec.framework_table_sample_s * samples
    pooled_bytes = sum(4 * t.embedding_dim for t in model.tables if not t.sequence)  # a sample's bags' outputs
    framework = (spec.framework_step_s + per_table * len(model.tables) + samples * model.input_s_per_sample
                 + samples * pooled_bytes * spec.framework_output_byte_s)
    if dense is None or not (spec.dense_mac_s or spec.dense_activation_s or spec.dense_layer_s):
        return spec.dense_s_per_sample * samples + framework
    per_sample = dense.macs_per_sample * spec.dense_mac_s + dense.outputs_per_sample * spec.dense_activation_s
    return samples * per_sample + dense.layers * spec.dense_layer_s + framework
