"""Useful rows per SSD read: what the block store's layout of written-back rows, and taking
a read block's other rows into the cache, would save, replayed on step traces.

The SSD tier reads whole blocks (4 KiB, ``rows_per_block`` rows) and appends evicted dirty
rows to its log in the order the step's write-back hands them over, so a block read for one
miss carries rows that were evicted beside it. The replay models that path around an exact
LRU row cache of ``capacity`` rows:

- each step's distinct ids are looked up; a miss of a row the log holds reads its block
  (the step's misses in one block: one read); a row never written is made, not read;
- every row a step touches is dirty (training updates it); evicting a dirty row appends it
  to the log, a clean one (taken from a block and never touched) is dropped;
- ``layout``: how a step's write-backs are ordered into blocks: ``eviction`` (the cache's
  order, as the kernel writes them today) or ``hotness`` (most accessed first, the
  frequency sketch's class at its most exact: hot rows share blocks);
- ``coload``: a block read also takes its other rows still current there into the cache,
  each in place of the coldest row when it has been accessed more often (the admission
  contest the TinyLFU policy runs), as clean rows: ``cold`` as the next victim unless hit
  (a free or cold slot), ``warm`` as the most recent row (kept as long as a row just used);
  ``window``: only the rows one of the next ``lookahead`` steps uses (the look-ahead
  window's announced ids), as the most recent rows, whatever their counts.

Useful rows per read = (rows a step missed and found in the blocks it read + rows taken
with a block and hit before they were evicted) / blocks read. Python, so for traces of up
to some millions of accesses.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["COLOADS", "LAYOUTS", "LayoutResult", "replay_layout"]

LAYOUTS = ("eviction", "hotness")
COLOADS = ("", "cold", "warm", "window")


@dataclass(frozen=True)
class LayoutResult:
    """Counts over the counted steps."""

    steps: int
    accesses: int  # distinct rows per step, summed
    hits: int
    blocks_read: int
    missed_rows_read: int  # misses found in the log (each in a block read)
    first_touches: int  # misses of rows never written: no read
    coloaded: int  # rows taken with a block
    coloaded_hit: int  # of those, hit before eviction

    @property
    def reads_per_step(self) -> float:
        return self.blocks_read / self.steps if self.steps else float("nan")

    @property
    def useful_rows_per_read(self) -> float:
        if not self.blocks_read:
            return float("nan")
        return (self.missed_rows_read + self.coloaded_hit) / self.blocks_read

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else float("nan")


def replay_layout(steps: Sequence[np.ndarray], capacity: int, rows_per_block: int, layout: str = "eviction",
                  coload: str = "", warmup: int = 0, lookahead: int = 16) -> LayoutResult:
    """Replays ``steps`` (each step's ids) as the module says; counts from step ``warmup``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")
    if coload not in COLOADS:
        raise ValueError(f"coload={coload!r} must be one of {COLOADS}")
    if capacity < 1 or rows_per_block < 1:
        raise ValueError(f"capacity ({capacity}) and rows_per_block ({rows_per_block}) must be >= 1")
    cache: OrderedDict[int, bool] = OrderedDict()  # row -> dirty; least recent first
    where: dict[int, int] = {}  # row -> its current block in the log
    blocks: list[list[int]] = []  # block -> the rows written to it
    count: dict[int, int] = {}  # accesses so far
    taken: dict[int, bool] = {}  # rows taken with a block, not yet hit or evicted -> taken in a counted step
    open_block: list[int] = []
    uses: dict[int, list[int]] = {}  # row -> the steps that use it, ascending (for ``window``)
    if coload == "window":
        for step, ids in enumerate(steps):
            for r in np.unique(ids).tolist():
                uses.setdefault(r, []).append(step)

    def in_window(row: int, step: int) -> bool:
        later = uses.get(row, ())
        i = bisect_right(later, step)
        return i < len(later) and later[i] <= step + lookahead
    c = dict(steps=0, accesses=0, hits=0, blocks_read=0, missed_rows_read=0, first_touches=0, coloaded=0,
             coloaded_hit=0)

    def append(rows: list[int]) -> None:
        nonlocal open_block
        if layout == "hotness":
            rows = sorted(rows, key=lambda r: -count.get(r, 0))
        for r in rows:
            if not open_block:
                blocks.append(open_block)
            open_block.append(r)
            where[r] = len(blocks) - 1
            if len(open_block) == rows_per_block:
                open_block = []

    def evict(n: int, out: list[int]) -> None:
        for _ in range(n):
            row, dirty = cache.popitem(last=False)
            taken.pop(row, None)
            if dirty:
                out.append(row)

    for step, ids in enumerate(steps):
        counting = step >= warmup
        uniq = np.unique(ids).tolist()
        missed_blocks: dict[int, list[int]] = {}
        misses = []
        for r in uniq:
            count[r] = count.get(r, 0) + 1
            if r in cache:
                cache.move_to_end(r)
                cache[r] = True
                if r in taken:
                    c["coloaded_hit"] += taken.pop(r)  # a row taken before the counted steps is not counted
                c["hits"] += counting
                continue
            misses.append(r)
            b = where.get(r)
            if b is None:
                c["first_touches"] += counting
            else:
                missed_blocks.setdefault(b, []).append(r)
                c["missed_rows_read"] += counting
        c["accesses"] += counting * len(uniq)
        c["blocks_read"] += counting * len(missed_blocks)
        c["steps"] += counting
        written: list[int] = []
        for r in misses:
            cache[r] = True
        evict(max(0, len(cache) - capacity), written)
        if coload:
            step_rows = set(misses)
            for b, rows in missed_blocks.items():
                for r in blocks[b]:
                    if r in step_rows or r in cache or where.get(r) != b:
                        continue
                    if coload == "window":
                        if not in_window(r, step):
                            continue
                    elif len(cache) >= capacity and count.get(r, 0) <= count.get(next(iter(cache)), 0):
                        continue  # no more accessed than the coldest row
                    if len(cache) >= capacity:
                        evict(1, written)
                    cache[r] = False
                    if coload == "cold":
                        cache.move_to_end(r, last=False)
                    taken[r] = counting
                    c["coloaded"] += counting
        append(written)
    return LayoutResult(**c)
