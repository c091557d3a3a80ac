"""Virtual tables in TieredEmbeddingBags: every id its own row, made on first lookup,
evicted by its policy (kernels/virtual_rows.py, csrc/kernel/id_index.h)."""

from __future__ import annotations

import pytest
import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.kernels.virtual_rows import EvictionSpec, VirtualTableFull, VirtualTableSpec

DIM = 8
INIT = (-0.1, 0.1)


def _kernel(tmp_path, name, rows, tier=Tier.DRAM, cache_rows=64, virtual=None, **kw):
    return TieredEmbeddingBags([(rows, DIM)], tier=tier, cache_rows=cache_rows, storage_dir=str(tmp_path),
                               table_names=[name], seed=7, init_range=INIT, learning_rate=0.05,
                               virtual_tables=None if virtual is None else [virtual], **kw)


def _step(emb, ids, bag=4, train=True):
    offsets = torch.arange(0, ids.numel() + 1, bag)
    out = emb(ids, offsets)
    if train:
        out.pow(2).sum().backward()
    return out


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SCM, Tier.SSD])
def test_dense_ids_train_exactly_as_a_dense_table(tmp_path, tier):
    """Ids 0..N-1 on a virtual table: the same outputs, weights and optimizer state as the
    dense table, step by step (a new id's row is the dense row's initial value)."""
    n = 500
    dense = _kernel(tmp_path, "dense", n, tier)
    virt = _kernel(tmp_path, "virt", n, tier, virtual=VirtualTableSpec(id_space=n))
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        ids = torch.randint(0, n, (64,), generator=g)
        assert torch.equal(_step(dense, ids), _step(virt, ids))
    probe = torch.randint(0, n, (200,), generator=g)
    w_dense, s_dense = dense.read_rows(0, 0, n)
    w_virt, s_virt = virt.read_ids(0, probe)
    assert torch.equal(w_virt, w_dense[probe])
    assert torch.equal(s_virt, s_dense[probe])
    dense.close()
    virt.close()


@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SSD])
def test_distinct_64_bit_ids_never_share_a_row(tmp_path, tier):
    """Distinct ids from [0, 2^62): each gets its own row, and a row moves only when its id
    is trained (ids trained apart from a probe set leave the probe set's rows unchanged)."""
    space = 2**62
    g = torch.Generator().manual_seed(3)
    ids = torch.unique(torch.randint(0, space, (40_000,), generator=g))
    ids = ids[torch.randperm(ids.numel(), generator=g)]
    probe, rest = ids[:256], ids[256:]
    virt = _kernel(tmp_path, "v64", 60_000, tier, cache_rows=2048, virtual=VirtualTableSpec(id_space=space))
    before, _ = virt.read_ids(0, probe)
    _step(virt, probe, bag=8)
    trained, _ = virt.read_ids(0, probe)
    assert bool((trained != before).any(dim=1).all()), "every probed id's row moved when it was trained"
    for lo in range(0, rest.numel(), 4096):
        _step(virt, rest[lo: lo + 4096], bag=8)
    after, _ = virt.read_ids(0, probe)
    assert torch.equal(after, trained), "training other ids moved a probed id's row"
    live_ids, rows = virt.virtual_ids(0)
    assert live_ids.numel() == ids.numel() == torch.unique(rows).numel()
    assert torch.equal(torch.sort(live_ids).values, torch.sort(ids).values)
    stats = virt.cache_stats()["v64"]
    assert stats["live_ids"] == ids.numel()
    assert stats["index_bytes_per_live_id"] <= 16.0
    virt.close()


def test_count_policy_bounds_live_ids_and_evicted_ids_come_back_fresh(tmp_path):
    hot = torch.arange(0, 64)
    ev = EvictionSpec(trigger_ids=400, count_threshold=3, decay_rate=0.9)
    virt = _kernel(tmp_path, "cnt", 600, virtual=VirtualTableSpec(id_space=2**40, eviction=ev))
    g = torch.Generator().manual_seed(5)
    cold_seen = []
    for step in range(40):
        cold = torch.randint(10**6, 2**40, (64,), generator=g)
        cold_seen.append(cold)
        _step(virt, torch.cat([hot, cold]))
        assert virt.cache_stats()["cnt"]["live_ids"] <= 400 + 128
    stats = virt.cache_stats()["cnt"]
    assert stats["eviction_passes"] >= 1 and stats["ids_evicted"] > 0
    live, _ = virt.virtual_ids(0)
    assert bool(torch.isin(hot, live).all()), "the hot ids (counted every step) were kept"
    gone = cold_seen[0][~torch.isin(cold_seen[0], live)]
    assert gone.numel() > 0
    weights, state = virt.read_ids(0, gone)
    fresh = _kernel(tmp_path, "ref", 600, virtual=VirtualTableSpec(id_space=2**40))
    w_ref, s_ref = fresh.read_ids(0, gone)
    assert torch.equal(weights, w_ref) and torch.equal(state, s_ref), "an evicted id reads as a new row"
    # Trained again, an evicted id starts from its initial value: exactly a new table's step.
    out = _step(virt, gone[:4], bag=4)
    assert torch.equal(out, _step(fresh, gone[:4], bag=4))
    virt.close()
    fresh.close()


def test_ttl_policy_evicts_ids_unused_for_longer(tmp_path):
    clock = FakeClock()
    ev = EvictionSpec(trigger_ids=100, ttl_seconds=60, clock=clock)
    virt = _kernel(tmp_path, "ttl", 300, virtual=VirtualTableSpec(id_space=10**9, eviction=ev))
    old = torch.arange(1000, 1080)
    _step(virt, old)
    clock.now += 61
    _step(virt, torch.arange(3000, 3008))  # the step after: the old ids' step is done
    _step(virt, torch.arange(5000, 5080))  # passes the trigger: the old ids are stale
    live, _ = virt.virtual_ids(0)
    assert not bool(torch.isin(old, live).any())
    assert bool(torch.isin(torch.arange(5000, 5080), live).all())
    virt.close()


def test_mixed_policy_needs_both_rules(tmp_path):
    clock = FakeClock()
    ev = EvictionSpec(trigger_ids=100, count_threshold=2, ttl_seconds=60, clock=clock)
    virt = _kernel(tmp_path, "mix", 400, virtual=VirtualTableSpec(id_space=10**9, eviction=ev))
    frequent, rare = torch.arange(0, 40), torch.arange(100, 140)
    for _ in range(3):
        _step(virt, frequent)
    _step(virt, rare)
    clock.now += 61
    _step(virt, torch.arange(3000, 3008))
    _step(virt, torch.arange(10_000, 10_080))
    live, _ = virt.virtual_ids(0)
    assert bool(torch.isin(frequent, live).all()), "stale but counted often: kept"
    assert not bool(torch.isin(rare, live).any()), "stale and rare: evicted"
    virt.close()


def test_full_table_without_eviction_is_refused_by_name(tmp_path):
    virt = _kernel(tmp_path, "full", 100, virtual=VirtualTableSpec(id_space=10**6))
    _step(virt, torch.arange(0, 96))
    with pytest.raises(VirtualTableFull, match="virtual table full.*100 rows"):
        _step(virt, torch.arange(1000, 1008))


def test_rows_made_in_eval_mode_survive_cache_churn(tmp_path):
    """An id first looked up in eval mode keeps its row (its initial value reaches the tier
    even though no training step dirtied it), after its previous owner was evicted."""
    clock = FakeClock()
    ev = EvictionSpec(trigger_ids=40, ttl_seconds=10, clock=clock)
    virt = _kernel(tmp_path, "eval", 100, cache_rows=32, virtual=VirtualTableSpec(id_space=10**6, eviction=ev))
    _step(virt, torch.arange(0, 40))  # trained rows, later evicted
    clock.now += 11
    _step(virt, torch.arange(300, 308))  # the step after (the trained ids' step is done)
    virt.eval()
    newcomers = torch.arange(500, 540)
    with torch.no_grad():
        _step(virt, newcomers, train=False)
        for k in range(4):  # churn the cache so the newcomers' slots are written back
            _step(virt, torch.arange(900 + 8 * k, 908 + 8 * k), train=False)
    virt.train()
    got, _ = virt.read_ids(0, newcomers)
    ref = _kernel(tmp_path, "eval_ref", 100, virtual=VirtualTableSpec(id_space=10**6))
    want, _ = ref.read_ids(0, newcomers)
    assert torch.equal(got, want)
    virt.close()
    ref.close()


def test_bad_virtual_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="id_space"):
        VirtualTableSpec(id_space=0)
    with pytest.raises(ValueError, match="decay_rate"):
        EvictionSpec(decay_rate=1.5)
    with pytest.raises(ValueError, match="virtual_tables"):
        _kernel(tmp_path, "bad", 10, virtual="x")
    virt = _kernel(tmp_path, "range", 10, virtual=VirtualTableSpec(id_space=100))
    with pytest.raises(IndexError, match="outside"):
        _step(virt, torch.tensor([0, 1, 2, 100]))
    dense = _kernel(tmp_path, "plain", 10)
    with pytest.raises(ValueError, match="not a virtual table"):
        dense.read_ids(0, torch.tensor([1]))
    # Row numbers mean nothing to a virtual table's users: the row-number readers refuse.
    for call in (lambda: virt.read_rows(0, 0, 5), lambda: virt.split_embedding_weights(),
                 lambda: virt.set_rows(0, torch.tensor([1]), torch.zeros(1, DIM))):
        with pytest.raises(ValueError, match="virtual table.*read_ids"):
            call()


@pytest.mark.slow
def test_ten_million_distinct_ids_each_their_own_row(tmp_path):
    """The target's test: 10M distinct ids drawn from [0, 2^62) trained once each; none
    shares a row, and a probe set's rows move only when the probes are trained."""
    space, n, batch = 2**62, 10_000_000, 1 << 17
    g = torch.Generator().manual_seed(11)
    ids = torch.unique(torch.randint(0, space, (n + n // 1000,), generator=g))[:n]
    ids = ids[torch.randperm(ids.numel(), generator=g)]
    assert ids.numel() == n
    probe, rest = ids[:1024], ids[1024:]
    virt = TieredEmbeddingBags([(n, 4)], tier=Tier.DRAM, cache_rows=1 << 18, table_names=["v10m"], seed=7,
                               init_range=INIT, learning_rate=0.05,
                               virtual_tables=[VirtualTableSpec(id_space=space)])
    offsets = torch.arange(0, batch + 1, 16)
    _step(virt, probe, bag=16)
    trained, _ = virt.read_ids(0, probe)
    for lo in range(0, rest.numel() - batch + 1, batch):
        virt(rest[lo: lo + batch], offsets).sum().backward()
    tail = rest[(rest.numel() // batch) * batch:]  # the last, partial batch: bags of 1
    _step(virt, tail, bag=1)
    after, _ = virt.read_ids(0, probe)
    assert torch.equal(after, trained), "training 10M other ids moved a probed id's row"
    live, rows = virt.virtual_ids(0)
    assert live.numel() == n and torch.unique(rows).numel() == n
    stats = virt.cache_stats()["v10m"]
    assert stats["index_bytes_per_live_id"] <= 16.0
    virt.close()


def test_a_pass_for_want_of_rows_keeps_the_steps_own_ids(tmp_path):
    """A step brings more new ids than free rows: the pass it runs first never evicts the
    ids of that very step that hold rows, however cold (they keep their trained rows)."""
    emb = _kernel(tmp_path, "v", 100, virtual=VirtualTableSpec(id_space=2**40,
                                                               eviction=EvictionSpec(count_threshold=5.0)))
    _step(emb, torch.arange(88))  # 88 ids, each looked up once: all below the threshold
    _step(emb, torch.arange(4))  # the step before is no longer live: its rows may go
    kept = torch.arange(4, 14)
    before = emb.read_ids(0, kept)[0]
    step = torch.cat([kept, torch.arange(1000, 1030)])  # 30 new ids, 12 free rows
    _step(emb, step, bag=5, train=False)
    after = emb.read_ids(0, kept)[0]
    assert torch.equal(after, before)
    live, _ = emb.virtual_ids(0)
    assert set(step.tolist()) <= set(live.tolist())
    emb.close()


def test_a_cached_id_is_found_without_an_id_index_lookup(tmp_path):
    """The cache is keyed by the ids: only the ids it misses go to the id index."""
    virt = _kernel(tmp_path, "hits", 500, virtual=VirtualTableSpec(id_space=2**40))
    ids = torch.tensor([2**39, 5, 2**39, 77] * 4)
    _step(virt, ids)
    s = virt.cache_stats()["hits"]
    assert (s["id_lookups"], s["ids_found_in_cache"]) == (16, 0)
    _step(virt, ids)
    s = virt.cache_stats()["hits"]
    assert (s["id_lookups"], s["ids_found_in_cache"]) == (16, 16), "a cached id was looked up again"
    assert s["live_ids"] == 3
    virt.close()
