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
    DLRM_DATASETS_LOOKUP_SHARES,
    DLRM_DATASETS_REUSE,
    DLRM_DATASETS_ROW_SHARES,
    REUSE_BIN_EDGES,
    REUSE_BIN_EDGES_16,
    CurveCacheStatistics,
    SyntheticTable,
    TableTrace,
    analyze_table,
    bin_mean_reuse,
    check_dlrm_batch,
    fit_zipf_alpha,
    generate_dlrm_batch,
    lfu_curve,
    load_dlrm_trace,
    lookups_per_unique_row,
    lru_curve,
    replay_cache_hit_rate,
    reuse_histogram,
    step_accesses,
    trace_from_dlrm_batches,
    trace_from_kjts,
    write_dlrm_file,
)
from torchrec_mtrains.stats.characterize import characterize, table_report

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


def _lookup_share_tolerance(shares: np.ndarray, lookups: int, edges) -> np.ndarray:
    """Per-bin bound on |measured - target| lookup share: 4 sigma of the sum of the bin's
    log-uniform counts (coefficient of variation < 0.3 in a bin spanning a factor 2), plus
    one row's lookups for the rounding of the bin's rows, plus the shift of every share when
    each bin's rounding moves the total (a bin of mean reuse 47K in 1M lookups is 0.4 rows)."""
    mean = bin_mean_reuse(edges)
    rows = np.maximum(shares * lookups / mean, 1.0)
    return 4 * 0.3 * shares / np.sqrt(rows) + mean / lookups + shares * mean[shares > 0].sum() / lookups


@pytest.mark.parametrize("target, edges", [
    (DLRM_DATASETS_LOOKUP_SHARES, REUSE_BIN_EDGES),
    ((0.3, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0, 0, 0, 0, 0, 0, 0), REUSE_BIN_EDGES_16),
])
def test_generator_reproduces_lookup_shares(target, edges) -> None:
    # The histogram is the share of LOOKUPS by the reuse bin of their row; a 16-value one
    # is in the bins up to 16K+.
    b = generate_dlrm_batch([SyntheticTable(2_000_000, 20.0, reuse_histogram=target)], 50_000, seed=2)
    ids = b.indices.numpy()
    h = reuse_histogram(ids, edges)
    want = np.asarray(target) / sum(target)
    tol = _lookup_share_tolerance(want, ids.size, edges)
    assert np.all(np.abs(h.lookup_shares - want) <= tol), (h.lookup_shares.round(4), want, tol.round(4))
    assert h.lookups == ids.size and h.lookup_shares.sum() == pytest.approx(1.0)
    assert b.lengths.float().mean().item() == pytest.approx(20.0, rel=0.15)


def test_generator_gives_dlrm_datasets_reuse_per_unique_row() -> None:
    # dlrm_datasets: 887.0M lookups on 128.4M unique rows (6.9 each) in a batch of 65,536
    # samples over 856 tables, i.e. ~1.04M lookups a table (pooling ~15.8).
    b = generate_dlrm_batch([SyntheticTable(10_000_000, 15.8, reuse_histogram=DLRM_DATASETS_REUSE)], 65_536, seed=3)
    h = reuse_histogram(b.indices.numpy())
    assert h.lookups / h.rows == pytest.approx(6.9, rel=0.05)
    assert lookups_per_unique_row(DLRM_DATASETS_LOOKUP_SHARES) == pytest.approx(6.9, rel=0.02)
    # ... and the unique rows spread over the bins as the other published histogram says.
    assert np.abs(h.row_shares - np.asarray(DLRM_DATASETS_ROW_SHARES)).max() < 0.01
    assert DLRM_DATASETS_REUSE == DLRM_DATASETS_LOOKUP_SHARES


def _step_ids(table: SyntheticTable, step: int, seed: int = 5) -> np.ndarray:
    return generate_dlrm_batch([table], 4096, seed=seed, step=step).indices.numpy()


def _top_ids(ids: np.ndarray, min_count: int) -> set:
    rows, counts = np.unique(ids, return_counts=True)
    return set(rows[counts >= min_count].tolist())


@pytest.mark.parametrize("drift", [0.02, 0.1])
def test_drift_moves_that_share_of_the_popular_ids_per_step(drift: float) -> None:
    table = SyntheticTable(400_000, 10.0, reuse_histogram=DLRM_DATASETS_REUSE, drift=drift)
    steps = [_step_ids(table, s) for s in (7, 8)]
    tops = [_top_ids(ids, 8) for ids in steps]
    k = len(tops[0])
    assert k > 500 and len(tops[1]) == k  # ranks keep their counts: the same number of hot rows
    overlap = len(tops[0] & tops[1]) / k
    assert abs(overlap - (1 - drift)) < 4 * np.sqrt(drift * (1 - drift) / k) + 1 / k, (overlap, k)
    # Same counts per rank, so the same histogram, on other ids.
    a, b = (reuse_histogram(ids) for ids in steps)
    assert np.array_equal(a.row_shares, b.row_shares) and np.array_equal(a.lookup_shares, b.lookup_shares)
    # After 1/drift steps every rank has moved once: no id is still there; ids are fresh.
    later = _step_ids(table, 7 + int(round(1 / drift)))
    assert not set(np.unique(steps[0])) & set(np.unique(later))
    np.testing.assert_array_equal(_step_ids(table, 8), steps[1])  # deterministic in (seed, step)


def test_no_drift_keeps_the_same_rows_and_counts() -> None:
    table = SyntheticTable(400_000, 10.0, reuse_histogram=DLRM_DATASETS_REUSE)
    a, b = _step_ids(table, 0), _step_ids(table, 9)
    assert not np.array_equal(a, b)  # another draw (order)...
    ra, ca = np.unique(a, return_counts=True)
    rb, cb = np.unique(b, return_counts=True)
    assert np.array_equal(ra, rb) and np.array_equal(ca, cb)  # ...of the same rows and counts


def test_characterize_reports_both_reuse_views(tmp_path, capsys) -> None:
    import json

    from torchrec_mtrains.commands.characterize import main

    b = generate_dlrm_batch([SyntheticTable(200_000, 4.0, reuse_histogram=DLRM_DATASETS_REUSE)], 8192, seed=1)
    write_dlrm_file(tmp_path / "t.pt", b)
    assert main([str(tmp_path / "t.pt"), "--batch-size", "1024", "--json"]) == 0
    reuse = json.loads(capsys.readouterr().out)["tables"][0]["reuse"]
    assert {"labels", "share_of_lookups", "share_of_unique_rows"} <= set(reuse)
    assert main([str(tmp_path / "t.pt"), "--batch-size", "1024"]) == 0
    printed = capsys.readouterr().out
    assert "lookups = share of lookups by the reuse bin of their row" in printed
    views = [line.split()[1] for line in printed.splitlines() if line.startswith("table_0  ")][1:]
    assert views == ["lookups", "rows"]  # after the statistics row: one line per view
    (stats,) = characterize([b], 1024)
    report = table_report(stats, qps=1000.0, batch_size=1024, dim=16)["reuse"]
    assert report["share_of_lookups"] == pytest.approx(stats.reuse.lookup_shares.tolist())
    assert report["share_of_unique_rows"] == pytest.approx(stats.reuse.row_shares.tolist())
    assert report["shares"] == report["share_of_unique_rows"]
    assert len(report["labels"]) == 17 and report["labels"][-1] == "32768+"
    # Hot rows are few but take most lookups: the two views differ.
    assert report["share_of_unique_rows"][0] > 0.4 > report["share_of_lookups"][0]


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
