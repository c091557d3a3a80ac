"""CacheSlots: the FBGEMM TBE whose rows are a kernel's cache slots.

Table t of one ``SplitTableBatchedEmbeddingBagsCodegen`` (HOST/CPU) has a row per slot of
table t's cache, plus room for its overflow pool; a step's indices remapped to slots make
forward, backward and the fused optimizer FBGEMM's own code -- or, for the optimizers
FBGEMM's CPU TBE does not train (Adam, LAMB), FBGEMM's forward and the kernel's own
update of the same slots (``adam_family.py``). When an overflow pool
outgrows the TBE, rows loaded for slots past its end wait (``deferred``) and the TBE is
rebuilt larger between steps.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
    construct_split_state,
)

from torchrec_mtrains.huge_pages import huge_page_zeros
from torchrec_mtrains.kernels.adam_family import AdamTerms, AdamUpdate, is_adam_family
from torchrec_mtrains.kernels.config import TieredConfig
from torchrec_mtrains.kernels.tbe_settings import ADAM_TERMS
from torchrec_mtrains.kernels.row_codec import RowCodec

__all__ = ["CacheSlots", "Deferred"]

_NO_STATE = torch.empty(0)  # a table without optimizer state, in move calls


@dataclasses.dataclass
class Deferred:
    """Rows loaded for overflow slots past the TBE's current size, copied in once it grows."""

    table: int
    slots: torch.Tensor
    ids: torch.Tensor
    rows: torch.Tensor


class CacheSlots:
    """The TBE over every table's cache slots, and its weights and optimizer state per table.

    ``weights[t]`` and ``states[t]`` (None without optimizer state) alias the TBE's tensors
    with version counters of their own: the prefetch thread fills slots of the next step
    while autograd holds the weights of the current one, and those writes (to other rows)
    must not invalidate its saved tensors. ``move_states`` is the step mover's view of the
    same state (an empty tensor where there is none); ``rows[t]`` is table t's TBE rows.

    Args:
        specs: ``(num_rows, dim)`` per table.
        config: the kernel's settings (optimizer, precision, pooling, cache ways, and the
            FBGEMM settings its TBE takes as given: ``tbe_settings``).
        codecs: each table's row codec.
        feature_table_map: FBGEMM's, checked (None: one feature per table).
        rows: each table's TBE rows to start with.
    """

    def __init__(self, specs: Sequence[Tuple[int, int]], config: TieredConfig, codecs: Sequence[RowCodec],
                 feature_table_map: Optional[List[int]], rows: List[int]) -> None:
        self._dims = [dim for _, dim in specs]
        self._config = config
        self._codecs = codecs
        self._feature_table_map = feature_table_map
        self.learning_rate = config.learning_rate  # kept when the TBE is rebuilt
        self.deferred: List[Deferred] = []
        # The Adam family's update (None: FBGEMM's fused optimizer trains the TBE).
        self.adam: Optional[AdamUpdate] = None
        if is_adam_family(config.optimizer):
            settings = dict(config.tbe_settings)
            self.adam = AdamUpdate(config.optimizer, AdamTerms.from_settings(settings), config.eps,
                                   config.pooling_mode, feature_table_map or list(range(len(specs))))
        self._build(rows)

    def _build(self, rows: List[int]) -> None:
        config = self._config
        settings = dict(config.tbe_settings)  # FBGEMM's settings the kernel passes on (tbe_settings.py)
        optimizer = config.optimizer
        if self.adam is not None:  # the TBE only looks rows up; the kernel's update trains them
            settings = {k: v for k, v in settings.items() if k not in ADAM_TERMS}
            optimizer = EmbOptimType.EXACT_SGD
        specs = [(r, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, dim in zip(rows, self._dims)]
        # The weights on huge pages (huge_pages.py), sized as FBGEMM sizes its own buffer.
        weights_size = construct_split_state(specs, rowwise=False, cacheable=True,
                                             precision=config.weights_precision).host_size
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            specs,
            optimizer=optimizer,
            preallocated_host_buffers={"weights": huge_page_zeros([weights_size],
                                                                  config.weights_precision.as_dtype())},
            learning_rate=self.learning_rate,
            eps=config.eps,
            pooling_mode=config.pooling_mode,
            weights_precision=config.weights_precision,
            feature_table_map=self._feature_table_map,
            **settings,
        )
        self.weights = [_alias(w) for w in tbe.split_embedding_weights()]
        self.states: List[Optional[torch.Tensor]]
        if self.adam is not None:
            self.states = [huge_page_zeros([r, codec.layout.state_values], torch.float32)
                           for r, codec in zip(rows, self._codecs)]
            # Slot -> its gradient's place while a backward runs (adam_family_ops.cpp).
            self.positions = [huge_page_zeros([r], torch.int32).fill_(-1) for r in rows]
        elif self._codecs[0].layout.state_values:
            self.states = [_alias(s[0]) for s in tbe.split_optimizer_states()]
        else:
            self.states = [None] * len(rows)
        self.move_states = [_NO_STATE if s is None else s for s in self.states]
        self.tbe, self.rows = tbe, rows

    def set_learning_rate(self, learning_rate: float) -> None:
        """The fused optimizer's learning rate, now and after the TBE is rebuilt."""
        self.learning_rate = learning_rate
        self.tbe.set_learning_rate(learning_rate)

    def grow(self, capacities: Sequence[int]) -> bool:
        """Rebuilds the TBE larger when a table's cache (``capacities``: slots per table, its
        overflow pool included) outgrew it, and copies the deferred rows in; returns whether
        it did (the step engine then needs the new slots). Call only between steps."""
        if all(n <= r for n, r in zip(capacities, self.rows)):
            return False
        old_w, old_s, old_rows = self.weights, self.states, self.rows
        ways = self._config.cache_ways
        self._build([max(r, n + max(ways, n // 4)) if n > r else r for n, r in zip(capacities, old_rows)])
        with torch.no_grad():
            for t in range(len(old_rows)):
                self.weights[t][: old_rows[t]].copy_(old_w[t])
                if old_s[t] is not None:
                    self.states[t][: old_rows[t]].copy_(old_s[t])
        deferred, self.deferred = self.deferred, []
        for d in deferred:
            self.scatter(d.table, d.slots, d.rows)
        return True

    def in_tbe(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Which of table t's ``slots`` the TBE has (the others are overflow slots past it)."""
        return slots < self.rows[t]

    def gather(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Store rows of table t's ``slots`` (all in the TBE)."""
        return self._codecs[t].gather(self.weights[t], self.states[t], slots)

    def scatter(self, t: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Writes store ``rows`` into table t's ``slots`` (all in the TBE)."""
        self._codecs[t].scatter(self.weights[t], self.states[t], slots, rows)

    def defer(self, t: int, slots: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Keeps rows ``ids`` read from the tier for table t's overflow ``slots`` past the
        TBE until it grows (``grow``)."""
        self.deferred.append(Deferred(t, slots, ids, rows))

    def drop_deferred(self, t: int) -> None:
        """Forgets table t's deferred rows (its cache was reset)."""
        self.deferred = [d for d in self.deferred if d.table != t]


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over the same memory as ``t`` with a version counter of its own."""
    with torch.no_grad():
        return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())
