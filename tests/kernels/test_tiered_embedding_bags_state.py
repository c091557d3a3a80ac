"""TieredEmbeddingBags whole-table access: flush() and the store files on the tier,
cache_stats(), close(), set_rows(); and a long stress run with a tiny cache (CPU only)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType

from tests.support.tiered_helpers import (
    CACHE_STAT_KEYS,
    Model,
    Workload,
    assert_same,
    assert_tables_match,
    drive,
    final_tables,
    make_kernel,
    make_reference,
    make_steps,
    output_checker,
    reference_run,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
    store_stats,
    table_lookups,
)
from torchrec_mtrains import Tier
from torchrec_mtrains.storage import BlockStore, ScmStore

TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]


def _open_table_file(tier: Tier, storage_dir: Path, name: str):
    """Opens a copy of the table file's bytes: the kernel's live store owns the file itself
    (a second open of it is refused), and the copy reads exactly what the file holds."""
    file = storage_dir / f"{name}.{'scm' if tier == Tier.SCM else 'blk'}"
    copy = storage_dir / "copies" / file.name
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(file, copy)
    if tier == Tier.SCM:
        return ScmStore.open(copy)
    return BlockStore.open(copy, dram_cache_mb=0)


def _expected_rows(weights: torch.Tensor, state: List[torch.Tensor]) -> torch.Tensor:
    """A store row: weights then the fp32 optimizer state (fp16 tables: its bits as two
    fp16 slots per value, row_codec.py)."""
    if not state:
        return weights
    s = state[0].reshape(weights.shape[0], -1).contiguous()
    return torch.cat([weights, s.view(weights.dtype)], dim=1)


def _assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
    bits = torch.int16 if got.dtype == torch.float16 else torch.int32
    neq = got.view(bits) != want.view(bits)
    if bool(neq.any()):
        r, c = (int(i) for i in neq.nonzero()[0])
        raise AssertionError(f"{what}: {int(neq.sum())} values differ, first at row {r} col {c}: "
                             f"{got[r, c].item()} vs {want[r, c].item()}")


# flush() and the files on the tier ------------------------------------------------------
FLUSH_CASES = [
    pytest.param(tier, opt, prec, id=f"{tier.name}-{opt.name}-{prec.name}")
    for tier in (Tier.SCM, Tier.SSD)
    for opt, prec in [
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, SparseType.FP32),
        (EmbOptimType.EXACT_ADAGRAD, SparseType.FP32),
        (EmbOptimType.EXACT_SGD, SparseType.FP32),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, SparseType.FP16),
        (EmbOptimType.EXACT_ADAGRAD, SparseType.FP16),
    ]
]


@pytest.mark.parametrize("tier, optimizer, precision", FLUSH_CASES)
def test_flush_leaves_exactly_the_tables_in_the_store_files(
    tmp_path: Path, tier: Tier, optimizer: EmbOptimType, precision: SparseType
) -> None:
    model = Model(optimizer=optimizer, precision=precision, learning_rate=0.1)
    workload = Workload(steps=60, data_seed=20)
    steps = make_steps(model.specs, workload)
    traj = reference_run(model, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=16, cache_ways=4, table_names=["ads", "pages"])
    # Flush twice mid-training (some rows on the tier, some dirty in the cache, one step's
    # rows still locked), then at the end; each time the files must hold the tables.
    for lo, hi in [(0, 25), (25, 26), (26, 60)]:
        drive(ker, steps[lo:hi], "ahead", output_checker(traj, model), start=lo)
        ker.flush()
        weights, states = final_tables(ker)
        for t, name in enumerate(ker.table_names):
            store = _open_table_file(tier, tmp_path, name)
            try:
                rows, dim = model.specs[t]
                assert (store.num_rows, store.dim, store.dtype) == (rows, dim, model.dtype)
                want = _expected_rows(weights[t], states[t] if states else [])
                assert store.state_dim == want.shape[1] - dim
                _assert_bits_equal(store.read(torch.arange(rows)), want, f"{name} after step {hi}")
            finally:
                store.close()
    assert_tables_match(ker, traj, model)
    ker.close()
    # close() flushed as well: the files still hold the final tables.
    for t, name in enumerate(["ads", "pages"]):
        store = _open_table_file(tier, tmp_path, name)
        want = _expected_rows(traj.weights[t], traj.states[t] if traj.states else [])
        got = store.read(torch.arange(model.specs[t][0]))
        if model.precision == SparseType.FP16:  # bit-exact; state bits may read as fp16 NaNs
            _assert_bits_equal(got, want, f"{name} after close")
        else:
            assert_same(got, want, model, f"{name} after close")
        store.close()


@pytest.mark.parametrize("tier", [Tier.SCM, Tier.SSD], ids=lambda t: t.name)
def test_flush_writes_each_dirty_row_once(tmp_path: Path, tier: Tier) -> None:
    """With a cache larger than the table nothing is evicted; flush() writes exactly the
    rows trained since the last flush."""
    model, workload = Model(), Workload(steps=30, data_seed=21)
    steps = make_steps(model.specs, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=4000)
    drive(ker, steps, "ahead", lambda s, out: None)
    assert [st["rows_written"] for st in store_stats(ker)] == [0.0, 0.0]
    ker.flush()
    touched = [len(set().union(*(set(p.tolist()) for p in _table_parts(steps, t)))) for t in range(2)]
    assert [st["rows_written"] for st in store_stats(ker)] == [float(n) for n in touched]
    stats = ker.cache_stats()
    assert [stats[f"table_{t}"]["rows_written_back"] for t in range(2)] == [float(n) for n in touched]
    # Nothing trained since: a second flush writes at most the rows of the last step (whose
    # slots the last forward still locks, so they may be kept dirty).
    ker.flush()
    last = [len(set(p.tolist())) for p in (_table_parts(steps[-1:], t)[0] for t in range(2))]
    for st, n, m in zip(store_stats(ker), touched, last):
        assert n <= st["rows_written"] <= n + m
    ker.close()


def _table_parts(steps, t: int, num_tables: int = 2) -> List[torch.Tensor]:
    out = []
    for step in steps:
        b = (step.offsets.numel() - 1) // num_tables
        out.append(step.indices[int(step.offsets[t * b]) : int(step.offsets[(t + 1) * b])])
    return out


# cache_stats() ------------------------------------------------------------------------------
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
@pytest.mark.parametrize("cache_rows", [4, 4000], ids=["tiny", "over_table"])
def test_cache_stats(tmp_path: Path, tier: Tier, cache_rows: int) -> None:
    model, workload = Model(), Workload(steps=80, data_seed=22)
    steps = make_steps(model.specs, workload)
    ways = 4 if cache_rows < 32 else 32  # no set overflows when the cache exceeds the table
    ker = make_kernel(model, tier, tmp_path, cache_rows=cache_rows, cache_ways=ways, table_names=["a", "b"])
    stats = ker.cache_stats()
    assert set(stats) == {"a", "b"}
    for name in stats:
        assert set(stats[name]) == CACHE_STAT_KEYS, name
        assert all(v == 0 for k, v in stats[name].items() if k != "cache_capacity_rows"), stats[name]
    drive(ker, steps, "ahead", lambda s, out: None)
    stats = ker.cache_stats()
    expected = table_lookups(model.specs, steps)
    row_bytes = [(dim + 1) * 4 for _, dim in model.specs]  # fp32 weights + 1 row-wise state value
    for t, (name, st) in enumerate(stats.items()):
        assert set(st) == CACHE_STAT_KEYS
        assert all(isinstance(v, float) for v in st.values()), st
        lookups, unique = expected[t]
        assert st["lookups"] == lookups
        assert st["unique_rows"] == unique
        assert st["hits"] + st["misses"] == st["unique_rows"]
        assert st["hit_rate"] == pytest.approx(st["hits"] / st["unique_rows"])
        assert 0 <= st["hit_rate"] <= 1
        assert st["rows_loaded"] == st["misses"]
        assert st["evictions"] <= st["misses"]
        assert st["rows_written_back"] <= st["evictions"]
        assert st["bytes_read_from_tier"] == st["rows_loaded"] * row_bytes[t]
        assert st["bytes_written_to_tier"] == st["rows_written_back"] * row_bytes[t]
        assert st["cache_capacity_rows"] >= cache_rows
        assert st["tier_seconds"] >= 0 and st["prefetch_wait_seconds"] >= 0
        assert st["overflow_assignments"] <= st["misses"]
        # Each stage's CPU per moved row; a miss costs all of them (its eviction's share of
        # the write-backs included).
        assert st["plan_cpu_ns_per_row"] > 0 and st["read_cpu_ns_per_row"] > 0
        assert st["write_back_cpu_ns_per_row"] > 0 or st["rows_written_back"] == 0
        assert st["verify_cpu_ns_per_row"] >= 0
        if tier is Tier.DRAM:
            assert st["verify_cpu_ns_per_row"] == 0  # no checksums in DRAM
        if tier is Tier.SSD:
            assert st["copy_cpu_ns_per_row"] > 0  # read into a buffer, then into the slots
        else:
            assert st["copy_cpu_ns_per_row"] == 0  # one copy, from the tier into the slot
        assert st["cpu_ns_per_miss"] == pytest.approx(
            st["plan_cpu_ns_per_row"] + st["read_cpu_ns_per_row"] + st["verify_cpu_ns_per_row"]
            + st["copy_cpu_ns_per_row"]
            + st["write_back_cpu_ns_per_row"] * max(1, st["rows_written_back"]) / st["rows_loaded"])
        store = store_stats(ker)[t]
        assert store["rows_read"] == st["rows_loaded"]
        assert store["rows_written"] == st["rows_written_back"]
        if cache_rows > model.specs[t][0]:
            distinct = len(set().union(*(set(p.tolist()) for p in _table_parts(steps, t))))
            assert st["misses"] == distinct  # each row loaded once, never evicted
            assert st["evictions"] == 0 and st["rows_written_back"] == 0
            assert st["cache_capacity_rows"] == cache_rows
        else:
            assert st["evictions"] > 0 and st["rows_written_back"] > 0
            assert st["hits"] > 0  # Zipf batches reuse hot rows
    ker.close()


def test_cache_stats_fp16_row_bytes(tmp_path: Path) -> None:
    model = Model(precision=SparseType.FP16, optimizer=EmbOptimType.EXACT_ADAGRAD)
    steps = make_steps(model.specs, Workload(steps=10, data_seed=23))
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=4, cache_ways=4)
    drive(ker, steps, "inline", lambda s, out: None)
    for t, st in enumerate(ker.cache_stats().values()):
        dim = model.specs[t][1]
        # fp16 weights + dim fp32 state values stored as 2 fp16 slots each
        assert st["bytes_read_from_tier"] == st["rows_loaded"] * (dim + 2 * dim) * 2
    ker.close()


# close() -------------------------------------------------------------------------------------
@pytest.mark.parametrize("tier", [Tier.SCM, Tier.SSD], ids=lambda t: t.name)
def test_close_flushes(tmp_path: Path, tier: Tier) -> None:
    """close() writes the dirty rows down: the files reopened hold the final tables."""
    model, workload = Model(), Workload(steps=40, data_seed=24)
    steps = make_steps(model.specs, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=8, cache_ways=4)
    drive(ker, steps, "overlap", lambda s, out: None)
    weights, states = final_tables(ker)
    ker.close()
    for t in range(2):
        store = _open_table_file(tier, tmp_path, f"table_{t}")
        _assert_bits_equal(store.read(torch.arange(model.specs[t][0])), _expected_rows(weights[t], states[t]),
                           f"table_{t} after close")
        store.close()


def _files_on_disk(root: Path) -> Dict[str, Tuple[int, int, bytes]]:
    """Each file under ``root``: (size in bytes, mtime in ns, its bytes)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, p.read_bytes())
    return out


def _must_not_be_called(what: str):
    def call(*args, **kwargs):
        raise AssertionError(f"the second close() called {what}")
    return call


class _NoSteps:
    """The step engine, with every call that would run or stop steps failing the test."""

    def __init__(self, engine: torch.ScriptObject) -> None:
        self._engine = engine
        for name in ("submit", "take", "drain", "drop_pending", "shutdown", "set_slots"):
            setattr(self, name, _must_not_be_called(f"the step engine's {name}()"))

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_close_twice_is_a_no_op(tmp_path: Path, tier: Tier, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like BlockStore.close() (documented idempotent) and Python's file.close(), a second
    close() does nothing -- it must not write to the stores the first one closed."""
    model = Model()
    steps = make_steps(model.specs, Workload(steps=5, data_seed=24))
    ker = make_kernel(model, tier, tmp_path, cache_rows=8, cache_ways=4)
    drive(ker, steps, "inline", lambda s, out: None)
    weights, states = final_tables(ker)
    assert ker.close() is None
    files, stats = _files_on_disk(tmp_path), ker.cache_stats()
    assert (tier == Tier.DRAM) == (not files), sorted(files)
    # Any call into a store or a step of the step engine now would touch what the first
    # close() released: each one fails the test.
    for t, store in enumerate(ker._cache.stores):
        for name in ("read", "write", "exchange", "flush", "close", "stats"):
            monkeypatch.setattr(store, name, _must_not_be_called(f"{name}() of table {t}'s store"))
    engine = _NoSteps(ker._steps.engine)
    monkeypatch.setattr(ker._steps, "engine", engine)
    monkeypatch.setattr(ker._resources, "engine", engine)

    assert ker.close() is None
    assert _files_on_disk(tmp_path) == files  # not a byte, not an mtime changed
    assert ker.cache_stats() == stats
    # Still closed: every use says so (and touches no store).
    step, dim = steps[0], model.specs[0][1]
    for use in (
        lambda: ker(step.indices, step.offsets),
        lambda: ker.prefetch(step.indices, step.offsets),
        ker.flush,
        lambda: ker.set_rows(0, torch.tensor([0]), torch.zeros(1, dim)),
        lambda: ker.read_rows(0, 0, 1),
    ):
        with pytest.raises(ValueError, match="TieredEmbeddingBags is closed"):
            use()
    monkeypatch.undo()
    if tier == Tier.DRAM:
        return
    # The files the first close() flushed hold the final tables.
    for t in range(len(model.specs)):
        store = _open_table_file(tier, tmp_path, f"table_{t}")
        try:
            _assert_bits_equal(store.read(torch.arange(model.specs[t][0])), _expected_rows(weights[t], states[t]),
                               f"table_{t} after closing twice")
        finally:
            store.close()


# set_rows() ------------------------------------------------------------------------------------
def _set_rows_both(ker, ref, model: Model, t: int, ids: torch.Tensor, g: torch.Generator) -> None:
    dim = model.specs[t][1]
    w = (torch.rand(ids.numel(), dim, generator=g) - 0.5).to(model.dtype)
    st = torch.rand(ids.numel(), generator=g)
    ker.set_rows(t, ids, w, st)
    with torch.no_grad():
        ref.split_embedding_weights()[t][ids] = w
        ref.split_optimizer_states()[t][0][ids] = st


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_set_rows_between_steps_matches_reference(tmp_path: Path, tier: Tier) -> None:
    """Rows overwritten while cached (dirty or clean) or only on the tier, then trained."""
    model, workload = Model(), Workload(steps=60, data_seed=25)
    steps = make_steps(model.specs, workload)
    ref = make_reference(model)
    ker = make_kernel(model, tier, tmp_path, cache_rows=32, cache_ways=4)
    g = torch.Generator().manual_seed(3)
    for s, step in enumerate(steps):
        if s % 10 == 5:
            for t, (rows, _) in enumerate(model.specs):
                # recent rows (cached) and random ones (mostly on the tier), a repeated id too
                recent = _table_parts(steps[s - 1 : s], t)[0][:5]
                ids = torch.cat([recent, torch.randint(0, rows, (20,), generator=g), recent[:1]])
                _set_rows_both(ker, ref, model, t, ids, g)
        out, want = ker(step.indices, step.offsets), ref(step.indices, step.offsets)
        assert_same(out.detach(), want.detach(), model, f"step {s}")
        out.backward(step.grad)
        want.backward(step.grad)
    weights, states = final_tables(ker)
    for t in range(len(model.specs)):
        assert_same(weights[t], ref.split_embedding_weights()[t].detach(), model, f"weights of table {t}")
        assert_same(states[t][0], ref.split_optimizer_states()[t][0].detach(), model, f"state of table {t}")
    ker.close()


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipeline", "inline"])
def test_set_rows_after_prefetch_that_overflowed_the_cache(tmp_path: Path, pipeline: bool) -> None:
    """prefetch(b); set_rows(rows of b); forward(b) must compute on the new rows, also
    for the rows that b's plan put in overflow slots past the TBE's current size."""
    ker = make_kernel(Model(specs=((1000, 8),)), Tier.DRAM, None, cache_rows=1, prefetch_pipeline=pipeline)
    ids = torch.arange(100)
    offsets = torch.arange(101)  # 100 bags of one row: 100 distinct rows, 1 cache slot
    ker.prefetch(ids, offsets)
    ker.set_rows(0, ids, torch.full((100, 8), 7.0))
    out = ker(ids, offsets).detach()
    stale = (out != 7.0).any(dim=1).nonzero().squeeze(1)
    assert stale.numel() == 0, f"{stale.numel()} of 100 bags computed on the old rows, e.g. ids {stale[:5].tolist()}"
    ker.close()


def test_set_rows_input_errors(tmp_path: Path) -> None:
    model = Model()
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=8, cache_ways=4)
    before = store_stats(ker)
    w = torch.zeros(2, 8)
    with pytest.raises(IndexError, match="table 2"):
        ker.set_rows(2, torch.tensor([0, 1]), w)
    with pytest.raises(IndexError, match="table_0"):
        ker.set_rows(0, torch.tensor([0, 1500]), w)
    with pytest.raises(IndexError, match="table_0"):
        ker.set_rows(0, torch.tensor([-1, 0]), w)
    with pytest.raises(ValueError, match="weights"):
        ker.set_rows(0, torch.tensor([0, 1]), torch.zeros(2, 16))
    with pytest.raises(ValueError, match="weights"):
        ker.set_rows(0, torch.tensor([0, 1]), w.double())
    with pytest.raises(ValueError, match="optimizer_state"):
        ker.set_rows(0, torch.tensor([0, 1]), w, torch.zeros(2, 8))
    with pytest.raises(ValueError):
        ker.set_rows(0, torch.tensor([0.0, 1.5]), w)  # float ids: not row ids
    assert [st["rows_written"] for st in store_stats(ker)] == [st["rows_written"] for st in before]
    ker.close()


# Stress ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("tier", [Tier.SSD, Tier.SCM], ids=lambda t: t.name)
def test_stress_thousands_of_steps_tiny_cache_pipelined(tmp_path: Path, tier: Tier) -> None:
    """3000 steps, a 4-row cache (one set) per table, prefetch overlapping the backward,
    flushes along the way: every output and the final tables equal the reference."""
    model = Model(specs=((2000, 8), (400, 4), (1000, 16)), learning_rate=0.02)
    workload = Workload(steps=3000, batch_size=16, max_bag=4, data_seed=26)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    ker = make_kernel(model, tier, tmp_path, cache_rows=4, cache_ways=4, cache_algorithm="lru")
    check = output_checker(traj, model)
    for lo in range(0, len(steps), 750):
        drive(ker, steps[lo : lo + 750], "overlap" if lo % 1500 else "ahead2", check, start=lo)
        ker.flush()
    assert_tables_match(ker, traj, model)
    assert all(st["evictions"] > 0 for st in ker.cache_stats().values())
    ker.close()


def test_store_stats_are_the_backing_store_s_own(tmp_path: Path) -> None:
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    ker = TieredEmbeddingBags([(64, 8), (32, 8)], tier=Tier.SSD, cache_rows=8, storage_dir=str(tmp_path),
                              prefetch_pipeline=False)
    try:
        ids = torch.arange(16)
        ker(torch.cat([ids, ids[:4]]), torch.tensor([0, 16, 20])).sum().backward()
        assert ker.store_stats(1)["rows_written"] == 0  # its 4 rows are still only in the cache
        ker.flush()
        stats = ker.store_stats(0)
        assert stats["rows_written"] >= 16 and "write_amplification" in stats
        assert ker.store_stats(1)["rows_written"] == 4  # the flush wrote its 4 dirty rows
        for bad in (2, -1, True, "0"):
            with pytest.raises(IndexError, match="table="):
                ker.store_stats(bad)
    finally:
        ker.close()
