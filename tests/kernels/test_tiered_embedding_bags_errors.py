"""TieredEmbeddingBags: constructor errors and bad batches (CPU only).

Every bad batch raises ValueError / IndexError naming the problem, whether it comes to
forward() or prefetch(), with or without prefetched batches queued; nothing reaches the tier
(store rows read / written unchanged), the cache counters do not move, and the module goes
on training exactly like the reference.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from tests.support.tiered_helpers import (
    Model,
    Workload,
    assert_tables_match,
    make_kernel,
    make_steps,
    output_checker,
    reference_run,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
    store_stats,
    table_lookups,
)
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.testing import inject_device_fault

SPECS = [(1500, 8), (600, 16)]


# Constructor --------------------------------------------------------------------------------
CONSTRUCTOR_ERRORS = {
    "dim_not_multiple_of_4": (dict(embedding_specs=[(100, 8), (100, 6)]), "multiple of 4"),
    "dim_zero": (dict(embedding_specs=[(100, 0)]), "dim"),
    "rows_zero": (dict(embedding_specs=[(0, 8)]), "num_rows"),
    "no_tables": (dict(embedding_specs=[]), "embedding_specs"),
    "optimizer_lars": (dict(optimizer=EmbOptimType.LARS_SGD), "optimizer"),
    "optimizer_shampoo": (dict(optimizer=EmbOptimType.SHAMPOO), "optimizer"),
    "tier_hbm_on_cpu": (dict(tier=Tier.HBM), "HBM"),
    "scm_without_storage_dir": (dict(tier=Tier.SCM, storage_dir=None), "storage_dir"),
    "ssd_without_storage_dir": (dict(tier=Tier.SSD, storage_dir=None), "storage_dir"),
    "cache_rows_and_load_factor": (dict(cache_rows=10, cache_load_factor=0.1), "cache_rows or cache_load_factor"),
    "cache_rows_zero": (dict(cache_rows=0), "cache_rows"),
    "cache_rows_wrong_count": (dict(cache_rows=[10]), "cache_rows"),
    "cache_load_factor_zero": (dict(cache_load_factor=0.0), "cache_load_factor"),
    "cache_algorithm": (dict(cache_algorithm="fifo"), "cache_algorithm"),
    "pooling_none_mixed_dims": (dict(embedding_specs=[(100, 8), (100, 16)], pooling_mode=PoolingMode.NONE),
                                "tables of one dim"),
    "precision_int8": (dict(weights_precision=SparseType.INT8), "weights_precision"),
    "learning_rate_nan": (dict(learning_rate=math.nan), "learning_rate"),
    "duplicate_table_names": (dict(table_names=["a", "a"]), "table_names"),
    "tier_not_a_tier": (dict(tier="ssd"), "tier"),
}


@pytest.mark.parametrize("name", list(CONSTRUCTOR_ERRORS))
def test_constructor_rejects(tmp_path: Path, name: str) -> None:
    overrides, match = CONSTRUCTOR_ERRORS[name]
    storage_dir = tmp_path / "store"
    kwargs = dict(embedding_specs=SPECS, tier=Tier.SSD, storage_dir=str(storage_dir))
    kwargs.update(overrides)
    specs = kwargs.pop("embedding_specs")
    with pytest.raises(ValueError, match=match):
        TieredEmbeddingBags(specs, **kwargs)
    # Configuration is validated before any table file is created.
    assert not storage_dir.exists() or not any(storage_dir.iterdir())


# Bad batches ----------------------------------------------------------------------------------
def _parts(idx: torch.Tensor, off: torch.Tensor) -> Tuple[int, int]:
    b = (off.numel() - 1) // 2
    return int(off[b]), b  # start of table 1 in indices, batch size


def _set(idx: torch.Tensor, pos: int, value: int) -> torch.Tensor:
    idx = idx.clone()
    idx[pos] = value
    return idx


BadBatch = Callable[[torch.Tensor, torch.Tensor], Tuple[object, object]]
BAD_BATCHES: Dict[str, Tuple[BadBatch, type, str]] = {
    "id_past_table_0": (lambda i, o: (_set(i, 0, 1500), o), IndexError, r"table_0.*1500"),
    "id_past_table_1": (lambda i, o: (_set(i, _parts(i, o)[0], 600), o), IndexError, r"table_1.*600"),
    # 700 is a valid id of table 0 but not of table 1 (600 rows).
    "id_of_other_table": (lambda i, o: (_set(i, i.numel() - 1, 700), o), IndexError, r"table_1.*700"),
    "negative_id": (lambda i, o: (_set(i, 1, -3), o), IndexError, r"table_0.*-3"),
    "offsets_decrease": (lambda i, o: (i, torch.cat([o[:5], o[4:5] - 1, o[6:]])), ValueError, "decrease"),
    "offsets_length_not_TB_plus_1": (lambda i, o: (i, torch.cat([o[:3], o[4:]])), ValueError, "T \\* B \\+ 1"),
    "offsets_not_ending_at_len": (lambda i, o: (torch.cat([i, i[:1]]), o), ValueError, "end at len"),
    "offsets_not_starting_at_0": (lambda i, o: (i, torch.cat([o[:1] + 1, o[1:]])), ValueError, "start at 0"),
    "float_indices": (lambda i, o: (i.float(), o), ValueError, "indices"),
    "float_offsets": (lambda i, o: (i, o.double()), ValueError, "offsets"),
    "indices_2d": (lambda i, o: (i.view(1, -1), o), ValueError, "indices"),
    "indices_not_a_tensor": (lambda i, o: (i.tolist(), o), ValueError, "indices"),
}
_TIMING = ("plan_seconds", "tier_seconds", "prefetch_wait_seconds")


def _quiesce(ker: TieredEmbeddingBags) -> None:
    """Waits until every step handed to the step engine has planned and moved (internal)."""
    ker._steps.drain()


def _snapshot(ker: TieredEmbeddingBags) -> Tuple[dict, List[Tuple[float, float]]]:
    _quiesce(ker)
    cache = {n: {k: v for k, v in st.items() if k not in _TIMING} for n, st in ker.cache_stats().items()}
    stores = [(st["rows_read"], st["rows_written"]) for st in store_stats(ker)]
    return cache, stores


def _run_with_a_bad_call(tmp_path: Path, tier: Tier, pipeline: bool, workload: Workload,
                         bad_call: Callable[[TieredEmbeddingBags, list], None], queued: int) -> None:
    """Trains 10 steps, queues `queued` prefetches of the next batches, makes `bad_call`
    (which must raise), checks nothing moved, then trains to the end against the reference."""
    model = Model()
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    check = output_checker(traj, model)
    ker = make_kernel(model, tier, tmp_path, cache_rows=16, cache_ways=4, prefetch_pipeline=pipeline)

    def step(s: int) -> None:
        st = steps[s]
        out = ker(st.indices, st.offsets, st.per_sample_weights)
        check(s, out.detach())
        out.backward(st.grad)

    for s in range(10):
        step(s)
    for s in range(10, 10 + queued):
        ker.prefetch(steps[s].indices, steps[s].offsets)
    before = _snapshot(ker)
    bad_call(ker, steps)
    assert _snapshot(ker) == before, "a rejected call moved rows or cache counters"
    for s in range(10, len(steps)):
        step(s)
    assert_tables_match(ker, traj, model)
    # Every step planned exactly once: the rejected call left no plan behind.
    stats = ker.cache_stats()
    for t, (lookups, unique) in enumerate(table_lookups(model.specs, steps)):
        assert (stats[f"table_{t}"]["lookups"], stats[f"table_{t}"]["unique_rows"]) == (lookups, unique)
    ker.close()


ENTRY_POINTS = {
    # forward(bad) with no prefetched batch waiting
    "forward": 0,
    # prefetch(b10), prefetch(bad): the queued batch is kept
    "prefetch_behind_a_queued_batch": 1,
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("bad", list(BAD_BATCHES))
def test_bad_batch_is_rejected_and_changes_nothing(tmp_path: Path, bad: str, entry: str) -> None:
    make_bad, exc, match = BAD_BATCHES[bad]
    tier = [Tier.DRAM, Tier.SCM, Tier.SSD][len(bad) % 3]

    def bad_call(ker: TieredEmbeddingBags, steps: list) -> None:
        idx, off = make_bad(steps[10].indices, steps[10].offsets)
        with pytest.raises(exc, match=match):
            if entry == "forward":
                ker(idx, off)
            else:
                ker.prefetch(idx, off)

    _run_with_a_bad_call(tmp_path, tier, pipeline=len(bad) % 2 == 0, workload=Workload(steps=20, data_seed=30),
                         bad_call=bad_call, queued=ENTRY_POINTS[entry])


@pytest.mark.parametrize("bad", ["id_past_table_1", "offsets_decrease", "float_indices"])
def test_bad_batch_to_forward_while_batches_are_queued(tmp_path: Path, bad: str) -> None:
    """prefetch(b10), prefetch(b11), forward(bad): rejected (as a batch other than the one
    prefetched, or as bad input), and b10, b11 then run normally."""
    make_bad, _, _ = BAD_BATCHES[bad]

    def bad_call(ker: TieredEmbeddingBags, steps: list) -> None:
        with pytest.raises((ValueError, IndexError)):
            ker(*make_bad(steps[10].indices, steps[10].offsets))

    _run_with_a_bad_call(tmp_path, Tier.SSD, True, Workload(steps=20, data_seed=31), bad_call, queued=2)


def test_out_of_range_id_message_names_table_and_id(tmp_path: Path) -> None:
    ker = make_kernel(Model(), Tier.SCM, tmp_path, cache_rows=8, table_names=["users", "items"])
    idx = torch.tensor([0, 1499, 7, 600])
    off = torch.tensor([0, 1, 2, 3, 4])  # B = 2: users [0], [1499]; items [7], [600]
    with pytest.raises(IndexError) as info:
        ker(idx, off)
    msg = str(info.value)
    assert "items" in msg and "600" in msg and "users" not in msg, msg
    ker.close()


# Per-sample weights -------------------------------------------------------------------------
PSW_BAD = {
    "one_too_many": lambda w: torch.cat([w, w[:1]]),
    "one_too_few": lambda w: w[:-1],
    "2d": lambda w: w.view(-1, 1),
    "integer": lambda w: (w * 10).long(),
    "not_a_tensor": lambda w: w.tolist(),
}


@pytest.mark.parametrize("bad", list(PSW_BAD))
def test_bad_per_sample_weights_raise(tmp_path: Path, bad: str) -> None:
    model = Model()
    st = make_steps(model.specs, Workload(steps=1, per_sample_weights=True, data_seed=32))[0]
    ker = make_kernel(model, Tier.DRAM, None, cache_rows=16)
    with pytest.raises(ValueError, match="per_sample_weights"):
        ker(st.indices, st.offsets, PSW_BAD[bad](st.per_sample_weights))
    ker.close()


@pytest.mark.parametrize("queued", [0, 2], ids=["no_prefetch", "two_prefetched"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipeline"])
def test_bad_per_sample_weights_change_nothing(tmp_path: Path, pipeline: bool, queued: int) -> None:
    """forward(b10, bad weights) raises before anything is planned or loaded, and leaves
    the prefetched b10 (and b11) queued: forward(b10, good weights) then runs."""
    bad = list(PSW_BAD)[2 * pipeline + queued // 2]

    def bad_call(ker: TieredEmbeddingBags, steps: list) -> None:
        st = steps[10]
        with pytest.raises(ValueError, match="per_sample_weights"):
            ker(st.indices, st.offsets, PSW_BAD[bad](st.per_sample_weights))

    _run_with_a_bad_call(tmp_path, Tier.SSD, pipeline, Workload(steps=20, per_sample_weights=True, data_seed=32),
                         bad_call, queued=queued)


# A batch other than the prefetched one ------------------------------------------------------
@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipeline"])
def test_forward_of_a_batch_other_than_the_prefetched_one(tmp_path: Path, pipeline: bool) -> None:
    def bad_call(ker: TieredEmbeddingBags, steps: list) -> None:
        with pytest.raises(ValueError, match="prefetch"):
            ker(steps[11].indices, steps[11].offsets)
        off = steps[10].offsets.clone()  # same ids, one bag boundary moved
        i = next(i for i in range(1, off.numel() - 1) if off[i - 1] < off[i + 1])
        off[i] = off[i - 1] if off[i] > off[i - 1] else off[i + 1]
        with pytest.raises(ValueError, match="prefetch"):
            ker(steps[10].indices, off)

    _run_with_a_bad_call(tmp_path, Tier.SCM, pipeline, Workload(steps=20, data_seed=33), bad_call, queued=1)


@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipeline"])
@pytest.mark.parametrize("tier", [Tier.SCM, Tier.SSD], ids=["scm", "ssd"])
def test_cancel_prefetch_lets_forward_take_another_batch(tmp_path: Path, tier: Tier, pipeline: bool) -> None:
    """prefetch(b10), prefetch(b11), cancel_prefetch(): forward then takes any batch, and the
    cancelled prefetches' row moves leave the tables exactly as the reference trains them."""
    model = Model()
    workload = Workload(steps=20, data_seed=34)
    traj, steps = reference_run(model, workload), make_steps(model.specs, workload)
    check = output_checker(traj, model)
    ker = make_kernel(model, tier, tmp_path, cache_rows=16, cache_ways=4, prefetch_pipeline=pipeline)
    for s in range(len(steps)):
        if s in (5, 12):  # prefetch the wrong batches, then drop them
            ker.prefetch(steps[s + 3].indices, steps[s + 3].offsets)
            ker.prefetch(steps[s + 4].indices, steps[s + 4].offsets)
            assert ker.pending_prefetches == 2
            with pytest.raises(ValueError, match="cancel_prefetch"):
                ker(steps[s].indices, steps[s].offsets)
            assert ker.cancel_prefetch() == 2 and ker.pending_prefetches == 0
        out = ker(steps[s].indices, steps[s].offsets, steps[s].per_sample_weights)
        check(s, out.detach())
        out.backward(steps[s].grad)
    assert ker.cancel_prefetch() == 0
    assert_tables_match(ker, traj, model)
    ker.close()


@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipeline"])
def test_cancelled_prefetches_do_not_keep_their_slots_locked(tmp_path: Path, pipeline: bool) -> None:
    """prefetch + cancel_prefetch, again and again with no step computed: a dropped step never
    runs, so its rows' slots are free again and the cache does not grow an overflow pool."""
    ker = TieredEmbeddingBags([(5000, 8)], tier=Tier.DRAM, cache_rows=64, cache_ways=4,
                              storage_dir=str(tmp_path), prefetch_pipeline=pipeline)
    offsets = torch.tensor([0, 48])
    for k in range(40):  # 48 new rows each time: more than the cache holds after two
        ker.prefetch(torch.arange(48 * k, 48 * (k + 1)), offsets)
        assert ker.cancel_prefetch() == 1
    ids = torch.arange(3000, 3048)
    ker(ids, offsets).sum().backward()
    assert ker.cache_stats()["table_0"]["cache_capacity_rows"] <= 64 + 48, "dropped steps kept slots locked"
    ker.close()


# Tier I/O errors ----------------------------------------------------------------------------
def test_tier_io_error_names_table_tier_and_file(tmp_path: Path) -> None:
    """A full disk under a table (ENOSPC injected into its block store) surfaces as an
    OSError with errno 28 naming the table, its tier and its file (docs/reliability.md)."""
    import errno

    ker = make_kernel(Model(), Tier.SSD, tmp_path, cache_rows=8, table_names=["users", "items"])
    steps = make_steps(Model().specs, Workload(steps=3, data_seed=5))
    for s in steps:
        ker(s.indices, s.offsets).sum().backward()
    inject_device_fault(ker._cache.stores[1], "write_error", count=1000, errno_code=errno.ENOSPC)
    with pytest.raises(OSError) as info:
        ker.flush()
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC, msg
    assert "table items on SSD: " in msg and str(tmp_path / "items.blk") in msg, msg
