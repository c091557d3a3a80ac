"""AdamUpdate: Adam, partial row-wise Adam, LAMB and partial row-wise LAMB on tiered tables.

FBGEMM's CPU TBE refuses these optimizers ("not supported in CPU mode"), so a kernel
trained with one builds its TBE (``slots.py``) with EXACT_SGD for the lookup only: its
forward is FBGEMM's, run without autograd, and the step's backward is one C++ call
(``torch.ops.mtrains.adam_family_backward``, csrc/bindings/adam_family_ops.cpp) that sums
each touched slot's gradient from the output's gradient and updates the slot's weights and
state in place with FBGEMM's definitions (csrc/kernel/adam_update.h): only the rows a
batch touches change, with bias correction by the step count.

The step count is FBGEMM's ``iter``: it starts at 0 and every forward adds one (training or
not, as FBGEMM's TBE does), and the step's backward corrects with the count its forward
reached. The kernel keeps it (``TieredEmbeddingBags.optimizer_step``) and checkpoints save
it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from torchrec_mtrains.kernels.tbe_settings import ADAM_FAMILY, TBE_DEFAULTS

__all__ = ["AdamTerms", "AdamUpdate", "is_adam_family"]

# EmbOptimType values -> AdamKind of csrc/kernel/adam_update.h.
_KINDS = {name: kind for kind, name in enumerate(ADAM_FAMILY)}


def is_adam_family(optimizer: EmbOptimType) -> bool:
    """Whether the kernel's own update trains ``optimizer`` (its TBE only looks rows up)."""
    return optimizer.value in _KINDS


@dataclasses.dataclass(frozen=True)
class AdamTerms:
    """An Adam-family update's terms besides the learning rate and eps, FBGEMM's defaults
    where the TBE settings do not give them (beta1 0.9, beta2 0.999, weight decay 0, no
    gradient clipping).

    ``max_gradient`` is None without gradient clipping."""

    beta1: float = TBE_DEFAULTS["beta1"]
    beta2: float = TBE_DEFAULTS["beta2"]
    weight_decay: float = TBE_DEFAULTS["weight_decay"]
    max_gradient: Optional[float] = None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "AdamTerms":
        """The terms of a kernel's checked TBE settings (``TieredConfig.tbe_settings``)."""
        clip = settings.get("gradient_clipping", TBE_DEFAULTS["gradient_clipping"])
        return cls(
            beta1=float(settings.get("beta1", TBE_DEFAULTS["beta1"])),
            beta2=float(settings.get("beta2", TBE_DEFAULTS["beta2"])),
            weight_decay=float(settings.get("weight_decay", TBE_DEFAULTS["weight_decay"])),
            max_gradient=float(settings.get("max_gradient", TBE_DEFAULTS["max_gradient"])) if clip else None,
        )


class _UpdateInBackward(torch.autograd.Function):
    """The lookup's output, whose backward updates the rows (autograd sees no weights)."""

    @staticmethod
    def forward(ctx, anchor: torch.Tensor, lookup: Callable[[], torch.Tensor],  # type: ignore[override]
                update: Callable[[torch.Tensor], None]) -> torch.Tensor:
        ctx.update = update
        return lookup()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        ctx.update(grad_output.contiguous())
        return None, None, None


class AdamUpdate:
    """The Adam-family update of one kernel's TBE rows.

    Args:
        optimizer: one of ``ADAM_FAMILY``.
        terms: beta1, beta2, weight decay, gradient clipping.
        eps: the kernel's eps.
        pooling_mode: the kernel's pooling.
        feature_tables: the table of each feature.
    """

    def __init__(self, optimizer: EmbOptimType, terms: AdamTerms, eps: float, pooling_mode: PoolingMode,
                 feature_tables: Sequence[int]) -> None:
        self.kind = _KINDS[optimizer.value]
        self.terms = terms
        self.eps = eps
        self.pooling = int(pooling_mode.value)
        self.feature_tables = list(feature_tables)
        self.step = 0  # FBGEMM's iter: forwards so far
        self.seconds = 0.0  # wall seconds of the updates so far (cache_stats' update_seconds)
        # The output requires grad through this leaf, as FBGEMM's placeholder tensor does.
        self._anchor = torch.zeros(0, requires_grad=True)

    def check_weights(self, per_sample_weights: Optional[torch.Tensor], train: bool) -> None:
        """Raises ValueError for per-sample weights that require grad in a training step: the
        update gives them none. Called before the step's plan is taken, so a refused call
        changes nothing."""
        if (per_sample_weights is not None and per_sample_weights.requires_grad and train
                and torch.is_grad_enabled()):
            raise ValueError("per_sample_weights must not require grad on a table trained with "
                             f"{ADAM_FAMILY[self.kind]}: its update gives them no gradient")

    def lookup(self, slots: Any, lookup: Callable[[], torch.Tensor], indices: torch.Tensor, offsets: torch.Tensor,
               per_sample_weights: Optional[torch.Tensor], batch_sizes: Optional[List[List[int]]],
               train: bool) -> torch.Tensor:
        """``lookup()`` (the TBE's forward over ``indices``, the step's slots), counted as a
        step; with ``train`` and grad enabled, its backward updates the slots of ``slots``
        (``CacheSlots``: the weights, states and learning rate at backward time).
        ``per_sample_weights`` must not require grad then (``check_weights`` first)."""
        self.step += 1
        if not (train and torch.is_grad_enabled()):
            with torch.no_grad():
                return lookup()
        step, indices, offsets = self.step, indices.long(), offsets.long()
        flat_batch = [b for per_rank in batch_sizes for b in per_rank] if batch_sizes is not None else []
        terms = self.terms

        def update(grad_output: torch.Tensor) -> None:
            start = time.perf_counter()
            torch.ops.mtrains.adam_family_backward(
                grad_output=grad_output, indices=indices, offsets=offsets, per_sample_weights=per_sample_weights,
                feature_tables=self.feature_tables, batch_sizes=flat_batch, pooling=self.pooling,
                weights=slots.weights, states=slots.states, positions=slots.positions, kind=self.kind,
                learning_rate=slots.learning_rate, eps=self.eps, beta1=terms.beta1, beta2=terms.beta2,
                weight_decay=terms.weight_decay, step=step,
                max_gradient=-1.0 if terms.max_gradient is None else terms.max_gradient)
            self.seconds += time.perf_counter() - start

        return _UpdateInBackward.apply(self._anchor, lookup, update)
