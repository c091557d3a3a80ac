"""The tiered table shards of a model, as a checkpoint sees them, and the switch that keeps
them out of the model's own state_dict while a differential checkpoint saves them itself."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, List

from torch import nn

from torchrec_mtrains.checkpoint.types import PieceSpec
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection, ShardedTieredEmbeddingCollection
from torchrec_mtrains.sharding.kernel import shard_offsets

__all__ = [
    "LocalPiece", "clear_dirty", "collections_of", "exclude_tiered_state", "flush_tiers", "local_pieces",
    "state_dict_prefix",
]


@dataclasses.dataclass(frozen=True)
class LocalPiece:
    """A table shard of this rank: table ``t`` of ``emb``, a TieredEmbeddingBags (or, for a
    restore into a FUSED table, ``kind_change.FusedRows``: the same row interface)."""

    emb: TieredEmbeddingBags
    t: int
    spec: PieceSpec
    optimizer_step: int = 0  # the kernel's optimizer step count when the piece was taken


def _collections(model: nn.Module) -> Iterator[tuple]:
    for fqn, m in model.named_modules():
        if isinstance(m, (ShardedTieredEmbeddingBagCollection, ShardedTieredEmbeddingCollection)):
            yield (f"{fqn}." if fqn else ""), m


def collections_of(model: nn.Module) -> Iterator[tuple]:
    """(state_dict prefix, collection) of every sharded collection with tiered tables."""
    for fqn, m in _collections(model):
        yield state_dict_prefix(fqn), m


def state_dict_prefix(fqn: str) -> str:
    """The collection's prefix in ``model.state_dict()``: DistributedModelParallel leaves out
    its ``_dmp_wrapped_module.`` and the ``module.`` of the DDP wrapper under it."""
    for wrapper in ("_dmp_wrapped_module.", "module."):
        if fqn.startswith(wrapper):
            fqn = fqn[len(wrapper):]
    return fqn


def local_pieces(model: nn.Module) -> List[LocalPiece]:
    """Every tiered table shard this rank holds, in a stable order."""
    out = []
    for fqn, collection in _collections(model):
        for kernel in collection.tiered_kernels():
            emb = kernel.emb_module
            for t, table in kernel.shards():
                row, col = shard_offsets(table)
                layout = emb.layouts[t]
                lo, hi = emb.init_range(t)
                spec = PieceSpec(
                    table=table.name, module=state_dict_prefix(fqn), row_offset=int(row), col_offset=int(col),
                    rows=int(table.local_rows), cols=int(table.local_cols),
                    table_rows=int(table.num_embeddings), table_cols=int(table.embedding_dim),
                    dtype=layout.torch_dtype_name, state_values=int(layout.state_values),
                    seed=int(emb.store_seed(t)), init_range=[float(lo), float(hi)],
                    virtual=bool(table.use_virtual_table),  # rows: its id space; ids: the live ones
                    tables_attr=collection.TABLES_ATTR, optimizer=layout.optimizer,
                )
                out.append(LocalPiece(emb, t, spec, int(emb.optimizer_step)))
    return sorted(out, key=lambda p: p.spec.key)


def flush_tiers(model: nn.Module, steps_done: bool = True, durable: bool = True) -> None:
    """Writes every tiered table's dirty cached rows to its tier (and, ``durable``, makes
    them durable); ``steps_done``: called between training steps (see
    ``TieredEmbeddingBags.flush``)."""
    for _, collection in _collections(model):
        for kernel in collection.tiered_kernels():
            kernel.flush(steps_done=steps_done, durable=durable)


def clear_dirty(model: nn.Module) -> None:
    """Forgets which tiered rows changed: a checkpoint now holds every one of them."""
    for _, collection in _collections(model):
        for kernel in collection.tiered_kernels():
            kernel.emb_module.clear_dirty()


@contextlib.contextmanager
def exclude_tiered_state(model: nn.Module) -> Iterator[None]:
    """Within: ``model.state_dict()`` and the fused optimizer's state leave out the rows
    and optimizer state of tiered tables, and loading them leaves the tiers untouched."""
    collections = [m for _, m in _collections(model)]
    kernels = [k for m in collections for k in m.tiered_kernels()]
    for m in collections:
        m.tiered_state_excluded = True
    for k in kernels:
        k.state_excluded = True
    try:
        yield
    finally:
        for m in collections:
            m.tiered_state_excluded = False
        for k in kernels:
            k.state_excluded = False
