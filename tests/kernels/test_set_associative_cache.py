"""torch.classes.mtrains.SetAssociativeCache (csrc/cache) against a Python model of its
contract (CPU only).

The model replays each plan index by index: a resident row keeps its slot; a row not
resident is loaded (and only then) into a slot below capacity() whose previous row was not
locked by a live step (locked by a step >= oldest_live_step) and is written back first iff
it was dirty. Rows of a step get one slot each, distinct rows distinct slots. take_dirty()
returns every dirty row and cleans those not locked by a live step; occupied() is the model's
map; the counters count what the model saw. Then LRU and LFU replacement in a one-set cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Set

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchrec_mtrains._ops import load_extension

load_extension()
Cache = torch.classes.mtrains.SetAssociativeCache


def _plan(cache, ids: List[int], step: int, oldest: int, train: bool = True):
    out = cache.plan(torch.tensor(ids, dtype=torch.int64), step, oldest, train)
    return tuple(t.tolist() for t in out)


@dataclass
class Model:
    """What the cache must look like from outside."""

    num_slots: int
    slot_row: Dict[int, int] = field(default_factory=dict)
    lock: Dict[int, int] = field(default_factory=dict)  # slot -> last step that locked it
    dirty: Set[int] = field(default_factory=set)
    counters: Dict[str, int] = field(default_factory=lambda: dict(
        lookups=0, unique_rows=0, hits=0, misses=0, evictions=0, overflow_assignments=0))
    capacity: int = 0

    def row_slot(self) -> Dict[int, int]:
        return {r: s for s, r in self.slot_row.items()}

    def check_plan(self, ids: List[int], step: int, oldest: int, train: bool, result, capacity: int) -> None:
        slots, load_rows, load_slots, evict_rows, evict_slots = result
        where = f"step {step} (oldest_live {oldest}, train {train}) ids {ids}"
        assert len(slots) == len(ids), where
        assert len(load_rows) == len(load_slots) and len(evict_rows) == len(evict_slots), where
        assert capacity >= max(self.capacity, self.num_slots), f"{where}: capacity shrank to {capacity}"
        assert all(0 <= s < capacity for s in slots), f"{where}: slots {slots} vs capacity {capacity}"
        row_slot = self.row_slot()
        k = e = 0
        for i, row in enumerate(ids):
            s = slots[i]
            if row in row_slot:  # resident: a hit, same slot, nothing loaded
                assert s == row_slot[row], f"{where}: resident row {row} moved from slot {row_slot[row]} to {s}"
                if self.lock.get(s) != step:
                    self.counters["unique_rows"] += 1
                    self.counters["hits"] += 1
            else:  # not resident: loaded into slot s, displacing its unlocked row
                assert k < len(load_rows) and (load_rows[k], load_slots[k]) == (row, s), (
                    f"{where}: row {row} (index {i}) is not resident, expected load #{k} = ({row}, {s}), "
                    f"got loads {list(zip(load_rows, load_slots))}")
                k += 1
                self.counters["unique_rows"] += 1
                self.counters["misses"] += 1
                old = self.slot_row.get(s)
                if old is not None:
                    assert self.lock[s] < oldest, (
                        f"{where}: row {old} evicted from slot {s} while locked by live step {self.lock[s]}")
                    self.counters["evictions"] += 1
                    if s in self.dirty:
                        assert e < len(evict_rows) and (evict_rows[e], evict_slots[e]) == (old, s), (
                            f"{where}: dirty row {old} evicted from slot {s}, expected write-back #{e}, "
                            f"got {list(zip(evict_rows, evict_slots))}")
                        e += 1
                    del row_slot[old]
                self.slot_row[s] = row
                row_slot[row] = s
                self.dirty.discard(s)
            self.lock[s] = step
            if train:
                self.dirty.add(s)
        assert k == len(load_rows), f"{where}: loads {list(zip(load_rows, load_slots))[k:]} of resident rows"
        assert e == len(evict_rows), f"{where}: write-backs {list(zip(evict_rows, evict_slots))[e:]} not of dirty displaced rows"
        assert len(set(slots)) == len(set(ids)), f"{where}: distinct rows share slots {slots}"
        self.counters["lookups"] += len(ids)
        self.capacity = capacity

    def check_counters(self, got: Dict[str, int]) -> None:
        for k in ("lookups", "unique_rows", "hits", "misses", "evictions"):
            assert got[k] == self.counters[k], f"counter {k}: {got[k]} vs model {self.counters[k]}"
        assert got["hits"] + got["misses"] == got["unique_rows"]
        assert 0 <= got["overflow_assignments"] <= got["misses"]


@st.composite
def scenarios(draw):
    num_slots = draw(st.integers(1, 40))
    ways = draw(st.integers(1, 9))
    policy = draw(st.sampled_from(["lru", "lfu", "tinylfu"]))
    universe = draw(st.integers(1, 3 * num_slots + 8))
    ops = []
    step = oldest = 0
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["plan"] * 6 + ["take_dirty", "occupied"]))
        if kind == "plan":
            step += draw(st.integers(0, 2)) if ops else 0
            oldest = draw(st.integers(oldest, step))
            ids = draw(st.lists(st.integers(0, universe - 1), max_size=num_slots + 2 * ways + 4))
            ops.append(("plan", ids, step, oldest, draw(st.booleans())))
            step += 1
        elif kind == "take_dirty":
            ops.append(("take_dirty", draw(st.integers(max(0, step - 3), step + 1))))
        else:
            ops.append(("occupied",))
    return num_slots, ways, policy, ops


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_plans_keep_the_contract(scenario) -> None:
    num_slots, ways, policy, ops = scenario
    cache = Cache(num_slots, ways, policy)
    model = Model(num_slots)
    assert cache.capacity() == num_slots
    for op in ops:
        if op[0] == "plan":
            _, ids, step, oldest, train = op
            result = _plan(cache, ids, step, oldest, train)
            model.check_plan(ids, step, oldest, train, result, cache.capacity())
        elif op[0] == "take_dirty":
            live = op[1]
            rows, slots = (t.tolist() for t in cache.take_dirty(live))
            got = sorted(zip(slots, rows))
            want = sorted((s, model.slot_row[s]) for s in model.dirty if s in model.slot_row)
            assert got == want, f"take_dirty({live}): {got} vs model {want}"
            model.dirty = {s for s in model.dirty if model.lock.get(s, -1) >= live}
        rows, slots = (t.tolist() for t in cache.occupied())
        assert dict(zip(slots, rows)) == model.slot_row
        assert len(set(rows)) == len(rows), f"a row in two slots: {sorted(zip(slots, rows))}"
        model.check_counters(dict(cache.counters()))


# Replacement in a one-set cache ----------------------------------------------------------------
def _slot_of(cache, row: int) -> int:
    rows, slots = (t.tolist() for t in cache.occupied())
    return dict(zip(rows, slots)).get(row, -1)


def _resident(cache) -> Set[int]:
    return set(cache.occupied()[0].tolist())


def test_lru_evicts_the_least_recently_used_unlocked_way() -> None:
    cache = Cache(4, 4, "lru")  # one set of four ways
    for step, row in enumerate([10, 11, 12, 13]):
        _plan(cache, [row], step, step)
    assert _resident(cache) == {10, 11, 12, 13}
    _plan(cache, [10], 4, 4)  # 10 becomes the most recently used
    slot_11 = _slot_of(cache, 11)
    slots, loads, load_slots, evicts, evict_slots = _plan(cache, [14], 5, 5)
    assert _resident(cache) == {10, 12, 13, 14} and slots == [slot_11]
    assert (evicts, evict_slots) == ([11], [slot_11])  # trained rows are dirty
    _plan(cache, [15], 6, 6)
    assert _resident(cache) == {10, 13, 14, 15}  # 12 was next
    # Steps 5 and 6 still live (oldest 5): 14, 15 are locked; of 10 (step 4) and 13
    # (step 3), 13 is least recently used.
    _plan(cache, [16], 7, 5)
    assert _resident(cache) == {10, 14, 15, 16}
    # Within one step the order of use counts: of 16, 15, 14, 10 all touched in step 8,
    # 16 is least recently used.
    _plan(cache, [16, 15, 14, 10], 8, 8)
    _plan(cache, [17], 9, 9)
    assert _resident(cache) == {10, 14, 15, 17}


def test_lru_takes_an_overflow_slot_when_every_way_is_locked() -> None:
    cache = Cache(2, 2, "lru")
    slots, loads, load_slots, _, _ = _plan(cache, [1, 2, 3, 4, 5], 0, 0)
    assert sorted(slots) == sorted(set(slots)) and len(set(slots)) == 5
    assert cache.capacity() >= 5 and all(s < cache.capacity() for s in slots)
    assert dict(cache.counters())["overflow_assignments"] == 3
    # Step 0 still live: its five rows stay put, new rows overflow again.
    slots1, *_ = _plan(cache, [1, 6], 1, 0)
    assert slots1[0] == slots[0] and slots1[1] not in slots
    # Once step 0 and 1 are done, overflow slots are reused rather than grown.
    cap = cache.capacity()
    _plan(cache, [7, 8, 9], 2, 2)
    assert cache.capacity() == cap


def test_slots_past_the_last_full_set_form_the_overflow_pool() -> None:
    cache = Cache(10, 4, "lru")  # two sets of four ways + two overflow slots
    slots, *_ = _plan(cache, list(range(10)), 0, 0)
    assert len(set(slots)) == 10 and cache.capacity() >= 10
    assert dict(cache.counters())["misses"] == 10


@pytest.mark.parametrize("policy, keeps_hot_row", [("lfu", True), ("lru", False)])
def test_lfu_keeps_frequently_used_rows(policy: str, keeps_hot_row: bool) -> None:
    cache = Cache(4, 4, policy)
    _plan(cache, [0] * 8, 0, 0)  # row 0: eight accesses
    _plan(cache, [0] * 8, 1, 1)
    for step, row in enumerate(range(100, 140), start=2):  # a scan of rows used once
        _plan(cache, [row], step, step)
    assert (0 in _resident(cache)) is keeps_hot_row
    slots, loads, *_ = _plan(cache, [0], 50, 50)
    assert (loads == []) is keeps_hot_row


def test_lfu_keeps_a_hot_row_through_scans_that_flush_lru() -> None:
    """Row 1 every third step, between them two steps of three rows used once: the scans
    push row 1 out of a 4-way LRU set every time; LFU evicts the scan rows instead."""
    hot_misses = {}
    for policy in ("lfu", "lru"):
        cache = Cache(4, 4, policy)
        misses, fresh = 0, 1000
        for step in range(150):
            if step % 3 == 0:
                _, loads, *_ = _plan(cache, [1], step, step)
                misses += loads == [1]
            else:
                _plan(cache, [fresh, fresh + 1, fresh + 2], step, step)
                fresh += 3
        hot_misses[policy] = misses
    # LFU: row 1 ties with the scan rows until its second use, then is never evicted.
    assert hot_misses["lfu"] <= 2 and hot_misses["lru"] == 50, hot_misses


def test_eval_plans_load_clean_rows_and_keep_dirty_ones() -> None:
    cache = Cache(2, 2, "lru")
    _plan(cache, [1], 0, 0, train=True)   # dirty
    _plan(cache, [2], 1, 1, train=False)  # clean
    _plan(cache, [1], 2, 2, train=False)  # a hit in eval keeps it dirty
    _, _, _, evicts, _ = _plan(cache, [3, 4], 3, 3, train=False)
    assert evicts == [1]  # only the dirty row is written back
    rows, slots = cache.take_dirty(4)
    assert rows.tolist() == []


def test_take_dirty_keeps_rows_of_live_steps_dirty() -> None:
    cache = Cache(8, 4, "lru")
    _plan(cache, [1, 2], 0, 0)
    _plan(cache, [3], 1, 0)
    rows, slots = cache.take_dirty(1)
    assert sorted(rows.tolist()) == [1, 2, 3]
    rows, _ = cache.take_dirty(1)
    assert rows.tolist() == [3]  # locked by live step 1: still dirty
    rows, _ = cache.take_dirty(2)
    assert rows.tolist() == [3]
    assert cache.take_dirty(2)[0].tolist() == []


def test_tinylfu_keeps_frequent_rows_through_a_scan() -> None:
    """Rows 0..7 used six times each fill a one-set cache; in a scan of rows used once the
    first scan row evicts one frequent row (TinyLFU: the window's; LFU: the least recent
    of the tied ones), the later ones only each other; LRU loses every frequent row."""
    kept = {}
    for policy in ("tinylfu", "lfu", "lru"):
        cache = Cache(8, 8, policy)
        step = 0
        for _ in range(6):
            for row in range(8):
                _plan(cache, [row], step, step)
                step += 1
        for row in range(100, 140):
            _plan(cache, [row], step, step)
            step += 1
        kept[policy] = len(_resident(cache) & set(range(8)))
    assert kept == {"tinylfu": 7, "lfu": 7, "lru": 0}, kept


def test_constructor_names_every_policy() -> None:
    for policy in ("lru", "lfu", "tinylfu"):
        assert Cache(4, 4, policy).capacity() == 4
    with pytest.raises(ValueError, match="'fifo'.*'lru', 'lfu', 'tinylfu'"):
        Cache(4, 4, "fifo")


@pytest.mark.parametrize("args, match", [
    ((0, 4, "lru"), "num_slots"),
    ((4, 0, "lru"), "ways"),
    ((4, 1025, "lfu"), "ways"),
    ((4, 4, "fifo"), "lru"),
])
def test_constructor_rejects(args, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Cache(*args)


@pytest.mark.parametrize("indices", [
    torch.tensor([1, 2], dtype=torch.int32),
    torch.arange(8)[::2],
    torch.zeros(2, 2, dtype=torch.int64),
    torch.tensor([1.0, 2.0]),
], ids=["int32", "strided", "2d", "float"])
def test_plan_rejects_bad_indices(indices: torch.Tensor) -> None:
    cache = Cache(4, 4, "lru")
    with pytest.raises(ValueError, match="int64"):
        cache.plan(indices, 0, 0, True)
    assert dict(cache.counters())["lookups"] == 0


# Long plans ----------------------------------------------------------------------------------
def test_long_plans_with_repeated_rows_keep_the_contract() -> None:
    # Plans of thousands of indices (a set's lookups prefetched well ahead of them), rows
    # repeating far apart, about half of them missing.
    rng = np.random.default_rng(5)
    cache, model = Cache(2048, 32, "lru"), Model(2048)
    step = 0
    for _ in range(6):
        ids = rng.integers(0, 6000, size=3500).tolist()
        result = _plan(cache, ids, step, max(0, step - 1))
        model.check_plan(ids, step, max(0, step - 1), True, result, cache.capacity())
        step += 1
    rows, slots = (t.tolist() for t in cache.occupied())
    assert dict(zip(slots, rows)) == model.slot_row
    model.check_counters(dict(cache.counters()))
