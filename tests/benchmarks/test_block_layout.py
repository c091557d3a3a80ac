"""The block-layout replay (benchmarks/lib/block_layout.py) on hand-made traces: a block read
serves the step's misses in it, taking its other rows saves the later reads, and the
hotness layout packs the most accessed rows together."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.lib.block_layout import replay_layout


def _steps(*steps):
    return [np.array(s, dtype=np.int64) for s in steps]


# Rows 1-3 accessed twice, row 0 once; then four new rows evict 0-3 (one block of 4, in
# eviction order); row 0 comes back, then rows 1-3.
TRACE = _steps([0, 1, 2, 3], [1, 2, 3], [4, 5, 6, 7], [0], [1, 2, 3])


def test_a_block_read_serves_the_steps_misses_in_it() -> None:
    r = replay_layout(TRACE, capacity=4, rows_per_block=4)
    assert r.first_touches == 8  # rows 0-7: made, not read
    assert r.blocks_read == 2 and r.missed_rows_read == 4  # row 0's block, then rows 1-3's (the same, one read)
    assert r.useful_rows_per_read == pytest.approx(2.0)
    assert r.coloaded == 0


def test_taking_a_blocks_other_rows_saves_their_reads() -> None:
    r = replay_layout(TRACE, capacity=4, rows_per_block=4, coload="warm")
    # Row 0's read takes rows 1-3 (accessed twice, more than the coldest rows 4-6, which it
    # evicts): the last step hits them, with no read.
    assert r.blocks_read == 1 and r.coloaded == 3 and r.coloaded_hit == 3
    assert r.useful_rows_per_read == pytest.approx(4.0)
    assert r.hits == 3 + 3


def test_rows_taken_cold_contest_each_other() -> None:
    # Taken as the next victim: row 1 takes the coldest slot and is then the coldest row,
    # which rows 2 and 3 (accessed as often) do not displace; they are read in the last step.
    r = replay_layout(TRACE, capacity=4, rows_per_block=4, coload="cold")
    assert r.coloaded == 1 and r.coloaded_hit == 1 and r.blocks_read == 2


def test_a_row_accessed_no_more_than_the_coldest_is_not_taken() -> None:
    once = _steps([0, 1, 2, 3], [4, 5, 6, 7], [0], [1, 2, 3])  # every row accessed once
    r = replay_layout(once, capacity=4, rows_per_block=4, coload="warm")
    assert r.coloaded == 0 and r.blocks_read == 2


def test_the_hotness_layout_packs_the_most_accessed_rows_together() -> None:
    # Rows 0-3 evicted in one step in that order: 1 and 3 accessed three times, 0 and 2
    # twice; blocks of 2.
    trace = _steps([0, 2], [1, 3], [1, 3], [0, 1, 2, 3], [4, 5, 6, 7], [1, 3])
    eviction = replay_layout(trace, capacity=4, rows_per_block=2)
    hotness = replay_layout(trace, capacity=4, rows_per_block=2, layout="hotness")
    assert eviction.blocks_read == 2  # blocks 0,1 | 2,3: rows 1 and 3 in two
    assert hotness.blocks_read == 1  # 1,3 | 0,2
    assert hotness.useful_rows_per_read == 2.0


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="layout='random'"):
        replay_layout(TRACE, 4, 4, layout="random")
    with pytest.raises(ValueError, match="coload='always'"):
        replay_layout(TRACE, 4, 4, coload="always")
    with pytest.raises(ValueError, match="capacity"):
        replay_layout(TRACE, 0, 4)


def test_the_window_takes_only_the_rows_its_steps_use() -> None:
    # Rows 1-3 accessed once each, as often as the coldest: only the window takes them, and
    # only those the next steps use (row 3 is not used again).
    trace = _steps([0, 1, 2, 3], [4, 5, 6, 7], [0], [1, 2])
    r = replay_layout(trace, capacity=4, rows_per_block=4, coload="window", lookahead=1)
    assert r.coloaded == 2 and r.coloaded_hit == 2 and r.blocks_read == 1
    short = replay_layout(_steps([0, 1, 2, 3], [4, 5, 6, 7], [0], [9], [1, 2]), capacity=4, rows_per_block=4,
                          coload="window", lookahead=1)
    assert short.coloaded == 0  # rows 1 and 2 come back two steps later: past a window of 1
