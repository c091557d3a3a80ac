"""The look-ahead window a plan gives its tiered tables (planner/model/lookahead.py): the
largest choice whose locked rows fit half of every SSD table's cache, none without an SSD
table, the user's when given; every tiered table's plan entry carries it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model.lookahead import LOCKED_SHARE, choose_lookahead
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParameterSharding


def test_choice_fits_the_locked_rows_in_every_ssd_cache() -> None:
    assert choose_lookahead([]) == 0
    assert choose_lookahead([(Tier.DRAM, 1000.0, 10.0), (Tier.SCM, 1000.0, 10.0)]) == 0  # no SSD table
    assert choose_lookahead([(Tier.SSD, 1e6, 10.0)]) == 8  # room for the largest
    # (k + 2) x 1,000 distinct rows within half of 9,000 slots: k = 2 (4,000), not 4 (6,000).
    assert choose_lookahead([(Tier.SSD, 9000.0, 1000.0)]) == 2
    assert choose_lookahead([(Tier.SSD, 1e6, 10.0), (Tier.SSD, 9000.0, 1000.0)]) == 2  # the tightest sets it
    assert choose_lookahead([(Tier.SSD, 1000.0, 1000.0)]) == 0  # not even the live steps fit half
    assert LOCKED_SHARE == 0.5


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
    unique = planner.last_model.tables[[t.name for t in planner.last_model.tables].index("big")].locality
    assert planner.last_lookahead == choose_lookahead([(Tier.SSD, big.cache_rows, unique.unique_rows_per_step)])
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
