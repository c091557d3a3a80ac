"""Synthetic ids for tables of hundreds of millions of rows, without per-row arrays; the
planner's and the kernel's view of a lazily initialised table (disk for the rows written)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.paths import add_example_to_path
from torchrec_mtrains.stats.large_tables import (
    KeyedPermutation,
    expected_distinct_zipf,
    hashed_normal,
    zipf_ranks,
)

add_example_to_path()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097, 65_537])
def test_keyed_permutation_is_a_bijection(n):
    perm = KeyedPermutation(n, seed=5)
    image = perm(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))
    assert np.array_equal(perm(np.arange(n)), image)  # a function of (n, seed)
    if n > 64:
        assert not np.array_equal(image, KeyedPermutation(n, seed=6)(np.arange(n)))
        assert (image != np.arange(n)).mean() > 0.9  # it moves nearly every id


def test_keyed_permutation_rejects_ids_outside_its_domain():
    perm = KeyedPermutation(100, 0)
    with pytest.raises(ValueError, match="100 is outside"):
        perm(np.array([5, 100]))
    with pytest.raises(ValueError, match="n=0"):
        KeyedPermutation(0, 0)


def test_zipf_ranks_match_the_exact_distribution_head_and_tail():
    n, alpha, draws = 20_000, 0.9, 2_000_000
    p = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    got = np.bincount(zipf_ranks(np.random.default_rng(0), n, draws, alpha, head=200), minlength=n) / draws
    sigma = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(got[:200] - p[:200]) < 5 * sigma[:200] + 1e-9)  # the exact head
    for lo, hi in [(200, 1_000), (1_000, 5_000), (5_000, n)]:  # the tail, by its integral
        want, seen = p[lo:hi].sum(), got[lo:hi].sum()
        assert abs(seen - want) < 5 * np.sqrt(want / draws) + 2e-4, (lo, hi, seen, want)


def test_expected_distinct_zipf_matches_a_simulation():
    n, alpha, lookups = 200_000, 0.8, 300_000
    seen = np.unique(zipf_ranks(np.random.default_rng(1), n, lookups, alpha, head=1_000)).size
    assert abs(expected_distinct_zipf(n, alpha, lookups, head=1_000) - seen) < 0.02 * seen


def test_hashed_normal_is_standard_normal_and_deterministic():
    x = hashed_normal(3, np.arange(400_000))
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01
    assert np.array_equal(x[:10], hashed_normal(3, np.arange(10)))
    assert not np.array_equal(x[:10], hashed_normal(4, np.arange(10)))


def _large_sampler(alpha=None, rows=1_000_000_000, drift=0.0):
    from data import SyntheticTableSpec, _LargeTableSampler

    return _LargeTableSampler(SyntheticTableSpec("big", rows, 4.0, alpha), seed=3, drift=drift)


def test_large_table_sampler_holds_no_per_row_arrays():
    for sampler in (_large_sampler(0.9), _large_sampler(None, drift=0.01)):
        arrays = [v for v in vars(sampler).values() if isinstance(v, np.ndarray)]
        assert sum(a.nbytes for a in arrays) < 64 << 20  # a 1e9-row table: 8 GB per array otherwise
        lengths, ids, effect = sampler.sample(np.random.default_rng(0), 256, step=5)
        assert ids.size == lengths.sum() and effect.shape == (256,)
        assert ids.min() >= 0 and ids.max() < 1_000_000_000


def test_large_table_drift_moves_the_working_set_as_specified():
    sampler = _large_sampler(None, rows=100_000_000, drift=0.25)
    u = sampler.ranks
    ranks = np.arange(u)
    ids_at = lambda step: sampler.perm(((np.floor(step * 0.25 + sampler.phase) * u + ranks) % sampler.num_rows)
                                       .astype(np.int64))
    # Each step a quarter of the ranks takes a fresh id; after 4 steps every rank has moved.
    moved = (ids_at(1) != ids_at(0)).mean()
    assert 0.22 < moved < 0.28
    assert not np.intersect1d(ids_at(0), ids_at(4)).size
    # Draws follow the ranks' ids of their step.
    rng = np.random.default_rng(0)
    _, ids, _ = sampler.sample(rng, 512, step=4)
    assert np.isin(ids, ids_at(4)).all()
    # The planner's estimate of the rows a run writes, against the rows a run draws.
    seen = np.unique(np.concatenate([sampler.sample(rng, 1024, step)[1] for step in range(40)])).size
    assert abs(sampler.expected_rows(40, 1024) - seen) < 0.05 * seen, seen


def test_hashed_down_ids_stay_within_max_rows():
    from data import SyntheticData, SyntheticTableSpec, hashed_down

    tables = [SyntheticTableSpec("big", 50_000_000, 2.0, 0.9), SyntheticTableSpec("small", 5_000, 1.0)]
    assert [t.num_rows for t in hashed_down(tables, 10_000)] == [10_000, 5_000]
    batch = SyntheticData(tables, 64, 0, max_rows=10_000).batch(0, 0)
    kjt = batch.sparse_features
    assert int(kjt["f_big"].values().max()) < 10_000 and int(kjt["f_small"].values().max()) < 5_000


def test_run_config_checks_every_key(tmp_path):
    from run_config import load_run_config, preset_path

    flags = {"steps": 200, "drift": 0.01}
    good = tmp_path / "good.yaml"
    good.write_text("args: {steps: 7}\ntables:\n  - {name: a, num_rows: 100, pooling_factor: 2, zipf_alpha: 1.0}\n")
    defaults, tables = load_run_config(str(good), flags)
    assert defaults == {"steps": 7} and tables[0].num_rows == 100 and tables[0].zipf_alpha == 1.0
    for text, message in [("args: {stepz: 1}", "args.stepz is not a flag"),
                          ("tables: [{name: a, num_rows: 0}]", "num_rows=0"),
                          ("tables: [{name: a, num_rows: 5, colour: red}]", "unknown keys \\['colour'\\]"),
                          ("other: 1", "expected a mapping")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            load_run_config(str(bad), flags)
    assert preset_path("beyond-ram").endswith("beyond_ram.yaml")
    with pytest.raises(ValueError, match="beyond-ram"):
        preset_path("no-such")


def test_planner_counts_only_rows_written_on_the_ssd_tier():
    from torchrec_mtrains import Tier
    from torchrec_mtrains.planner.model.model_spec import parse_model_spec

    def spec(**extra):
        table = {"name": "t", "num_embeddings": 400_000_000, "embedding_dim": 128, "pooling_factor": 8,
                 "zipf_alpha": 0.9, **extra}
        return parse_model_spec({"batch_size": 4096, "target_qps": 1.0, "tables": [table]}).tables[0]

    whole, lazy = spec(), spec(rows_written=10_000_000)
    assert whole.bytes_on(Tier.SSD) == whole.bytes
    assert lazy.bytes_on(Tier.SSD) == 10_000_000 * lazy.row_bytes
    assert lazy.bytes_on(Tier.SCM) == lazy.bytes  # the SCM store reserves its whole file
    with pytest.raises(ValueError, match="rows_written"):
        spec(rows_written=0)


def test_tiered_params_carry_rows_written_through_fused_params(tmp_path):
    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredParams

    params = TieredParams(Tier.SSD, cache_rows=10, storage_dir=str(tmp_path), rows_written=1234)
    assert TieredParams.from_fused_params(params.to_fused_params()) == params
    with pytest.raises(ValueError, match="rows_written"):
        TieredParams(Tier.SSD, cache_rows=10, storage_dir=str(tmp_path), rows_written=-1)
