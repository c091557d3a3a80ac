"""StorageAwarePlanner: a virtual table sized by its trace's distinct ids over the eviction
window (planner/virtual_tables.py), and ``stats.distinct_ids_in_windows`` against a
brute-force count."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import (
    CountBasedEvictionPolicy,
    CountTimestampMixedEvictionPolicy,
    NoEvictionPolicy,
    TimestampBasedEvictionPolicy,
)

import torchrec_mtrains.stats as stats
from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.planner.virtual_tables import virtual_live_ids
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder
from torchrec_mtrains.stats import TableTrace, distinct_ids_in_windows
from torchrec_mtrains.stats.dlrm_trace import check_dlrm_batch, write_dlrm_file

# The planner's trace: BATCH samples a step, one id each. Step s looks up block s % BLOCKS,
# BLOCK_IDS distinct ids each twice, so any W consecutive steps look up
# min(W, BLOCKS) * BLOCK_IDS distinct ids, and the whole trace BLOCKS * BLOCK_IDS.
BATCH, BLOCK_IDS, BLOCKS, STEPS = 128, 64, 100, 200
WHOLE = BLOCKS * BLOCK_IDS  # 6,400
SPREAD = 1 << 27  # raw ids far apart (up to 2^39.6, inside 2^40): counted as they are


def _block_ids(steps: int = STEPS) -> np.ndarray:
    block = np.arange(steps) % BLOCKS
    ids = block[:, None] * BLOCK_IDS + np.tile(np.arange(BLOCK_IDS), 2)[None, :]  # [steps, BATCH]
    return ids.reshape(-1).astype(np.int64) * SPREAD + 7


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    ids = torch.from_numpy(_block_ids())
    lengths = torch.ones(1, ids.numel(), dtype=torch.int64)
    offsets = torch.arange(ids.numel() + 1, dtype=torch.int64)
    path = tmp_path_factory.mktemp("trace") / "virtual.pt"
    write_dlrm_file(path, check_dlrm_batch(ids, offsets, lengths))
    return str(path)


def _trace(ids: np.ndarray, step_sizes) -> TableTrace:
    offsets = np.zeros(len(step_sizes) + 1, dtype=np.int64)
    np.cumsum(step_sizes, out=offsets[1:])
    return TableTrace(np.asarray(ids, dtype=np.int64), offsets, np.ones(len(step_sizes), dtype=np.int64))


def _brute_force(trace: TableTrace, window: int) -> int:
    off = trace.step_offsets
    starts = range(max(1, trace.num_steps - window + 1))
    return max(np.unique(trace.ids[off[a]:off[min(a + window, trace.num_steps)]]).size for a in starts)


# ------------------------------------------------------------ distinct ids in windows ----
@pytest.mark.parametrize("seed", range(6))
def test_distinct_ids_in_windows_match_a_brute_force_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 12, size=60)  # empty steps too
    pool = rng.integers(0, 2**62, size=int(rng.integers(5, 80)))  # raw ids, any int64
    trace = _trace(rng.choice(pool, size=int(sizes.sum())), sizes)
    for window in (1, 2, 3, 7, 20, 59, 60, 61, 1000):
        assert distinct_ids_in_windows(trace, window) == _brute_force(trace, window), window


def test_distinct_ids_in_windows_of_known_blocks() -> None:
    ids = _block_ids()
    trace = _trace(ids, [BATCH] * STEPS)
    for window in (1, 2, 4, 37, BLOCKS, BLOCKS + 1, STEPS - 1):
        assert distinct_ids_in_windows(trace, window) == min(window, BLOCKS) * BLOCK_IDS
    assert distinct_ids_in_windows(trace, STEPS) == distinct_ids_in_windows(trace, 10**9) == WHOLE
    # An id repeated within a step is one id; one coming back after W steps is counted again.
    assert distinct_ids_in_windows(_trace([5, 5, 5, 6, 5, 9], [3, 1, 1, 1]), 2) == 2
    assert distinct_ids_in_windows(_trace([1, 2, 3, 1], [1, 1, 1, 1]), 3) == 3
    assert distinct_ids_in_windows(_trace([], [0, 0]), 1) == 0


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_distinct_ids_in_windows_refuses_a_bad_window(window: Any) -> None:
    with pytest.raises(ValueError, match="window_steps"):
        distinct_ids_in_windows(_trace([1], [1]), window)


# ------------------------------------------------------------------- virtual_live_ids ----
def _config(policy: Any, num_embeddings: int = 2**40, name: str = "v") -> EmbeddingBagConfig:
    return EmbeddingBagConfig(name=name, num_embeddings=num_embeddings, embedding_dim=8, feature_names=["f" + name],
                              use_virtual_table=True, total_num_buckets=4, virtual_table_eviction_policy=policy)


def _ttl(trigger: int = 0) -> TimestampBasedEvictionPolicy:
    return TimestampBasedEvictionPolicy(training_id_eviction_trigger_count=trigger, eviction_ttl_mins=1)


# One TTL minute at 1/16 step a second: floor(3.75) + 1 = 4 steps.
@pytest.mark.parametrize("policy, rate, world, expected", [
    (_ttl(), 1 / 16, 1, 4 * BLOCK_IDS),
    (_ttl(trigger=100), 1 / 16, 1, 4 * BLOCK_IDS),  # the TTL's ids survive a pass: no cap
    (CountTimestampMixedEvictionPolicy(eviction_ttl_mins=1), 1 / 16, 2, 4 * BLOCK_IDS),
    (_ttl(), 0.5, 1, 31 * BLOCK_IDS),  # 30 steps + 1
    (_ttl(), None, 1, WHOLE),  # no rate: the whole trace
    (_ttl(trigger=100), None, 1, 100 + 4096),  # ... capped by the trigger's room
    (_ttl(trigger=100), None, 2, WHOLE),  # two ranks' room is 8,392
    (TimestampBasedEvictionPolicy(eviction_ttl_mins=0), 1 / 16, 1, WHOLE),  # TTL 0: time does not decide
    (CountBasedEvictionPolicy(training_id_eviction_trigger_count=100), 1 / 16, 1, 100 + 4096),
    (CountBasedEvictionPolicy(training_id_eviction_trigger_count=10_000), 1 / 16, 1, WHOLE),
    (NoEvictionPolicy(), 1 / 16, 1, WHOLE),
    (None, None, 4, WHOLE),
])
def test_live_ids_from_a_trace(policy: Any, rate: Optional[float], world: int, expected: int) -> None:
    trace = _trace(_block_ids(), [BATCH] * STEPS)
    assert virtual_live_ids(_config(policy), None, world, trace, rate) == expected


def test_live_ids_from_a_trace_at_most_the_tables_ids_and_given_ones_first() -> None:
    trace = _trace(_block_ids(), [BATCH] * STEPS)  # ids far beyond 4,096: not folded into it
    assert virtual_live_ids(_config(None, num_embeddings=4096), None, 1, trace) == 4096
    assert virtual_live_ids(_config(None, num_embeddings=8192), None, 1, trace) == WHOLE
    assert virtual_live_ids(_config(_ttl()), 777, 1, trace, 1 / 16) == 777
    with pytest.raises(ValueError, match="steps_per_second"):
        virtual_live_ids(_config(_ttl()), None, 1, trace, -1.0)


# --------------------------------------------------------------------- the planner ----
def _ebc(policy: Any) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(device=torch.device("meta"), tables=[
        _config(policy),
        EmbeddingBagConfig(name="p", num_embeddings=1000, embedding_dim=8, feature_names=["fp"]),
    ])


def _planner(trace_file: str, world: int, target_qps: Optional[float],
             locality: Optional[Dict[str, Any]] = None) -> StorageAwarePlanner:
    constraints = {"v": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["dram_virtual_table"],
                                             use_virtual_table=True)}
    return StorageAwarePlanner(CPU_NODE, batch_size=BATCH, world_size=world, target_qps=target_qps,
                               locality={"v": locality or {"trace": trace_file}}, constraints=constraints)


@pytest.mark.parametrize("policy, target_qps, world, expected", [
    (_ttl(), BATCH / 16, 2, 4 * BLOCK_IDS),  # 1/16 step a second: a 4-step window
    (_ttl(), None, 2, WHOLE),
    (CountBasedEvictionPolicy(training_id_eviction_trigger_count=100), None, 1, 100 + 4096),
])
def test_planner_sizes_a_virtual_table_by_its_trace(trace_file: str, policy: Any, target_qps: Optional[float],
                                                    world: int, expected: int, monkeypatch) -> None:
    reads = []
    load = stats.load_dlrm_trace
    monkeypatch.setattr(stats, "load_dlrm_trace", lambda *a, **k: reads.append(a) or load(*a, **k))
    planner = _planner(trace_file, world, target_qps)
    spec = planner.model_spec(_ebc(policy))
    assert len(reads) == 1  # read once: for the size and the locality curve
    (v,) = [t for t in spec.tables if t.name == "v"]
    assert (v.virtual, v.num_embeddings) == (True, expected)
    # The curve is the trace's: each step looks up BLOCK_IDS distinct ids, 1 per sample.
    assert v.locality.unique_rows_per_step == BLOCK_IDS and v.pooling_factor == 1.0
    entry = planner.plan(_ebc(policy), [TieredEmbeddingBagCollectionSharder()]).plan[""]["v"]
    assert (entry.sharding_type, entry.tiered.tier) == ("row_wise", Tier.DRAM)  # dram_virtual_table's tier
    assert entry.tiered.virtual_rows == expected


def test_planner_takes_given_live_ids_over_the_trace(trace_file: str) -> None:
    planner = _planner(trace_file, 2, None, {"trace": trace_file, "trace_table": 0, "live_ids": 3000})
    entry = planner.plan(_ebc(_ttl()), [TieredEmbeddingBagCollectionSharder()]).plan[""]["v"]
    assert entry.tiered.virtual_rows == 3000


def test_planner_names_a_bad_trace_table(trace_file: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"locality\['v'\].trace_table=3 is outside the 1 tables"):
        _planner(trace_file, 1, None, {"trace": trace_file, "trace_table": 3}).model_spec(_ebc(_ttl()))
    with pytest.raises(ValueError, match=r"locality\['v'\].trace: cannot read"):
        _planner(trace_file, 1, None, {"trace": str(tmp_path / "missing.pt")}).model_spec(_ebc(_ttl()))
