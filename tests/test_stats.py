"""torchrec_mtrains.stats: curves against brute force and the real cache, SHARDS against
exact, the generator against its targets, trace files, KJT sources, bad input (CPU only)."""

from __future__ import annotations

import collections
from typing import List

import numpy as np
import pytest
import torch
from torchrec.distributed.types import CacheStatistics
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains.stats import (
    DLRM_DATASETS_REUSE,
    CurveCacheStatistics,
    SyntheticTable,
    TableTrace,
    analyze_table,
    check_dlrm_batch,
    fit_zipf_alpha,
    generate_dlrm_batch,
    lfu_curve,
    load_dlrm_trace,
    lru_curve,
    replay_cache_hit_rate,
    reuse_histogram,
    step_accesses,
    trace_from_dlrm_batches,
    trace_from_kjts,
    write_dlrm_file,
)

SIZES = (0.01, 0.05, 0.10, 0.20)  # cache sizes as a share of the table's rows


def _table(steps: List[np.ndarray], num_rows=None) -> TableTrace:
    offsets = np.concatenate([[0], np.cumsum([s.size for s in steps])]).astype(np.int64)
    ids = np.concatenate(steps).astype(np.int64) if steps else np.zeros(0, dtype=np.int64)
    return TableTrace(ids, offsets, np.ones(len(steps), dtype=np.int64), num_rows)


def _brute_lru(steps: List[np.ndarray], capacity: int) -> float:
    """A fully associative LRU cache of ``capacity`` rows, kernel semantics: a step's distinct
    rows hit iff cached before the step; then they become most recent (first occurrence order)."""
    cache: "collections.OrderedDict[int, None]" = collections.OrderedDict()
    hits = accesses = 0
    for s in steps:
        rows = list(dict.fromkeys(s.tolist()))
        hits += sum(r in cache for r in rows)
        accesses += len(rows)
        for r in rows:
            cache[r] = None
            cache.move_to_end(r)
        while len(cache) > capacity:
            cache.popitem(last=False)
    return hits / accesses


@pytest.fixture(scope="module")
def zipf_table() -> TableTrace:
    """A Zipf(1.0) trace over 200K rows, 3000 steps of 64 samples x 4 ids (~190 distinct rows
    a step, well under the 1% cache so the real cache never overflows)."""
    rows = 200_000
    batch = generate_dlrm_batch([SyntheticTable(rows, 4.0, zipf_alpha=1.0)], 64 * 3000, seed=3)
    return trace_from_dlrm_batches([batch], batch_size=64, num_rows=[rows]).tables["table_0"]


@pytest.mark.parametrize("seed", range(5))
def test_exact_lru_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    universe = int(rng.integers(5, 80))
    steps = [rng.integers(0, universe, int(rng.integers(0, 40))) for _ in range(80)]
    acc, offsets = step_accesses(_table(steps))
    curve = lru_curve(acc, offsets)
    for capacity in range(1, universe + 2):
        assert curve.hit_rate(capacity) == pytest.approx(_brute_lru(steps, capacity), abs=1e-12), capacity
    assert curve.hit_rate(0) == 0.0


def test_lfu_curve_is_top_rows_by_step_frequency() -> None:
    steps = [np.array([1, 1, 2]), np.array([1, 3]), np.array([1, 2]), np.array([4])]
    acc, _ = step_accesses(_table(steps))
    curve = lfu_curve(acc)
    # Steps per row: 1 -> 3, 2 -> 2, 3 -> 1, 4 -> 1; 7 accesses.
    assert curve.hit_rate(1) == pytest.approx(2 / 7)
    assert curve.hit_rate(2) == pytest.approx(3 / 7)
    assert curve.hit_rate(100) == pytest.approx(3 / 7)


def test_shards_within_two_points_of_exact(zipf_table: TableTrace) -> None:
    acc, offsets = step_accesses(zipf_table)
    exact = lru_curve(acc, offsets)
    sampled = lru_curve(acc, offsets, sample_rate=0.2)
    assert sampled.method == "shards"
    for share in SIZES:
        c = share * zipf_table.num_rows
        assert abs(sampled.hit_rate(c) - exact.hit_rate(c)) < 0.02, share


def test_lru_curve_within_two_points_of_real_cache(zipf_table: TableTrace) -> None:
    stats = analyze_table("t", zipf_table, sample_rate=1.0)
    for share in SIZES:
        c = int(share * zipf_table.num_rows)
        real = replay_cache_hit_rate(zipf_table, c, "lru")
        assert abs(stats.lru.hit_rate(c) - real) < 0.02, (share, stats.lru.hit_rate(c), real)


def test_perfect_lfu_near_real_lfu_cache(zipf_table: TableTrace) -> None:
    # Perfect LFU estimates the kernel's sketch LFU: on this stationary trace it reads high by
    # ~3-3.5 points; checked within 5.
    stats = analyze_table("t", zipf_table, sample_rate=1.0)
    for share in SIZES:
        c = int(share * zipf_table.num_rows)
        real = replay_cache_hit_rate(zipf_table, c, "lfu")
        assert abs(stats.lfu.hit_rate(c) - real) < 0.05, (share, stats.lfu.hit_rate(c), real)


def test_table_stats_counts() -> None:
    steps = [np.array([5, 5, 7]), np.array([7, 8]), np.array([5])]
    t = TableTrace(np.concatenate(steps), np.array([0, 3, 5, 6]), np.array([2, 1, 1]), 10)
    s = analyze_table("t", t)
    assert (s.lookups, s.unique_rows, s.step_unique_rows, s.steps, s.samples) == (6, 3, 5, 3, 4)
    assert s.pooling_factor == pytest.approx(6 / 4)
    assert s.reuse.shares.tolist()[:3] == pytest.approx([1 / 3] * 3)  # 8: 1 lookup, 7: 2, 5: 3
    stats = CurveCacheStatistics.from_table_stats(s)
    assert isinstance(stats, CacheStatistics)
    assert stats.expected_lookups == pytest.approx(5 / 3)
    assert stats.cacheability == pytest.approx(3 / 5)
    assert stats.expected_miss_rate(0.0) == 1.0 and stats.expected_miss_rate(1.0) == 0.0
    # 1 of 5 accesses hits in an LRU cache of 2 rows (7 in step 1; 5 was pushed out by 7, 8).
    assert stats.expected_miss_rate(0.2) == pytest.approx(4 / 5)


def test_generator_reproduces_zipf_alpha() -> None:
    for alpha in (0.8, 1.2):
        b = generate_dlrm_batch([SyntheticTable(100_000, 8.0, zipf_alpha=alpha)], 50_000, seed=1)
        assert fit_zipf_alpha(b.indices.numpy()) == pytest.approx(alpha, abs=0.08)


def test_generator_reproduces_reuse_histogram() -> None:
    b = generate_dlrm_batch([SyntheticTable(10_000, 40.0, reuse_histogram=DLRM_DATASETS_REUSE)], 50_000, seed=2)
    h = reuse_histogram(b.indices.numpy())
    assert np.abs(h.shares - np.asarray(DLRM_DATASETS_REUSE) / sum(DLRM_DATASETS_REUSE)).max() < 0.01
    assert b.lengths.float().mean().item() == pytest.approx(40.0, rel=0.15)


def test_generator_is_deterministic() -> None:
    tables = [SyntheticTable(1000, 3.0, zipf_alpha=1.1), SyntheticTable(5000, 20.0, reuse_histogram=DLRM_DATASETS_REUSE)]
    a, b = generate_dlrm_batch(tables, 500, seed=7), generate_dlrm_batch(tables, 500, seed=7)
    assert torch.equal(a.indices, b.indices) and torch.equal(a.lengths, b.lengths)
    assert not torch.equal(a.indices, generate_dlrm_batch(tables, 500, seed=8).indices)


@pytest.mark.parametrize("suffix", [".pt", ".pt.gz"])
def test_file_round_trip(tmp_path, suffix: str) -> None:
    tables = [SyntheticTable(1000, 3.0, zipf_alpha=1.1), SyntheticTable(2000, 2.0, zipf_alpha=0.9)]
    batch = generate_dlrm_batch(tables, 100, seed=4)
    path = tmp_path / f"trace{suffix}"
    write_dlrm_file(path, batch)
    trace = load_dlrm_trace(path, batch_size=30, table_names=["a", "b"], num_rows=[1000, 2000])
    assert list(trace.tables) == ["a", "b"]
    for t, name in enumerate(["a", "b"]):
        tt = trace.tables[name]
        lo, hi = int(batch.offsets[t * 100]), int(batch.offsets[(t + 1) * 100])
        assert np.array_equal(tt.ids, batch.indices[lo:hi].numpy())
        assert tt.samples.tolist() == [30, 30, 30, 10]
        per_step = [int(batch.lengths[t, s: s + 30].sum()) for s in range(0, 100, 30)]
        assert np.diff(tt.step_offsets).tolist() == per_step


def test_kjt_source_maps_features_to_tables() -> None:
    kjts = [
        KeyedJaggedTensor.from_lengths_sync(["f1", "f2", "g"], torch.tensor([1, 2, 7, 8, 9]),
                                            torch.tensor([1, 1, 1, 1, 1, 0])),
        KeyedJaggedTensor.from_lengths_sync(["f1", "f2", "g"], torch.tensor([3, 4, 5]),
                                            torch.tensor([0, 1, 0, 1, 1, 0])),
    ]
    trace = trace_from_kjts(kjts, {"f1": "t", "f2": "t", "g": "u"})
    assert trace.tables["t"].ids.tolist() == [1, 2, 7, 8, 3, 4]
    assert trace.tables["t"].step_offsets.tolist() == [0, 4, 6]
    assert trace.tables["u"].ids.tolist() == [9, 5]
    assert trace.tables["t"].samples.tolist() == [2, 2]
    with pytest.raises(ValueError, match="feature 'g' has no table"):
        trace_from_kjts(kjts, {"f1": "t", "f2": "t"})
    with pytest.raises(ValueError, match="negative id"):
        trace_from_kjts([KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([-1]), torch.tensor([1]))])


def _good():
    lengths = torch.tensor([[1, 2], [0, 1]])
    return torch.tensor([4, 5, 6, 7]), torch.tensor([0, 1, 3, 3, 4]), lengths


@pytest.mark.parametrize(
    "field, mutate, message",
    [
        ("indices", lambda i, o, l: (i[:3], o, l), "lengths sum to 4 ids but indices has 3"),
        ("indices", lambda i, o, l: (torch.tensor([4, -5, 6, 7]), o, l), r"indices must be >= 0: indices\[1\]"),
        ("indices", lambda i, o, l: (i.float(), o, l), "indices must be an integer tensor"),
        ("indices", lambda i, o, l: (i.reshape(2, 2), o, l), "indices must be 1-D"),
        ("offsets", lambda i, o, l: (i, o[:-1], l), "offsets has 4 entries; expected T \\* B \\+ 1 = 5"),
        ("offsets", lambda i, o, l: (i, torch.tensor([0, 1, 2, 3, 4]), l), "offsets do not match lengths"),
        ("offsets", lambda i, o, l: (i, o + 1, l), "offsets must start at 0"),
        ("lengths", lambda i, o, l: (i, o, l.reshape(-1)), "lengths must be 2-D"),
        ("lengths", lambda i, o, l: (i, o, torch.tensor([[1, 2], [-1, 2]])), "lengths must be >= 0"),
    ],
)
def test_bad_trace_names_the_field(field: str, mutate, message: str) -> None:
    check_dlrm_batch(*_good())
    with pytest.raises(ValueError, match=message) as err:
        check_dlrm_batch(*mutate(*_good()))
    assert field in str(err.value)


def test_bad_files_and_arguments(tmp_path) -> None:
    path = tmp_path / "bad.pt"
    torch.save((torch.tensor([1]), torch.tensor([0, 1])), path)
    with pytest.raises(ValueError, match=r"expected a tuple \(indices, offsets, lengths\)"):
        load_dlrm_trace(path)
    write_dlrm_file(path, check_dlrm_batch(*_good()))
    with pytest.raises(ValueError, match="num_rows=5"):
        load_dlrm_trace(path, num_rows=[5, 5])
    with pytest.raises(ValueError, match="batch_size"):
        load_dlrm_trace(path, batch_size=0)
    with pytest.raises(ValueError, match="exactly one of zipf_alpha and reuse_histogram"):
        SyntheticTable(10, 1.0)
    with pytest.raises(ValueError, match="reuse_histogram must be 16 shares"):
        SyntheticTable(10, 1.0, reuse_histogram=[1.0])
    with pytest.raises(ValueError, match="needs .* unique rows, more than num_rows=10"):
        generate_dlrm_batch([SyntheticTable(10, 100.0, reuse_histogram=[1.0] + [0.0] * 15)], 100)
    with pytest.raises(ValueError, match="sample_rate"):
        analyze_table("t", _table([np.array([1])]), sample_rate=0.0)
    with pytest.raises(ValueError, match="clf"):
        CurveCacheStatistics.from_table_stats(analyze_table("t", _table([np.array([1])]))).expected_miss_rate(-1.0)
