"""The L2-norm eviction policy of virtual tables (FBGEMM's L2WeightBasedEvict): a pass
evicts the live ids, except those of live steps, whose row's weights have an L2 norm below
the threshold, reading the rows from the cache or the tier on the plan thread
(kernels/virtual_rows.py, kernels/row_weights.py); and TorchRec's
FeatureL2NormBasedEvictionPolicy mapped onto it (sharding/virtual_tables.py)."""

from __future__ import annotations

import math
import threading
import warnings

import pytest
import torch
from torchrec.modules.embedding_configs import (
    DataType,
    FeatureL2NormBasedEvictionPolicy,
    FeatureScoreBasedEvictionPolicy,
)

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.kernels.virtual_rows import EvictionSpec, VirtualTableSpec
from torchrec_mtrains.sharding.virtual_tables import eviction_spec_of, warn_ignored

DIM = 8
INIT = (-0.1, 0.1)  # an initial row's norm is at most 0.1 * sqrt(8) < 0.29
THRESHOLD = 0.4
SPACE = 2**40


def _kernel(tmp_path, name, rows, tier=Tier.DRAM, ev=None, cache_rows=128):
    spec = VirtualTableSpec(id_space=SPACE, eviction=EvictionSpec() if ev is None else ev)
    return TieredEmbeddingBags([(rows, DIM)], tier=tier, cache_rows=cache_rows, storage_dir=str(tmp_path),
                               table_names=[name], seed=7, init_range=INIT, learning_rate=0.05,
                               virtual_tables=[spec])


def _loss(out, grow):
    """Pushes every weight of the rows up (their norm grows) or towards 0."""
    return -out.sum() if grow else out.pow(2).sum()


def _offsets(ids):
    return torch.arange(ids.numel() + 1)  # one id a bag


def _train(emb, ids, grow=False):
    out = emb(ids, _offsets(ids))
    _loss(out, grow).backward()
    return out


def _norms(emb, ids):
    weights, _ = emb.read_ids(0, ids)
    return torch.linalg.vector_norm(weights.to(torch.float32), dim=1)


def _ids(g, n, taken=None):
    """n distinct ids of [0, SPACE) not in ``taken``."""
    ids = torch.unique(torch.randint(0, SPACE, (4 * n,), generator=g))
    if taken is not None:
        ids = ids[~torch.isin(ids, taken)]
    return ids[torch.randperm(ids.numel(), generator=g)[:n]]


def _spread_norms(emb, ids):
    """Groups of 16 ids trained 0..9 steps up: their norms spread from ~0.1 to ~0.8, in
    steps of 16 ids so that most rows leave the cache for the tier."""
    for lo in range(0, ids.numel(), 16):
        _train(emb, ids[lo: lo + 16])  # made, then shrunk a little
    for k in range(1, ids.numel() // 16):
        for lo in range(16 * k, ids.numel(), 16):
            _train(emb, ids[lo: lo + 16], grow=True)


@pytest.mark.parametrize("tier, pipelined", [(Tier.DRAM, False), (Tier.DRAM, True), (Tier.SSD, False),
                                             (Tier.SSD, True)])
def test_pass_evicts_exactly_the_ids_below_the_threshold(tmp_path, tier, pipelined):
    """The pass evicts exactly the candidates whose norm (read with read_ids before it) is
    below the threshold, never the ids of live steps (all below it), and leaves the kept
    rows as they were; evicted ids come back as new rows. Pipelined: the pass runs on the
    plan thread while the previous plan's move writes back candidate rows it evicted from
    the cache."""
    g = torch.Generator().manual_seed(11)
    ev = EvictionSpec(trigger_ids=230, l2_threshold=THRESHOLD)
    emb = _kernel(tmp_path, "l2", 600, tier, ev)
    cand = _ids(g, 160)
    _spread_norms(emb, cand)
    norms = _norms(emb, cand)
    before, state_before = emb.read_ids(0, cand)
    below = norms < THRESHOLD
    assert 16 <= int(below.sum()) <= 144, "the test's norms lie on both sides of the threshold"

    x, p, f = _ids(g, 8, cand), _ids(g, 48, cand), _ids(g, 32, cand)  # new ids: below the threshold
    assert emb.cache_stats()["l2"]["eviction_passes"] == 0
    if pipelined:
        # x computes; p and f are planned behind it: f's plan passes the trigger (its pass
        # protects x, p, f) while p's move may still write back candidate rows.
        out = emb(x, _offsets(x))
        emb.prefetch(p, _offsets(p))
        emb.prefetch(f, _offsets(f))
        _loss(out, False).backward()
        _train(emb, p)
        _train(emb, f)
        protected = torch.cat([x, p, f])
    else:
        _train(emb, p)
        _train(emb, f)  # passes the trigger; p's step is still live
        protected = torch.cat([p, f])

    live, _ = emb.virtual_ids(0)
    gone, kept = cand[below], cand[~below]
    assert not bool(torch.isin(gone, live).any()), "an id below the threshold was kept"
    assert bool(torch.isin(kept, live).all()), "an id at or above the threshold was evicted"
    assert bool(torch.isin(protected, live).all()), "an id of a live step was evicted"
    stats = emb.cache_stats()["l2"]
    assert stats["eviction_passes"] == 1 and stats["ids_evicted"] == gone.numel()
    assert stats["live_ids"] == kept.numel() + protected.numel()
    w_kept, s_kept = emb.read_ids(0, kept)
    assert torch.equal(w_kept, before[~below]) and torch.equal(s_kept, state_before[~below])

    ref = _kernel(tmp_path, "ref", 600)
    w_gone, s_gone = emb.read_ids(0, gone)
    w_ref, s_ref = ref.read_ids(0, gone)
    assert torch.equal(w_gone, w_ref) and torch.equal(s_gone, s_ref), "an evicted id reads as a new row"
    again = gone[:8]
    assert torch.equal(_train(emb, again), _train(ref, again)), "an evicted id trains as a new row"
    emb.close()
    ref.close()


def test_full_table_passes_by_norm_when_its_rows_run_out(tmp_path):
    """Without a trigger, a pass runs when a step's new ids do not fit: the small rows go
    and the step fits."""
    g = torch.Generator().manual_seed(12)
    emb = _kernel(tmp_path, "full", 170, ev=EvictionSpec(l2_threshold=THRESHOLD), cache_rows=64)
    cand = _ids(g, 160)
    _spread_norms(emb, cand)
    below = _norms(emb, cand) < THRESHOLD
    new = _ids(g, 16, cand)
    _train(emb, new)
    live, _ = emb.virtual_ids(0)
    assert bool(torch.isin(new, live).all()) and bool(torch.isin(cand[~below], live).all())
    assert not bool(torch.isin(cand[below], live).any())
    emb.close()


def test_zero_threshold_never_evicts(tmp_path):
    g = torch.Generator().manual_seed(13)
    ev = EvictionSpec(trigger_ids=20, l2_threshold=0.0)
    assert not ev.evicts
    emb = _kernel(tmp_path, "zero", 100, ev=ev)
    ids = _ids(g, 64)
    for lo in range(0, 64, 16):
        _train(emb, ids[lo: lo + 16])
    assert emb.cache_stats()["zero"]["live_ids"] == 64
    assert emb.cache_stats()["zero"]["eviction_passes"] == 0
    emb.close()


def test_bad_l2_specs_are_refused():
    with pytest.raises(ValueError, match="l2_threshold"):
        EvictionSpec(l2_threshold=-0.5)
    with pytest.raises(ValueError, match="l2_threshold"):
        EvictionSpec(l2_threshold=math.inf)
    with pytest.raises(ValueError, match="l2_threshold.*count_threshold"):
        EvictionSpec(l2_threshold=0.5, count_threshold=2)
    with pytest.raises(ValueError, match="l2_threshold.*ttl_seconds"):
        EvictionSpec(l2_threshold=0.5, ttl_seconds=60)


def test_torchrec_l2_policy_maps_to_the_spec():
    policy = FeatureL2NormBasedEvictionPolicy(training_id_eviction_trigger_count=1000, eviction_threshold=0.5)
    assert eviction_spec_of("t", policy) == EvictionSpec(trigger_ids=1000, l2_threshold=0.5)
    assert eviction_spec_of("t", FeatureL2NormBasedEvictionPolicy()) == EvictionSpec()  # 0: no eviction
    # The metadata-header fields TorchRec sets: nothing to warn about.
    policy.init_metaheader_config(DataType.FP32, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notes: dict = {}
        eviction_spec_of("t", policy, notes)
        warn_ignored(notes)
    notes = {}
    for table in ("a", "b"):
        eviction_spec_of(table, FeatureL2NormBasedEvictionPolicy(eviction_threshold=0.5,
                                                                 inference_eviction_threshold=0.2), notes)
    with pytest.warns(UserWarning) as record:
        warn_ignored(notes)
    messages = [str(w.message) for w in record]
    assert len(messages) == 1
    assert "FeatureL2NormBasedEvictionPolicy.inference_eviction_threshold" in messages[0] and "a, b" in messages[0]


@pytest.mark.parametrize("fields, name", [
    ({"eviction_threshold": -0.1}, "eviction_threshold"),
    ({"eviction_threshold": math.nan}, "eviction_threshold"),
    ({"eviction_threshold": "0.5"}, "eviction_threshold"),
    ({"training_id_eviction_trigger_count": -1}, "training_id_eviction_trigger_count"),
    ({"training_id_eviction_trigger_count": 2.5}, "training_id_eviction_trigger_count"),
])
def test_bad_l2_policy_values_are_refused_by_field(fields, name):
    policy = FeatureL2NormBasedEvictionPolicy(**{"eviction_threshold": 0.5, **fields})
    with pytest.raises(ValueError, match=f"table t: FeatureL2NormBasedEvictionPolicy: {name}="):
        eviction_spec_of("t", policy)


def test_feature_score_policy_is_still_refused():
    with pytest.raises(ValueError, match="FeatureScoreBasedEvictionPolicy.*feature-score"):
        eviction_spec_of("t", FeatureScoreBasedEvictionPolicy())
