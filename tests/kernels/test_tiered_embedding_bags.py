"""TieredEmbeddingBags against FBGEMM's CPU TBE with the whole table in DRAM (CPU only).

For each tier (DRAM, SCM, SSD), caches from one slot / one set to larger than the table,
prefetch on and off, LRU and LFU: 200 training steps on Zipf batches give the same pooled
output every step and the same final weights and optimizer state as the reference
(max abs diff <= 1e-5 in fp32, equal in fp16). Then optimizers, pooling, per-sample weights,
fp16, several tables, the ways of sizing the cache and of scheduling prefetches, eval mode.

Whole-table access (flush / store files, cache_stats, close, set_rows) is in
test_tiered_embedding_bags_state.py; bad input and constructor errors in
test_tiered_embedding_bags_errors.py.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from tests.support.tiered_helpers import (
    Model,
    Workload,
    assert_same,
    assert_tables_match,
    drive,
    initial_weights,
    make_kernel,
    make_reference,
    make_steps,
    output_checker,
    reference_run,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
    store_stats,
)
from torchrec_mtrains import Tier
from torchrec_mtrains.storage import lazy_init_rows

TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]
# Cache shapes, from one slot to larger than either table (SPECS: 1500 and 600 rows).
CACHES = {
    "one_slot": dict(cache_rows=1),
    "one_set": dict(cache_rows=16, cache_ways=16),
    "sets": dict(cache_rows=96, cache_ways=8),
    "over_table": dict(cache_rows=4000),
}
# (schedule, cache_algorithm): every tier and every cache shape meets all four
# combinations of prefetch on/off x LRU/LFU (pairwise), in 24 runs rather than 48.
_VARIANTS = ([("ahead", "lru"), ("inline", "lfu")], [("ahead", "lfu"), ("inline", "lru")])
MATRIX = [
    pytest.param(tier, cache, schedule, algo, id=f"{tier.name}-{cache}-{schedule}-{algo}")
    for i, tier in enumerate(TIERS)
    for j, cache in enumerate(CACHES)
    for schedule, algo in _VARIANTS[(i + j) % 2]
]


def _train_and_compare(tmp_path: Path, model: Model, workload: Workload, tier: Tier, schedule: str,
                       **kwargs) -> None:
    traj = reference_run(model, workload)
    steps = make_steps(model.specs, workload)
    pipeline = kwargs.pop("prefetch_pipeline", schedule != "inline")
    ker = make_kernel(model, tier, tmp_path, prefetch_pipeline=pipeline, **kwargs)
    try:
        drive(ker, steps, schedule, output_checker(traj, model))
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


@pytest.mark.parametrize("tier, cache, schedule, algo", MATRIX)
def test_matches_fbgemm_all_in_dram(tmp_path: Path, tier: Tier, cache: str, schedule: str, algo: str) -> None:
    _train_and_compare(tmp_path, Model(), Workload(steps=200), tier, schedule,
                       cache_algorithm=algo, **CACHES[cache])


@pytest.mark.parametrize("tier, cache, schedule", [
    (Tier.DRAM, "one_set", "ahead"), (Tier.SCM, "sets", "inline"), (Tier.SSD, "sets", "ahead"),
    (Tier.SSD, "one_slot", "inline")], ids=lambda x: getattr(x, "name", x))
def test_tinylfu_matches_fbgemm_all_in_dram(tmp_path: Path, tier: Tier, cache: str, schedule: str) -> None:
    """The TinyLFU policy moves only slot tags (window / main), never rows: training equals
    FBGEMM's all-in-DRAM run as with LRU and LFU."""
    _train_and_compare(tmp_path, Model(), Workload(steps=200), tier, schedule,
                       cache_algorithm="tinylfu", **CACHES[cache])


# What the cache counts and moves (cache_stats), not the seconds it took.
_CACHE_COUNTS = ("lookups", "unique_rows", "hits", "misses", "evictions", "overflow_assignments", "rows_loaded",
                 "rows_written_back", "bytes_read_from_tier", "bytes_written_to_tier", "cache_capacity_rows")


@pytest.mark.parametrize("algo", ["lru", "lfu", "tinylfu"])
@pytest.mark.parametrize("cache", ["one_slot", "sets", "over_table"])
def test_dense_slot_map_on_and_off_train_alike(tmp_path: Path, cache: str, algo: str) -> None:
    """The dense row-to-slot map only finds rows faster: forced on and forced off, the kernel
    trains like FBGEMM, counts the same hits, misses and evictions and moves the same rows
    (the one-slot and 96-slot caches use overflow slots; prefetch ahead keeps two steps live)."""
    model, workload = Model(), Workload(steps=120, data_seed=3)
    traj = reference_run(model, workload)
    steps = make_steps(model.specs, workload)
    counts = {}
    for dense in (False, True):
        ker = make_kernel(model, Tier.SSD, tmp_path / f"map_{dense}", cache_algorithm=algo, dense_slot_map=dense,
                          **CACHES[cache])
        try:
            assert ker.dense_slot_maps == [dense] * len(model.specs)
            drive(ker, steps, "ahead", output_checker(traj, model))
            assert_tables_match(ker, traj, model, f"dense_slot_map={dense}: ")
            counts[dense] = {t: {k: s[k] for k in _CACHE_COUNTS} for t, s in ker.cache_stats().items()}
        finally:
            ker.close()
    assert counts[True] == counts[False]
    assert all(c["evictions"] > 0 for c in counts[True].values()) or cache == "over_table"


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_plan_of_next_step_overlaps_backward(tmp_path: Path, tier: Tier) -> None:
    """forward(b[s]); prefetch(b[s+1]); backward(b[s]): the next plan (evictions, loads)
    runs on the prefetch thread while the optimizer updates the current rows."""
    _train_and_compare(tmp_path, Model(), Workload(steps=200, data_seed=1), tier, "overlap",
                       cache_rows=8, cache_ways=4, cache_algorithm="lru")


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_prefetch_two_batches_ahead(tmp_path: Path, tier: Tier) -> None:
    """prefetch(b1), prefetch(b2), forward(b1), forward(b2), ... with a cache so small that
    the two planned steps' rows overflow its sets."""
    _train_and_compare(tmp_path, Model(), Workload(steps=150, data_seed=2), tier, "ahead2",
                       cache_rows=8, cache_ways=4, cache_algorithm="lfu")


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_plans_run_ahead_of_slow_row_moves(tmp_path: Path, tier: Tier) -> None:
    """Every step's write-backs are slowed down, so the plans of the next two steps run while
    an earlier step's rows are still moving (their evicted slots untouched until that
    step's own move writes them back); with a cache of 8 slots a row evicted by one step is
    often loaded again by the next and must read the value written back."""
    model, workload = Model(), Workload(steps=80, data_seed=6)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=8, cache_ways=4, cache_algorithm="lru")

    class SlowWrites:
        """Stands where a checkpoint's snapshot would: the engine's move thread calls it
        before each write-back (the write guard), and it sleeps."""

        def before_write(self, ids: torch.Tensor) -> None:
            time.sleep(0.003)

    for t in range(len(model.specs)):
        ker._cache.snapshots[t] = SlowWrites()
        ker._cache.engine.set_write_guard(t, True)
    try:
        drive(ker, steps, "ahead2", output_checker(traj, model))
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


def test_forward_without_prefetch_while_pipeline_on(tmp_path: Path) -> None:
    _train_and_compare(tmp_path, Model(), Workload(steps=100, data_seed=3), Tier.SSD, "inline",
                       prefetch_pipeline=True, cache_rows=32, cache_ways=8)


def test_prefetch_inline_when_pipeline_off(tmp_path: Path) -> None:
    _train_and_compare(tmp_path, Model(), Workload(steps=100, data_seed=4), Tier.SCM, "ahead2",
                       prefetch_pipeline=False, cache_rows=32, cache_ways=8)


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_mixed_prefetch_schedule(tmp_path: Path, tier: Tier) -> None:
    """Per step, zero to two new prefetches (at most two batches in flight), or none at
    all so that forward plans inline; the pipeline must track which batch comes next."""
    model, workload = Model(), Workload(steps=150, data_seed=5)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    check = output_checker(traj, model)
    rnd = random.Random(tier.value)
    ker = make_kernel(model, tier, tmp_path, cache_rows=24, cache_ways=4, cache_algorithm="lru")
    prefetched = 0  # steps[:prefetched] were prefetched
    for s, step in enumerate(steps):
        prefetched = max(prefetched, s)
        for _ in range(rnd.randint(0, 2)):
            if prefetched < min(len(steps), s + 2):
                ker.prefetch(steps[prefetched].indices, steps[prefetched].offsets)
                prefetched += 1
        out = ker(step.indices, step.offsets)
        check(s, out.detach())
        out.backward(step.grad)
    assert_tables_match(ker, traj, model)
    ker.close()


# Optimizers, pooling, per-sample weights, precision ------------------------------------
OPTIMIZERS = [EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_SGD]


@pytest.mark.parametrize("psw", [False, True], ids=["unweighted", "per_sample_weights"])
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN], ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
def test_optimizers_pooling_and_weights(tmp_path: Path, optimizer: EmbOptimType, pooling: PoolingMode,
                                        psw: bool) -> None:
    tier = TIERS[(OPTIMIZERS.index(optimizer) + psw) % 3]
    model = Model(optimizer=optimizer, pooling=pooling, learning_rate=0.1)
    _train_and_compare(tmp_path, model, Workload(steps=100, per_sample_weights=psw, data_seed=6), tier,
                       "ahead", cache_rows=48, cache_ways=8)


@pytest.mark.parametrize("schedule", ["inline", "ahead", "overlap"])
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_sequences_unpooled_match_fbgemm(tmp_path: Path, tier: Tier, schedule: str) -> None:
    """PoolingMode.NONE (TorchRec's EmbeddingCollection): one output row per id, through the
    same cache, prefetch and tiers; outputs, weights and state as FBGEMM's sequence TBE."""
    optimizer = OPTIMIZERS[TIERS.index(tier)]
    model = Model(specs=((1500, 8), (600, 8)), optimizer=optimizer, pooling=PoolingMode.NONE, learning_rate=0.1)
    _train_and_compare(tmp_path, model, Workload(steps=100, sequence=True, data_seed=7), tier, schedule,
                       cache_rows=48, cache_ways=8)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda o: o.name)
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_fp16_weights_equal_fbgemm_fp16(tmp_path: Path, tier: Tier, optimizer: EmbOptimType) -> None:
    """fp16 tables: weights equal FBGEMM's fp16 run bit for bit, and the fp32 optimizer
    state (kept as two fp16 slots per value on the tier) too."""
    model = Model(optimizer=optimizer, precision=SparseType.FP16, learning_rate=0.1)
    schedule = "inline" if optimizer == EmbOptimType.EXACT_ADAGRAD else "ahead"
    _train_and_compare(tmp_path, model, Workload(steps=100, per_sample_weights=True, data_seed=7), tier,
                       schedule, cache_rows=8, cache_ways=4, cache_algorithm="lfu")


def test_several_tables_with_different_dims(tmp_path: Path) -> None:
    specs = ((700, 4), (300, 12), (1000, 32), (50, 8))
    model = Model(specs=specs, pooling=PoolingMode.MEAN)
    _train_and_compare(tmp_path, model, Workload(steps=100, per_sample_weights=True, data_seed=8), Tier.SSD,
                       "ahead", cache_rows=[1, 20, 64, 100], cache_ways=4,
                       table_names=["user", "item", "query", "tiny"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["item.blk", "query.blk", "tiny.blk", "user.blk"]


# One kernel over tables of every tier (as a rank's tiered tables share one TBE).
_MIXED = (Tier.SSD, Tier.DRAM, Tier.SCM, Tier.SSD)


@pytest.mark.parametrize("schedule, algo, optimizer", [
    ("ahead", "lru", EmbOptimType.EXACT_ROWWISE_ADAGRAD),
    ("inline", "lfu", EmbOptimType.EXACT_ROWWISE_ADAGRAD),
    ("overlap", "lru", EmbOptimType.EXACT_ADAGRAD),
    ("ahead", "lfu", EmbOptimType.EXACT_SGD),
])
def test_mixed_tier_kernel_matches_fbgemm(tmp_path: Path, schedule: str, algo: str, optimizer: EmbOptimType) -> None:
    specs = ((700, 4), (300, 12), (1000, 32), (50, 8))
    model = Model(specs=specs, optimizer=optimizer)
    pipeline = schedule != "inline"
    _train_and_compare(tmp_path, model, Workload(steps=150, data_seed=9), _MIXED, schedule,
                       prefetch_pipeline=pipeline, cache_rows=[1, 20, 64, 100], cache_ways=4,
                       cache_algorithm=algo, table_names=["user", "item", "query", "tiny"])
    # Each table's store is on its own tier: files only for the SCM and SSD tables.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["query.scm", "tiny.blk", "user.blk"]


@pytest.mark.parametrize("seed", [0, 11])
def test_initial_weights_are_lazy_init_of_seed(tmp_path: Path, seed: int) -> None:
    model = Model(seed=seed)
    ker = make_kernel(model, Tier.SCM, tmp_path, cache_rows=4)
    for t, w in enumerate(ker.split_embedding_weights()):
        assert torch.equal(w, initial_weights(model, t)), f"table {t}"
    states = ker.split_optimizer_states()
    assert [s[0].shape for s in states] == [(rows,) for rows, _ in model.specs]
    assert all(bool((s[0] == 0).all()) for s in states)
    ker.close()


def test_init_range_per_table(tmp_path: Path) -> None:
    ranges = [(-0.5, 0.5), (0.0, 2.0)]
    ker = make_kernel(Model(), Tier.DRAM, None, cache_rows=4, init_range=ranges)
    for t, (w, (rows, dim)) in enumerate(zip(ker.split_embedding_weights(), Model().specs)):
        assert torch.equal(w, lazy_init_rows(torch.arange(rows), dim, 0, ranges[t], t))
    ker.close()


# Cache sizing -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(cache_rows=40), [40, 40]),
        (dict(cache_rows=[1, 700]), [1, 700]),
        (dict(cache_rows=(64, 5)), [64, 5]),
        (dict(cache_load_factor=0.05), [75, 30]),
        (dict(cache_load_factor=2.0), [3000, 1200]),
        (dict(), [300, 120]),  # default load factor 0.2
    ],
    ids=["int", "list", "tuple", "load_factor", "load_factor_over_table", "default"],
)
def test_cache_rows_forms(tmp_path: Path, kwargs: dict, expected: list) -> None:
    model, workload = Model(), Workload(steps=60, data_seed=9)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_ways=4, **kwargs)
    assert ker.cache_rows == expected
    stats = ker.cache_stats()
    assert [stats[f"table_{t}"]["cache_capacity_rows"] for t in range(2)] == [float(n) for n in expected]
    drive(ker, steps, "ahead", output_checker(traj, model))
    assert_tables_match(ker, traj, model)
    stats = ker.cache_stats()
    for t, n in enumerate(expected):
        assert stats[f"table_{t}"]["cache_capacity_rows"] >= n
    ker.close()


# Inputs the reference accepts as well ----------------------------------------------------
def test_int32_indices_and_offsets(tmp_path: Path) -> None:
    model, workload = Model(), Workload(steps=40, data_seed=10)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    ker = make_kernel(model, Tier.SCM, tmp_path, cache_rows=16, cache_ways=4)
    ker.prefetch(steps[0].indices.int(), steps[0].offsets.int())
    for s, step in enumerate(steps):
        if s + 1 < len(steps):
            ker.prefetch(steps[s + 1].indices.int(), steps[s + 1].offsets.int())
        out = ker(step.indices.int(), step.offsets.int())
        assert_same(out.detach(), traj.outputs[s], model, f"step {s}")
        out.backward(step.grad)
    assert_tables_match(ker, traj, model)
    ker.close()


def test_empty_bags_and_empty_batches(tmp_path: Path) -> None:
    """Batches whose bags are all empty, or empty for one table only, and B = 0."""
    model = Model()
    ref = make_reference(model)
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=4, cache_ways=4)
    b = 4
    batches = [
        (torch.empty(0, dtype=torch.long), torch.zeros(2 * b + 1, dtype=torch.long)),
        (torch.tensor([3, 3, 9]), torch.tensor([0, 0, 0, 0, 0, 1, 1, 3, 3])),  # table 0 empty
        (torch.tensor([1499, 0]), torch.tensor([0, 1, 2, 2, 2, 2, 2, 2, 2])),  # table 1 empty
        (torch.empty(0, dtype=torch.long), torch.zeros(1, dtype=torch.long)),  # B = 0
        (torch.tensor([5, 6, 599]), torch.tensor([0, 2, 3])),  # B = 1
    ]
    g = torch.Generator().manual_seed(0)
    for i, (idx, off) in enumerate(batches):
        ker.prefetch(idx, off)
        out, want = ker(idx, off), ref(idx, off)
        assert_same(out.detach(), want.detach(), model, f"batch {i}")
        grad = torch.randn(want.shape, generator=g)
        out.backward(grad)
        want.backward(grad)
    for t, (w, r) in enumerate(zip(ker.split_embedding_weights(), ref.split_embedding_weights())):
        assert_same(w, r.detach(), model, f"table {t}")
    ker.close()


# Eval mode ---------------------------------------------------------------------------------
def _eval_then_train(tmp_path: Path, schedule: str) -> None:
    """Train 20 steps, evaluate 30 (no backward), train 50 more, as one stream of batches."""
    model, workload = Model(), Workload(steps=100, data_seed=12)
    steps = make_steps(model.specs, workload)
    phases = [(0, 20, True), (20, 50, False), (50, 100, True)]
    ref = make_reference(model)
    want = []
    for lo, hi, train in phases:
        ref.train(train)
        for step in steps[lo:hi]:
            with torch.set_grad_enabled(train):
                out = ref(step.indices, step.offsets)
            want.append(out.detach().clone())
            if train:
                out.backward(step.grad)
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=16, cache_ways=4,
                      prefetch_pipeline=schedule != "inline")
    check = lambda s, out: assert_same(out, want[s], model, f"pooled output of step {s}")  # noqa: E731
    weights_at_20 = _weights_after(model, steps[:20])
    for lo, hi, train in phases:
        ker.train(train)
        # One stream: with "ahead", the first batch of a phase was prefetched in the previous one.
        if schedule == "ahead":
            if lo == 0:
                ker.prefetch(steps[0].indices, steps[0].offsets)
            for s in range(lo, hi):
                if s + 1 < len(steps):
                    ker.prefetch(steps[s + 1].indices, steps[s + 1].offsets)
                with torch.set_grad_enabled(train):
                    out = ker(steps[s].indices, steps[s].offsets)
                check(s, out.detach())
                if train:
                    out.backward(steps[s].grad)
        else:
            drive(ker, steps[lo:hi], "inline", check, train=train, start=lo)
        if not train:  # evaluating changed no weight
            for t, (w, r) in enumerate(zip(ker.split_embedding_weights(), weights_at_20)):
                assert_same(w, r, model, f"table {t} after eval")
    for t, (w, r) in enumerate(zip(ker.split_embedding_weights(), ref.split_embedding_weights())):
        assert_same(w, r.detach(), model, f"final weights of table {t}")
    ker.close()


def _weights_after(model: Model, steps) -> list:
    ref = make_reference(model)
    for step in steps:
        ref(step.indices, step.offsets).backward(step.grad)
    return [w.detach().clone() for w in ref.split_embedding_weights()]


def test_eval_then_train_inline(tmp_path: Path) -> None:
    _eval_then_train(tmp_path, "inline")


def test_eval_then_train_with_prefetch_across_the_switch(tmp_path: Path) -> None:
    """The first training batch was prefetched while the module was in eval mode; its rows
    are updated by the backward and must be written back when evicted."""
    _eval_then_train(tmp_path, "ahead")


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_eval_writes_nothing_to_the_tier(tmp_path: Path, tier: Tier) -> None:
    model, workload = Model(), Workload(steps=40, data_seed=13)
    traj_steps = make_steps(model.specs, workload)
    ref = make_reference(model).eval()
    ker = make_kernel(model, tier, tmp_path, cache_rows=4, cache_ways=4).eval()
    with torch.no_grad():
        want = [ref(s.indices, s.offsets) for s in traj_steps]
        drive(ker, traj_steps, "ahead", lambda s, out: assert_same(out, want[s], model, f"step {s}"), train=False)
    stats = ker.cache_stats()
    assert all(stats[n]["evictions"] > 0 for n in stats)
    assert all(stats[n]["rows_written_back"] == 0 for n in stats)
    assert [st["rows_written"] for st in store_stats(ker)] == [0.0, 0.0]
    ker.flush()
    assert [st["rows_written"] for st in store_stats(ker)] == [0.0, 0.0]
    for t, w in enumerate(ker.split_embedding_weights()):
        assert torch.equal(w, initial_weights(model, t))
    ker.close()
