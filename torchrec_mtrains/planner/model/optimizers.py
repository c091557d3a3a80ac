"""The optimizer a plan sizes rows for: the names a model file and the planner take, and the
optimizer a TorchRec sharder will train a module's tables with.

A name is a planner short name (``rowwise_adagrad``, ``adagrad``, ``sgd``) or one of
FBGEMM's ``EmbOptimType`` values. Those the tiered kernel trains (and FBGEMM's aliases of
their layouts) take their row layout from ``torchrec_mtrains.layout``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from torchrec_mtrains.kernels.tbe_settings import TBE_DEFAULTS
from torchrec_mtrains.layout import OPTIMIZERS, SHORT_OPTIMIZER_NAMES, TableLayout, optimizer_name

__all__ = ["ACCEPTED_OPTIMIZERS", "canonical_optimizer", "optimizer_row_bytes", "trained_optimizer"]

# FBGEMM EmbOptimType values with the layout of an optimizer the tiered kernel trains.
_ALIASES: Mapping[str, str] = {"row_wise_adagrad": "exact_row_wise_adagrad"}
ACCEPTED_OPTIMIZERS: Tuple[str, ...] = tuple(SHORT_OPTIMIZER_NAMES) + OPTIMIZERS + tuple(_ALIASES)
"""Every optimizer name a model file or the planner takes."""


def canonical_optimizer(value: Any, what: str = "optimizer") -> str:
    """The EmbOptimType value of an optimizer name (or an ``EmbOptimType``).

    Raises:
        ValueError: a name not in ``ACCEPTED_OPTIMIZERS``, listing them.
    """
    name = getattr(value, "value", value)
    if isinstance(name, str):
        name = _ALIASES.get(name, name)
    try:
        return optimizer_name(name, what)
    except ValueError:
        raise ValueError(f"{what}={value!r} must be one of {list(ACCEPTED_OPTIMIZERS)} "
                         "(short names or FBGEMM's EmbOptimType values)") from None


def optimizer_row_bytes(dim: int, dtype: str, optimizer: str) -> int:
    """Bytes of a stored row of ``dim`` weights in ``dtype`` with ``optimizer``'s state."""
    return TableLayout(dim, dtype, canonical_optimizer(optimizer)).row_bytes


def trained_optimizer(fused_params: Optional[Mapping[str, Any]], table_optimizers: Iterable[Any]) -> Optional[str]:
    """The optimizer a sharder trains a module's tables with, as TorchRec resolves it per
    table: the table's own (``apply_optimizer_in_backward``, given as EmbOptimType or a
    name per table, None where it has none), else the sharder's ``fused_params["optimizer"]``,
    else FBGEMM's default (EXACT_SGD), which the sharders then train with. None only for a
    module without tables.

    Raises:
        ValueError: tables trained with different optimizers (one layout per plan), or an
            unknown optimizer.
    """
    default = (fused_params or {}).get("optimizer", TBE_DEFAULTS["optimizer"])
    found: Dict[str, None] = {}
    for table_optimizer in table_optimizers:
        chosen = table_optimizer if table_optimizer is not None else default
        if chosen is not None:
            found[canonical_optimizer(chosen, "the sharder's optimizer")] = None
    if len(found) > 1:
        raise ValueError(f"the tables train with different optimizers {list(found)}; a plan sizes rows for one")
    return next(iter(found), None)
