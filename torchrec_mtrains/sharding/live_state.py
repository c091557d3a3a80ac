"""LiveStateShards: in-place writes into a tiered kernel's ``state_dict()`` tensors reach its tables.

A FUSED table's ``state_dict()`` tensors alias its weights, so ``copy_``, ``fill_``, a slice's
``copy_`` or torch.distributed.checkpoint's in-place ``load`` change the table. A tiered
table's rows live on a tier: its ``state_dict()`` (and its fused optimizer's state) holds
copies staged from the tier, which may be larger than RAM (a memory-mapped file). Each copy
handed out is tracked here by a ``detach()`` of it: that shares the copy's version counter,
which every in-place torch op on the copy or on any view of it bumps, yet does not keep the
caller's tensor alive. Before the kernel next touches its rows (``apply``), each copy whose
counter moved is written back to its shard whole.

A copy is exact until its shard next changes (a training step, or a load from another
source): written after that, writing it back whole would put back the rows trained since, so
``apply`` raises ``ValueError`` naming the table instead of dropping or misapplying the
write. Writes that bypass torch's version counter (through ``.data``, numpy or raw memory)
are not seen. A copy the caller no longer holds and never wrote is forgotten (its memory
freed) at the kernel's next call.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Callable, Deque, Dict, List, Optional

import torch

__all__ = ["LiveStateShards"]

# Writes a whole part ("weight" or "state") of kernel table t from a tensor of its shape.
WriteShard = Callable[[int, str, torch.Tensor], None]


@dataclasses.dataclass
class _Copy:
    table: int  # the kernel's table index
    part: str  # "weight" or "state"
    alias: torch.Tensor  # shares the copy's storage and version counter
    version: int  # the counter when the copy last matched its shard
    owner: weakref.ref  # the tensor handed out
    stale: bool = False  # the shard changed since: a write can no longer be honoured


class LiveStateShards:
    """The staged copies of one kernel's shards handed out by ``state_dict()``.

    Args:
        write: writes a part of a kernel table back from a tensor (the kernel's ``load_shard``).
        table_names: each kernel table's name, for errors.
    """

    def __init__(self, write: WriteShard, table_names: List[str]) -> None:
        self._write = write
        self._names = table_names
        self._copies: Dict[int, _Copy] = {}
        self._next_key = 0
        # Keys of copies whose caller dropped them. A weakref callback only appends here
        # (atomic): it may run inside any allocation, on any thread, mid-iteration.
        self._gone: Deque[int] = collections.deque()

    def __len__(self) -> int:
        """Copies watched (those dropped unwritten are forgotten first)."""
        self._forget_dropped()
        return len(self._copies)

    def track(self, table: int, part: str, copy: torch.Tensor) -> None:
        """Watches ``copy`` (just staged from part ``part`` of kernel table ``table``, so equal
        to it) for in-place writes."""
        alias = copy.detach()
        key, self._next_key = self._next_key, self._next_key + 1
        gone = self._gone
        self._copies[key] = _Copy(table, part, alias, alias._version,
                                  owner=weakref.ref(copy, lambda _ref, key=key: gone.append(key)))

    def _forget_dropped(self) -> None:
        """Forgets the copies dropped by their callers that hold no write to apply."""
        while self._gone:
            key = self._gone.popleft()
            entry = self._copies.get(key)
            if entry is not None and entry.alias._version == entry.version:
                del self._copies[key]

    def shards_changed(self, table: Optional[int] = None, part: Optional[str] = None,
                       source: Optional[torch.Tensor] = None) -> None:
        """Kernel table ``table``'s part ``part`` (None: every table, every part) changed,
        except that copies over the memory of ``source`` (what was just written) still match."""
        for c in list(self._copies.values()):
            if (table is None or c.table == table) and (part is None or c.part == part) and not _same_memory(c.alias, source):
                c.stale = True

    def apply(self) -> None:
        """Writes every copy written since it last matched its shard back to the shard,
        and forgets the copies no caller holds.

        Raises:
            ValueError: a copy was written after its shard changed (naming the table);
                the copy is forgotten, so the error is raised once.
        """
        self._forget_dropped()
        for key, c in list(self._copies.items()):
            written = c.alias._version != c.version
            if written and c.stale:
                del self._copies[key]
                raise ValueError(
                    f"table {self._names[c.table]}: its {'weights' if c.part == 'weight' else 'optimizer state'} "
                    "were written in place through a state_dict() tensor taken before the table last changed "
                    "(a training step or a load since): writing that tensor back would undo those changes. "
                    "Take a fresh state_dict() and write into it before training on."
                )
            if written:
                self._write(c.table, c.part, c.alias)
                c.version = c.alias._version
                # The other copies of this part no longer match it.
                self.shards_changed(c.table, c.part, source=c.alias)
            if c.owner() is None:
                del self._copies[key]  # written back, and no caller can write it again


def _same_memory(a: torch.Tensor, b: Optional[torch.Tensor]) -> bool:
    return (b is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride() and a.dtype == b.dtype)
