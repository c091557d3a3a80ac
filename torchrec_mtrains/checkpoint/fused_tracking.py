"""Which rows of TorchRec's own FUSED tables training changed since the last checkpoint.

A FUSED table is FBGEMM's TBE inside TorchRec's ``BatchedFusedEmbeddingBag``: whole in
memory, updated by its fused optimizer in the backward of each step, on the rows that
step looked up and no others. So, as for tiered tables, one bit per row of each local
shard (``DirtyRows``) says which rows a delta must hold. A forward pre-hook on each such
kernel marks the rows of every forward that can train (grad enabled), every table's in one
C++ call (``torch.ops.mtrains.mark_looked_up_rows``).

Tracking starts when a differential checkpointer first saves or restores the model:
a delta continues a chain only from a step this process saved or restored, so the
rows changed before do not matter. Each install gets a number (``track``): a chain
continues only while the kernels it was saved from are the ones still tracked.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, Iterator, List, Tuple

import torch
from torch import nn
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbeddingBag
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.checkpoint.tiered_parts import state_dict_prefix
from torchrec_mtrains.kernels.dirty_rows import DirtyRows

__all__ = ["FusedShardRows", "clear_fused_dirty", "fused_dirty", "track_fused_tables"]

_installs = itertools.count(1)


class _Tracking:
    """The bitmaps of one kernel's table shards and the hook that marks them."""

    def __init__(self, kernel: BatchedFusedEmbeddingBag) -> None:
        tables = kernel.config.embedding_tables
        self.install = next(_installs)
        self.dirty = [DirtyRows(int(t.local_rows)) for t in tables]
        feature_tables = list(kernel._feature_table_map)
        self._bitmaps = [self.dirty[t].bits for t in feature_tables]
        self._rows = [max(1, int(tables[t].local_rows)) for t in feature_tables]
        self._handle = kernel.register_forward_pre_hook(self._mark, with_kwargs=True)

    def _mark(self, kernel: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        if not torch.is_grad_enabled():  # no backward, so no update of any row
            return
        features = args[0] if args else kwargs["features"]
        lengths = features.length_per_key()
        if len(lengths) != len(self._bitmaps):
            raise ValueError(f"a FUSED embedding kernel got {len(lengths)} features, its tables take "
                             f"{len(self._bitmaps)}")
        bounds = list(itertools.accumulate(lengths, initial=0))
        values = features.values()
        if values.dtype != torch.int64:
            values = values.to(torch.int64)
        torch.ops.mtrains.mark_looked_up_rows(self._bitmaps, values.contiguous(), bounds, self._rows)


class FusedShardRows:
    """One FUSED table shard of this rank as tracking sees it."""

    def __init__(self, module: str, kernel: BatchedFusedEmbeddingBag, t: int) -> None:
        table = kernel.config.embedding_tables[t]
        row, col = table.local_metadata.shard_offsets if table.local_metadata is not None else (0, 0)
        self.module, self.table, self.row_offset, self.col_offset = module, table.name, int(row), int(col)
        self.tables_attr = "embedding_bags"  # tracked: TorchRec's FUSED bag kernels
        self.tracking: _Tracking = kernel._mtrains_tracking
        self.dirty = self.tracking.dirty[t]

    @property
    def key(self) -> str:
        """As ``PieceSpec.key``: "<module><table>/r<row offset>_c<col offset>"."""
        return f"{self.module}{self.table}/r{self.row_offset}_c{self.col_offset}"


def _fused_kernels(model: nn.Module) -> Iterator[Tuple[str, BatchedFusedEmbeddingBag]]:
    for fqn, collection in model.named_modules():
        if isinstance(collection, ShardedEmbeddingBagCollection):
            prefix = state_dict_prefix(f"{fqn}." if fqn else "")
            for lookup in collection._lookups:  # a plain list: not among the collection's modules
                for kernel in lookup.modules():
                    if isinstance(kernel, BatchedFusedEmbeddingBag):
                        yield prefix, kernel


def track_fused_tables(model: nn.Module) -> List[FusedShardRows]:
    """Starts tracking the FUSED tables of ``model`` (once per kernel); returns their shards."""
    out = []
    for prefix, kernel in _fused_kernels(model):
        if getattr(kernel, "_mtrains_tracking", None) is None:
            load_extension()
            kernel._mtrains_tracking = _Tracking(kernel)
        out += [FusedShardRows(prefix, kernel, t) for t in range(len(kernel.config.embedding_tables))]
    return out


def fused_dirty(model: nn.Module) -> Dict[str, FusedShardRows]:
    """The tracked FUSED table shards of ``model`` by key."""
    return {s.key: s for s in track_fused_tables(model)}


def clear_fused_dirty(model: nn.Module) -> None:
    """Forgets which FUSED rows changed (a checkpoint now holds them); no-op if untracked."""
    for _, kernel in _fused_kernels(model):
        tracking = getattr(kernel, "_mtrains_tracking", None)
        if tracking is not None:
            for d in tracking.dirty:
                d.clear()
