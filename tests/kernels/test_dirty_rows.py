"""DirtyRows (one bit per row) against a Python set, and the kernel marking the rows its
training steps look up."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.kernels.dirty_rows import DirtyRows


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(0, 3000),
    marks=st.lists(st.lists(st.integers(0, 2999), max_size=50), max_size=5),
    bounds=st.tuples(st.integers(0, 3000), st.integers(0, 3000)),
)
def test_marks_match_a_set(num_rows, marks, bounds) -> None:
    dirty, want = DirtyRows(num_rows), set()
    for ids in marks:
        ids = [i for i in ids if i < num_rows]
        dirty.mark(torch.tensor(ids, dtype=torch.int64))
        want |= set(ids)
    assert dirty.ids().tolist() == sorted(want) and dirty.count() == len(want)
    lo, hi = min(bounds), min(max(bounds), num_rows)
    lo = min(lo, hi)
    assert dirty.ids(lo, hi).tolist() == sorted(i for i in want if lo <= i < hi)
    assert dirty.count(lo, hi) == len([i for i in want if lo <= i < hi])
    assert dirty.nbytes == (num_rows + 7) // 8  # one bit per row
    dirty.clear()
    assert dirty.count() == 0


def test_a_range_outside_the_table_is_refused() -> None:
    import pytest

    with pytest.raises(IndexError, match=r"rows \[5, 11\) outside \[0, 10\)"):
        DirtyRows(10).ids(5, 11)


def test_large_tables_scan_in_blocks() -> None:
    dirty = DirtyRows(5_000_000)
    ids = torch.tensor([0, 7, 8, 1_048_575, 1_048_576, 4_999_999])
    dirty.mark(ids)
    assert dirty.ids().tolist() == ids.tolist()
    assert dirty.ids(8, 1_048_577).tolist() == [8, 1_048_575, 1_048_576]


def test_the_kernel_marks_the_rows_training_steps_look_up(tmp_path) -> None:
    emb = TieredEmbeddingBags([(1000, 8)], tier=Tier.SSD, cache_rows=64, storage_dir=str(tmp_path),
                              prefetch_pipeline=False)
    looked_up = set()
    for step in range(12):
        ids = torch.randint(0, 1000, (80,), generator=torch.Generator().manual_seed(step))
        looked_up |= set(ids.tolist())
        out = emb(ids, torch.arange(0, 81, 8))
        out.sum().backward()
    assert set(emb.dirty_rows(0).ids().tolist()) == looked_up  # every row a step trained
    emb.eval()
    emb(torch.tensor([998, 999]), torch.tensor([0, 2]))
    assert set(emb.dirty_rows(0).ids().tolist()) == looked_up - {998, 999} | (looked_up & {998, 999})  # eval: none
    emb.train()
    emb.clear_dirty()
    assert emb.dirty_rows(0).count() == 0
    emb.set_rows(0, torch.tensor([3, 999]), torch.zeros(2, 8))
    assert emb.dirty_rows(0).ids().tolist() == [3, 999]
    emb.close()


def test_looked_up_rows_of_a_fused_kernel_mark_row_zero_for_ids_outside_the_table() -> None:
    """FBGEMM's bounds check computes an out-of-range id on row 0: the FUSED tables' marks
    say so instead of raising inside TorchRec's forward."""
    a, b = DirtyRows(10), DirtyRows(20)
    indices = torch.tensor([3, 9, 12, -1, 5, 19, 20], dtype=torch.int64)
    # features 0 and 1 are table a's, feature 2 table b's
    torch.ops.mtrains.mark_looked_up_rows([a.bits, a.bits, b.bits], indices, [0, 2, 4, 7], [10, 10, 20])
    assert a.ids().tolist() == [0, 3, 9]  # 12 and -1 are outside its 10 rows
    assert b.ids().tolist() == [0, 5, 19]  # 20 is outside its 20 rows


def test_looked_up_rows_refuse_a_row_count_beyond_the_bitmap() -> None:
    import pytest

    with pytest.raises(ValueError, match=r"rows\[0\]=17 must be in \[1, the bitmap's 16 bits\]"):
        torch.ops.mtrains.mark_looked_up_rows([DirtyRows(10).bits], torch.zeros(1, dtype=torch.int64), [0, 1], [17])
