"""torch.classes.mtrains.KernelCacheIndex (csrc/cache/kernel_cache_index.h): the binding's
checks, and the dense row-to-slot map seen from Python -- plans equal with it and without,
ids past a table's rows planned by the set scan rather than written past the map (CPU only).

The C++ drivers (csrc/tests/test_kernel_cache_index.cc, test_set_associative_cache.cc) hold
the map to the same plans under every policy, overflow slots, Forget and threads.
"""

from __future__ import annotations

import pytest
import torch

from torchrec_mtrains._ops import load_extension

load_extension()
Index = torch.classes.mtrains.KernelCacheIndex


def _plans(index: torch.ScriptObject, batches, rows: int) -> list:
    """What ``plan_step`` returns for each batch (its timings left out), with a forget after
    every third step."""
    out = []
    for step, ids in enumerate(batches):
        got = index.plan_step(ids, [0, ids.numel()], step, step - 1, True)
        out.append([got[0], got[1]] + [list(t) for t in got[2:6]])
        if step % 3 == 2:
            out.append(index.forget(0, ids[:5] % rows))
    return out


def _same(a: list, b: list) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("policy", ["lru", "lfu", "tinylfu"])
def test_plans_with_and_without_the_map_are_equal(policy: str) -> None:
    rows, gen = 3000, torch.Generator().manual_seed(4)
    batches = [torch.randint(0, rows, (int(torch.randint(1, 400, (1,), generator=gen)),), generator=gen)
               for _ in range(60)]
    plain, mapped = (Index([100], [rows], [dense], 8, policy) for dense in (False, True))
    assert list(plain.dense_maps()) == [False] and list(mapped.dense_maps()) == [True]
    assert _same(_plans(plain, batches, rows), _plans(mapped, batches, rows))
    assert dict(plain.counters(0)) == dict(mapped.counters(0))
    assert dict(mapped.counters(0))["evictions"] > 0


def test_ids_past_the_rows_are_planned_by_the_scan() -> None:
    """The kernel checks ids against its tables before planning; the index must still not
    write past its map when one comes: it plans it as the index without a map does."""
    batches = [torch.tensor([1, 50, 10_000, 7, 10_000, 2**40]), torch.tensor([50, 10_000, 2**40, 3])]
    plain, mapped = Index([16], [64], [False], 4, "lru"), Index([16], [64], [True], 4, "lru")
    assert _same(_plans(plain, batches, 64), _plans(mapped, batches, 64))
    assert dict(mapped.counters(0))["hits"] == 3  # step 1 finds 50, 10_000 and 2**40


@pytest.mark.parametrize("args, match", [
    (([8, 8], [100], [True, True], 4, "lru"), r"slots \(2\), rows \(1\) and dense_map \(2\) must have one entry per"),
    (([8], [0], [False], 4, "lru"), "rows of table 0 = 0 must be >= 1"),
    (([2**32 - 1], [100], [True], 4, "lru"), r"table 0: a dense row-to-slot map holds 32-bit slots"),
    (([8], [100], [True], 0, "lru"), r"ways=0 must be in \[1, 1024\]"),
])
def test_bad_constructor_arguments_are_named(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Index(*args)
