"""Shared helpers of the TieredEmbeddingBags tests: Zipf-distributed batches, FBGEMM's CPU
TBE with the whole table in DRAM as the reference, and drivers of the training loop.

The reference is ``SplitTableBatchedEmbeddingBagsCodegen`` (EmbeddingLocation.HOST,
ComputeDevice.CPU) with every row of every table in one host tensor, started from the
weights TieredEmbeddingBags starts from: ``lazy_init_rows(arange(rows), dim, 0,
(-1/sqrt(rows), 1/sqrt(rows)), seed * 1_000_003 + t, dtype)`` for table t. A reference run
depends only on the model config and the batches, so it is computed once per pair and shared
by every tier / cache / pipeline variant compared against it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.storage import lazy_init_rows

# Two tables of different sizes and dims (small, so 200 steps take about a second).
SPECS: Tuple[Tuple[int, int], ...] = ((1500, 8), (600, 16))
TOL = 1e-5  # allowed for fp32: max abs diff of outputs, weights, optimizer state
DTYPES = {SparseType.FP32: torch.float32, SparseType.FP16: torch.float16}
CACHE_STAT_KEYS = {
    "lookups", "unique_rows", "hits", "misses", "evictions", "overflow_assignments",
    "hit_rate", "rows_loaded", "rows_written_back", "bytes_read_from_tier",
    "bytes_written_to_tier", "plan_seconds", "tier_seconds", "cache_capacity_rows",
    "prefetch_wait_seconds", "steps_prefetched", "plan_cpu_ns_per_row", "write_back_cpu_ns_per_row",
    "read_cpu_ns_per_row", "verify_cpu_ns_per_row", "copy_cpu_ns_per_row", "cpu_ns_per_miss", "lookahead",
    "update_seconds",
}


@pytest.fixture(autouse=True)
def single_intra_op_thread():
    """One intra-op thread: these batches are tiny, and on a 2-core CI runner FBGEMM's and
    ATen's thread pools spinning against the prefetch thread cost 4x the CPU time."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclasses.dataclass(frozen=True)
class Model:
    """What both sides are built with."""

    specs: Tuple[Tuple[int, int], ...] = SPECS
    optimizer: EmbOptimType = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    pooling: PoolingMode = PoolingMode.SUM
    precision: SparseType = SparseType.FP32
    learning_rate: float = 0.05
    eps: float = 1e-8
    seed: int = 0

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A stream of Zipf-distributed batches (ids ~ rank^-alpha, ranks scattered over the
    table by a fixed permutation so that hot rows fall into different cache sets)."""

    batch_size: int = 16
    steps: int = 200
    max_bag: int = 5  # bag sizes uniform in [0, max_bag]: empty bags included
    alpha: float = 1.05
    per_sample_weights: bool = False
    data_seed: int = 0
    # Unpooled (PoolingMode.NONE): the output and its gradient have a row per id; the
    # tables' dims must be equal (FBGEMM's sequence TBE).
    sequence: bool = False


@dataclasses.dataclass(frozen=True)
class Step:
    indices: torch.Tensor
    offsets: torch.Tensor
    per_sample_weights: Optional[torch.Tensor]
    grad: torch.Tensor  # gradient of the output: pooled [B, sum(dims)]; a sequence's [ids, dim]


@dataclasses.dataclass(frozen=True)
class Trajectory:
    outputs: List[torch.Tensor]
    weights: List[torch.Tensor]
    states: List[List[torch.Tensor]]


@functools.lru_cache(maxsize=None)
def make_steps(specs: Tuple[Tuple[int, int], ...], workload: Workload) -> Tuple[Step, ...]:
    g = torch.Generator().manual_seed(workload.data_seed)
    perms, probs = [], []
    for rows, _ in specs:
        perms.append(torch.randperm(rows, generator=g))
        probs.append(torch.arange(1, rows + 1, dtype=torch.float64).pow(-workload.alpha))
    out = []
    total_dim = sum(d for _, d in specs)
    b = workload.batch_size
    for _ in range(workload.steps):
        ids, lengths = [], []
        for t in range(len(specs)):
            n = torch.randint(0, workload.max_bag + 1, (b,), generator=g)
            ranks = torch.multinomial(probs[t], int(n.sum()), replacement=True, generator=g) if int(n.sum()) else torch.empty(0, dtype=torch.long)
            ids.append(perms[t][ranks])
            lengths.append(n)
        indices = torch.cat(ids)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cat(lengths).cumsum(0)])
        psw = torch.rand(indices.numel(), generator=g) * 2 if workload.per_sample_weights else None
        if workload.sequence:
            grad = torch.randn(indices.numel(), specs[0][1], generator=g)
        else:
            grad = torch.randn(b, total_dim, generator=g)
        out.append(Step(indices, offsets, psw, grad))
    return tuple(out)


def initial_weights(model: Model, t: int) -> torch.Tensor:
    rows, dim = model.specs[t]
    bound = 1.0 / math.sqrt(rows)
    return lazy_init_rows(torch.arange(rows), dim, 0, (-bound, bound), model.seed * 1_000_003 + t, model.dtype)


def make_reference(model: Model) -> SplitTableBatchedEmbeddingBagsCodegen:
    ref = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in model.specs],
        optimizer=model.optimizer,
        learning_rate=model.learning_rate,
        eps=model.eps,
        pooling_mode=model.pooling,
        weights_precision=model.precision,
        output_dtype=SparseType.FP32,
    )
    with torch.no_grad():
        for t, w in enumerate(ref.split_embedding_weights()):
            w.copy_(initial_weights(model, t))
    return ref


@functools.lru_cache(maxsize=None)
def reference_run(model: Model, workload: Workload) -> Trajectory:
    """FBGEMM all-in-DRAM over the workload: every step's output, final weights and state."""
    ref = make_reference(model)
    outputs = []
    for step in make_steps(model.specs, workload):
        out = ref(step.indices, step.offsets, step.per_sample_weights)
        out.backward(step.grad)
        outputs.append(out.detach().clone())
    return Trajectory(outputs, *final_tables(ref))


def final_tables(module) -> Tuple[List[torch.Tensor], List[List[torch.Tensor]]]:
    weights = [w.detach().clone() for w in module.split_embedding_weights()]
    states = [[s.detach().clone() for s in per_table] for per_table in module.split_optimizer_states()]
    return weights, states


def make_kernel(model: Model, tier: Tier, storage_dir: Optional[Path], **kwargs) -> TieredEmbeddingBags:
    return TieredEmbeddingBags(
        list(model.specs),
        tier=tier,
        storage_dir=None if storage_dir is None else str(storage_dir),
        optimizer=model.optimizer,
        learning_rate=model.learning_rate,
        eps=model.eps,
        pooling_mode=model.pooling,
        weights_precision=model.precision,
        seed=model.seed,
        **kwargs,
    )


def assert_same(got: torch.Tensor, want: torch.Tensor, model: Model, what: str) -> None:
    """fp32: max abs diff <= 1e-5; fp16 tables: equal to FBGEMM's fp16 run."""
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
    )
    if model.precision == SparseType.FP16:
        if not torch.equal(got, want):
            diff = (got.float() - want.float()).abs()
            raise AssertionError(f"{what}: differs from FBGEMM fp16 (max abs diff {diff.max().item():.3g} "
                                 f"at {tuple(int(i) for i in (diff == diff.max()).nonzero()[0])})")
    else:
        diff = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
        assert diff <= TOL, f"{what}: max abs diff {diff:.3g} > {TOL}"


def assert_tables_match(ker: TieredEmbeddingBags, traj: Trajectory, model: Model, what: str = "") -> None:
    weights, states = final_tables(ker)
    assert len(weights) == len(traj.weights)
    for t, (got, want) in enumerate(zip(weights, traj.weights)):
        assert_same(got, want, model, f"{what}final weights of table {t}")
    assert len(states) == len(traj.states), f"{what}split_optimizer_states() has {len(states)} tables"
    for t, (got, want) in enumerate(zip(states, traj.states)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            # Optimizer state is fp32 on both sides, fp16 tables included.
            diff = (g - w).abs().max().item()
            assert g.shape == w.shape and g.dtype == w.dtype, f"{what}state of table {t}: {g.shape} vs {w.shape}"
            assert diff <= TOL, f"{what}final optimizer state of table {t}: max abs diff {diff:.3g}"


# Ways of driving the kernel through the same training steps ---------------------------
# "inline": forward only; "ahead": prefetch(b[s+1]) before forward(b[s]) (prefetch(b[0])
# first); "overlap": forward(b[s]), prefetch(b[s+1]), backward(b[s]) -- the plan of the next
# step runs while the backward and optimizer update the current one; "ahead2":
# prefetch(b[s+2]) before forward(b[s]).
SCHEDULES = ("inline", "ahead", "overlap", "ahead2", "ahead4")


def drive(
    ker: TieredEmbeddingBags,
    steps: Sequence[Step],
    schedule: str,
    check: Callable[[int, torch.Tensor], None],
    train: bool = True,
    start: int = 0,
) -> None:
    """Runs ``steps`` through ``ker`` (backward with each step's gradient when ``train``),
    calling ``check(step_number, output)`` on every output."""
    assert schedule in SCHEDULES, schedule
    depth = {"inline": 0, "ahead": 1, "overlap": 0, "ahead2": 2, "ahead4": 4}[schedule]
    n = len(steps)
    for s in range(min(depth, n)):
        ker.prefetch(steps[s].indices, steps[s].offsets)
    for s, step in enumerate(steps):
        if depth and s + depth < n:
            ker.prefetch(steps[s + depth].indices, steps[s + depth].offsets)
        with torch.set_grad_enabled(train):
            out = ker(step.indices, step.offsets, step.per_sample_weights)
        if schedule == "overlap" and s + 1 < n:
            ker.prefetch(steps[s + 1].indices, steps[s + 1].offsets)
        check(start + s, out.detach())
        if train:
            out.backward(step.grad)


def output_checker(traj: Trajectory, model: Model) -> Callable[[int, torch.Tensor], None]:
    def check(s: int, out: torch.Tensor) -> None:
        assert_same(out, traj.outputs[s], model, f"pooled output of step {s}")

    return check


def store_stats(ker: TieredEmbeddingBags) -> List[Dict[str, float]]:
    """Counters of each table's backing store (internal: ``_cache.stores``, one per table)."""
    return [dict(store.stats()) for store in ker._cache.stores]


def table_lookups(specs: Sequence[Tuple[int, int]], steps: Sequence[Step]) -> List[Tuple[int, int]]:
    """(lookups, sum over steps of distinct rows) per table."""
    out = []
    for t in range(len(specs)):
        lookups = unique = 0
        for step in steps:
            b = (step.offsets.numel() - 1) // len(specs)
            part = step.indices[int(step.offsets[t * b]) : int(step.offsets[(t + 1) * b])]
            lookups += part.numel()
            unique += part.unique().numel()
        out.append((lookups, unique))
    return out
