"""The look-ahead window a plan gives its tiered tables (planner/model/lookahead.py): the
largest choice whose window rows fit every SSD table's cache, none without an SSD table,
the user's when given; every tiered table's plan entry carries it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model.locality import zipf_locality
from torchrec_mtrains.planner.model.lookahead import LOOKAHEAD_CHOICES, choose_lookahead, window_rows
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParameterSharding


def test_window_rows_follow_the_trace() -> None:
    """The distinct rows of m steps the curve predicts are those of a Zipf trace drawn alike."""
    rows, lookups, alpha = 200_000, 20_000, 1.05
    curve = zipf_locality(rows, lookups, alpha)
    rng = np.random.default_rng(0)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    steps = [rng.choice(rows, size=lookups, p=p / p.sum()) for _ in range(9)]
    for m in (1, 3, 9):
        measured = len(np.unique(np.concatenate(steps[:m])))
        assert window_rows(curve, m) == pytest.approx(measured, rel=0.03), m


def test_choice_fits_the_window_rows_in_every_ssd_cache() -> None:
    curve = zipf_locality(4_000_000, 163_840, 1.05)  # the kernel benchmark's Zipf workload
    assert choose_lookahead([]) == 0
    assert choose_lookahead([(Tier.DRAM, 400_000, curve), (Tier.SCM, 400_000, curve)]) == 0  # no SSD table
    k = choose_lookahead([(Tier.SSD, 400_000, curve)])
    assert k in LOOKAHEAD_CHOICES and k > 0
    assert window_rows(curve, k + 2) <= 400_000
    bigger = LOOKAHEAD_CHOICES[LOOKAHEAD_CHOICES.index(k) + 1]
    assert window_rows(curve, bigger + 2) > 400_000  # the largest that fits
    small = choose_lookahead([(Tier.SSD, 400_000, curve), (Tier.SSD, 150_000, curve)])
    assert small < k  # the tightest SSD cache sets it
    assert choose_lookahead([(Tier.SSD, 60_000, curve)]) == 0  # not even two steps' rows fit


def _ebc() -> EmbeddingBagCollection:
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=32, feature_names=[f"f_{name}"])
        for name, rows in (("big", 20_000_000), ("small", 100_000))])


def _planner(tmp_path: Path, **kwargs) -> StorageAwarePlanner:
    locality = {"big": {"pooling_factor": 4, "zipf_alpha": 1.1}, "small": {"pooling_factor": 1, "zipf_alpha": 0.8}}
    node = dataclasses.replace(CPU_NODE, tiers={t: s for t, s in CPU_NODE.tiers.items() if t is not Tier.SCM})
    return StorageAwarePlanner(node, batch_size=4096, world_size=1, locality=locality,
                               budget_bytes={Tier.DRAM: 200e6}, storage_dir=str(tmp_path), **kwargs)


def _windows(plan) -> dict:
    return {name: ps.tiered.lookahead for name, ps in plan.plan[""].items() if isinstance(ps, TieredParameterSharding)}


def test_plan_gives_its_ssd_tables_a_window(tmp_path: Path) -> None:
    planner = _planner(tmp_path)
    plan = planner.plan(_ebc(), [TieredEmbeddingBagCollectionSharder()])
    big = planner.last_placement.tables["big"]
    assert big.tier is Tier.SSD, big
    curve = planner.last_model.tables[[t.name for t in planner.last_model.tables].index("big")].locality
    assert planner.last_lookahead == choose_lookahead([(Tier.SSD, big.cache_rows, curve)])
    assert planner.last_lookahead > 0
    windows = _windows(plan)
    assert windows and set(windows.values()) == {planner.last_lookahead}


def test_users_window_is_kept_and_checked(tmp_path: Path) -> None:
    planner = _planner(tmp_path, lookahead=3)
    plan = planner.plan(_ebc(), [TieredEmbeddingBagCollectionSharder()])
    assert planner.last_lookahead == 3 and set(_windows(plan).values()) == {3}
    for bad in (-1, 1.5, True, 100_000):
        with pytest.raises(ValueError, match="lookahead"):
            _planner(tmp_path, lookahead=bad)
