"""Planner speed-ups give the same answers: the LRU curve that skips saturated exp()s is
bit for bit the plain formula, libyaml reads the model suite as PyYAML does, and placements
that share a PlacementMemo and run step 1 once per start order equal each strategy run
from scratch (tiers, caches, bytes and predicted QPS, exactly)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from tests.support.paths import MODEL_CONFIGS
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model import locality
from torchrec_mtrains.planner.model.model_spec import _YAML_LOADER, parse_model_spec
from torchrec_mtrains.planner.model.placement import Placement, PlacementError, PlacementMemo, place
from torchrec_mtrains.planner.model.placement_search import STRATEGIES, Placer, Strategy
from torchrec_mtrains.planner.model.placement_state import BusyTiersError, Limits
from torchrec_mtrains.planner.model.sizing import size_cluster
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

G = 2**30
GPU_NODE = TieredTopology(
    "test-gpu", "cuda", 8,
    {Tier.HBM: TierSpec(60 * G, 1.5e12, 1.5e12), Tier.DRAM: TierSpec(128 * G, 2e10, 2e10),
     Tier.SCM: TierSpec(512 * G, 5e9, 2e9, None, None, 256), Tier.SSD: TierSpec(2000 * G, 6e9, 4e9, 1e6, 2e5, 4096)},
    ComputeSpec(3e11, 1e-4, 5e-9, 1e-8), host_device_bytes_per_s=25e9,
)
HIST = [0.069, 0.044, 0.068, 0.101, 0.121, 0.104, 0.073, 0.058, 0.052, 0.050, 0.049, 0.048, 0.048, 0.043, 0.031,
        0.023, 0.019]
# Mixed sizes and localities; at 1-2 nodes of GPU_NODE some strategies strand and fall back.
MODEL = {"batch_size": 65536, "target_qps": 1_500_000, "dtype": "fp16", "tables": [
    {"name": "ids", "count": 6, "num_embeddings": 1_500_000_000, "embedding_dim": 128, "pooling_factor": 8,
     "zipf_alpha": 1.05},
    {"name": "hist", "count": 10, "num_embeddings": 300_000_000, "embedding_dim": 128, "pooling_factor": 20,
     "reuse_histogram": HIST},
    {"name": "drifting", "count": 4, "num_embeddings": 50_000_000, "embedding_dim": 64, "pooling_factor": 5,
     "reuse_histogram": HIST, "drift": 0.01},
    {"name": "seq", "count": 20, "num_embeddings": 20_000_000, "embedding_dim": 64, "pooling_factor": 30,
     "zipf_alpha": 1.2},
    {"name": "small", "count": 20, "num_embeddings": 100_000, "embedding_dim": 32, "pooling_factor": 2,
     "zipf_alpha": 0.8},
]}


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


def test_touched_skips_saturated_exp_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        rows = int(np.exp(rng.uniform(np.log(2), np.log(5e9))))
        ranks, weights = locality._rank_grid(rows)
        p = ranks ** -rng.uniform(0.0, 1.5)
        p /= float(weights @ p)
        q = -np.expm1(rng.uniform(1e3, 3e6) * np.log1p(-np.minimum(p, 1 - 1e-15)))
        log1mq = np.log1p(-np.minimum(q, 1 - 1e-15))
        plain = -np.expm1(np.outer(locality._T_GRID, log1mq))
        assert _bits(locality._touched(locality._T_GRID, log1mq)) == _bits(plain), rows


def test_libyaml_reads_the_model_suite_as_pyyaml_does() -> None:
    for path in sorted(MODEL_CONFIGS.glob("*.yaml")):
        text = path.read_text()
        assert yaml.load(text, Loader=_YAML_LOADER) == yaml.safe_load(text), path.name


def _same(a: Placement, b: Placement) -> None:
    assert a.tables == b.tables
    assert a.used_bytes == b.used_bytes and list(a.used_bytes) == list(b.used_bytes)
    assert a.costs == b.costs
    assert (a.predicted_step_s, a.predicted_qps) == (b.predicted_step_s, b.predicted_qps)


def _placer(spec, topo, ranks, tiers, strategy: Strategy, memo=None) -> Placer:
    """The search place() runs for ``strategy``, with a memo of its own unless given."""
    memo = memo or PlacementMemo(spec, topo)
    return Placer(memo, ranks, Limits.of(memo, ranks, tiers), strategy)


def _from_scratch(spec, topo, ranks, tiers):
    """place() as each strategy from step 1 with a memo of its own (no sharing)."""
    first = None
    for strategy in STRATEGIES:
        try:
            return _placer(spec, topo, ranks, tiers, strategy).run()
        except BusyTiersError as e:
            first = first or e
    raise first


@pytest.mark.parametrize("tiers", [None, [Tier.HBM, Tier.DRAM]])
def test_shared_memo_and_step_1_once_give_the_same_placements(tiers) -> None:
    spec = parse_model_spec(MODEL)
    memo = PlacementMemo(spec, GPU_NODE)
    fell_back = outcomes = 0
    for nodes in (1, 2, 3, 5, 8):
        ranks = nodes * GPU_NODE.ranks_per_node
        try:
            expected = _from_scratch(spec, GPU_NODE, ranks, tiers)
        except PlacementError as e:
            with pytest.raises(PlacementError) as got:
                place(spec, GPU_NODE, ranks, tiers, memo=memo)
            assert str(got.value) == str(e) and type(got.value) is type(e)
            continue
        outcomes += 1
        _same(place(spec, GPU_NODE, ranks, tiers, memo=memo), expected)
        _same(place(spec, GPU_NODE, ranks, tiers), expected)
        try:
            _placer(spec, GPU_NODE, ranks, tiers, STRATEGIES[0]).run()
        except BusyTiersError:
            fell_back += 1
    assert outcomes and (tiers or fell_back), "the model no longer exercises the fallback strategies"


def _outcome(run):
    try:
        return run()
    except PlacementError as e:
        return type(e), str(e)  # the message has each tier's capacity left: it tells states apart


@pytest.mark.parametrize("target_qps", [800_000, 2_000_000])
def test_strategies_run_from_the_step_1_snapshot_as_from_scratch(target_qps: int) -> None:
    """Every strategy, run from the step-1 state its start order left (after the strategies
    before it changed their own copies), ends as the same strategy run from scratch."""
    spec = parse_model_spec(dict(MODEL, target_qps=target_qps))
    memo = PlacementMemo(spec, GPU_NODE)
    started, busy = {}, 0
    for strategy in STRATEGIES:
        args = (spec, GPU_NODE, GPU_NODE.ranks_per_node, None, strategy)
        fresh = _outcome(lambda: _placer(*args).run())
        placer = _placer(*args, memo)
        reused = _outcome(lambda: placer.run(started.get(strategy.fastest_first)))
        started.setdefault(strategy.fastest_first, placer.started)
        if isinstance(fresh, tuple):
            busy += 1
            assert reused == fresh
        else:
            _same(reused, fresh)
    assert busy, "no strategy fails on this model: the snapshot is not put to the test"


def test_size_cluster_answers_as_placing_each_size_afresh() -> None:
    spec = parse_model_spec(MODEL)
    nodes, p = size_cluster(spec, GPU_NODE)
    _same(p, _from_scratch(spec, GPU_NODE, nodes * GPU_NODE.ranks_per_node, None))
    if nodes > 1:
        with pytest.raises(PlacementError):
            _from_scratch(spec, GPU_NODE, (nodes - 1) * GPU_NODE.ranks_per_node, None)


def test_memo_of_another_model_is_refused() -> None:
    spec, other = parse_model_spec(MODEL), parse_model_spec(MODEL)
    with pytest.raises(ValueError, match="PlacementMemo"):
        place(other, GPU_NODE, 8, memo=PlacementMemo(spec, GPU_NODE))
    with pytest.raises(ValueError, match="PlacementMemo"):
        place(spec, GPU_NODE, 8, policy="lfu", memo=PlacementMemo(spec, GPU_NODE))
