"""RowWeights: the current weights of a table's rows, read on the plan thread for an
L2-norm eviction pass (``virtual_rows.py``).

A pass runs inside the plan of a step (``VirtualRows._norm_pass``), on the plan thread, while the consumer thread
computes and the move thread may be moving earlier steps' rows. Its candidates are rows of
live ids in no live step (the step in its backward and every step planned after it). Their
newest value is in their cache slot when the cache holds them, else on the tier, and that
is what is read here, safely:

- the tier: a move in flight writes back rows its plan evicted from the cache, candidates
  among them (their value still in a slot that the same move then fills with another row).
  So the reader first waits until no move is in flight (the step engine's ``wait_for_moves``);
  moves are queued by the plan thread only, so none starts while it reads. The other writers
  of the tier (``flush``, ``set_rows``, a checkpoint) drain the engine first, which waits
  for this plan;
- a cached candidate's slot: no move runs (above); the backward computing now updates only
  the slots of its own step's rows, which are protected, never candidates; and the TBE is
  rebuilt larger (``CacheSlots.grow``) or written by callers only after a drain. A candidate
  is never in an overflow slot past the TBE: those hold loads of steps not yet computed,
  which are live.
"""

from __future__ import annotations

from typing import Iterator

import torch

from torchrec_mtrains.kernels.row_cache import RowCache

__all__ = ["RowWeights"]

_BLOCK_ROWS = 1 << 16  # rows read at once: a pass holds one block of rows (64K x row bytes)


class RowWeights:
    """``read(t, rows)``: the ``VirtualRows`` weight reader of one kernel.

    Holds no reference to the kernel (its exit hook must let it be collected).

    Args:
        cache: the kernel's tables and cache.
        engine: its step engine (to wait for the moves in flight).
    """

    def __init__(self, cache: RowCache, engine: torch.ScriptObject) -> None:
        self._cache, self._engine = cache, engine

    def __call__(self, t: int, rows: torch.Tensor) -> Iterator[torch.Tensor]:
        """Table t's current weights of ``rows`` (rows of no live step), in blocks of at most
        ``_BLOCK_ROWS`` consecutive rows, ``[n, dim]`` in the weights' dtype. Reads the tier
        only for the rows the cache does not hold."""
        self._engine.wait_for_moves()
        cache = self._cache
        cached, slots = cache.cached(t)
        order = torch.argsort(cached)
        cached, slots = cached[order], slots[order]
        codec, store = cache.codecs[t], cache.stores[t]
        for lo in range(0, rows.numel(), _BLOCK_ROWS):
            block = rows[lo: lo + _BLOCK_ROWS]
            weights = torch.empty((block.numel(), codec.layout.dim), dtype=codec.dtype)
            hit = torch.zeros(block.numel(), dtype=torch.bool)
            if cached.numel():
                at = torch.searchsorted(cached, block).clamp_(max=cached.numel() - 1)
                hit = cached[at] == block
                if bool(hit.any()):
                    with torch.no_grad():
                        weights[hit] = cache.slots.weights[t][slots[at[hit]]]
            miss = ~hit
            if bool(miss.any()):
                with cache.naming(t):
                    weights[miss] = codec.split(store.read(block[miss]))[0]
            yield weights
