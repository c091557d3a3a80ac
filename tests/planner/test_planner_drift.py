"""The planner's locality model of a drifting table: each step a share of the rows moves to
fresh ids, whose first touches miss in any cache. Its predicted hit rate must match the
kernel's cache replaying the example's own drifting data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.paths import add_example_to_path
from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.planner.model.locality import histogram_locality
from torchrec_mtrains.stats import DLRM_DATASETS_LOOKUP_SHARES

add_example_to_path()


def _warm_hit_rate(steps_ids, cache_rows: int) -> float:
    """Hits / unique rows of the kernel's cache over the second half of the steps (the
    model is of a warm cache), as ``replay_cache_hit_rate`` plans each step."""
    load_extension()
    cache = torch.classes.mtrains.SetAssociativeCache(cache_rows, 32, "lru")
    half = len(steps_ids) // 2
    for step, ids in enumerate(steps_ids):
        if step == half:
            start = dict(cache.counters())
        cache.plan(torch.from_numpy(ids).contiguous(), step, step, False)
    end = dict(cache.counters())
    return (end["hits"] - start["hits"]) / (end["unique_rows"] - start["unique_rows"])


def test_drift_lowers_the_hit_rate_ceiling():
    shares = tuple(DLRM_DATASETS_LOOKUP_SHARES)
    still = histogram_locality(2_000_000, 4096.0, shares, 64.0)
    moving = histogram_locality(2_000_000, 4096.0, shares, 64.0, drift=0.05)
    big = 1_000_000
    assert still.hit_rate(big) > 0.99
    assert moving.hit_rate(big) < still.hit_rate(big) - 0.05
    assert moving.unique_rows_per_step == pytest.approx(still.unique_rows_per_step)


@pytest.mark.parametrize("drift", [0.0, 0.01, 0.05])
def test_predicted_hit_rate_matches_a_replay_of_the_drifting_data(drift):
    from data import SyntheticData, SyntheticTableSpec, table_locality

    spec, batch, steps, cache = SyntheticTableSpec("t", 2_000_000, 4.0), 1024, 300, 50_000
    data = SyntheticData([spec], batch, seed=0, drift=drift)
    ids = [data.batch(step, 0).sparse_features.values().numpy() for step in range(steps)]
    replayed = _warm_hit_rate(ids, cache)
    loc = table_locality(spec, batch)  # the histogram and trace length the example gives the planner
    shares = tuple(loc["reuse_histogram"])
    predicted = histogram_locality(spec.num_rows, batch * spec.pooling_factor, shares, loc["reuse_trace_steps"],
                                   drift=drift).hit_rate(cache)
    assert abs(predicted - replayed) < 0.04, (predicted, replayed)
