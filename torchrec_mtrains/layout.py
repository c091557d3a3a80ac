"""TableLayout: the bytes of one embedding row, weights then optimizer state, as stored.

The kernel's row codec, the backing stores' row widths, sharding's space checks and the
planner's model spec all take a row's size from here. The layout is
FBGEMM's TBE on the CPU: ``dim`` weights in the table's precision, then the optimizer's
fp32 state (one value per row for row-wise Adagrad, one per weight for Adagrad, none for
SGD; Adam and LAMB: momentum1 per weight, then momentum2 per weight, or one per row for
their partial row-wise forms). A store row keeps the state's bits as they are: one fp32 slot per value, or two
fp16 slots per value in an fp16 table (a reinterpretation of its bytes, never a
conversion).

Imports neither torch nor FBGEMM: FBGEMM's ``EmbOptimType`` and ``SparseType`` are
accepted through their string values, so the planner's model code can use this too.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

__all__ = ["OPTIMIZERS", "PRECISIONS", "SHORT_OPTIMIZER_NAMES", "TableLayout", "optimizer_name", "precision_name",
           "state_parts"]

_STATE_VALUE_BYTES = 4  # FBGEMM keeps optimizer state in fp32 whatever the weights' precision


@dataclasses.dataclass(frozen=True)
class _Precision:
    element_bytes: int
    torch_dtype: str  # the name of the torch dtype of the weights (torch.<name>)


# FBGEMM SparseType values -> the weights' element.
_PRECISIONS: Dict[str, _Precision] = {
    "fp32": _Precision(4, "float32"),
    "fp16": _Precision(2, "float16"),
}

# FBGEMM EmbOptimType values -> a row's fp32 optimizer state, as FBGEMM's
# split_optimizer_states gives it: each part's values per row, as a function of dim. A
# part of one value per row is FBGEMM's 1-D (row-wise) state.
_OPTIMIZERS: Dict[str, Callable[[int], Tuple[int, ...]]] = {
    "exact_row_wise_adagrad": lambda dim: (1,),
    "exact_adagrad": lambda dim: (dim,),
    "exact_sgd": lambda dim: (),
    # momentum1 (exp_avg) and momentum2 (exp_avg_sq); the partial row-wise ones keep one
    # momentum2 per row.
    "adam": lambda dim: (dim, dim),
    "partial_row_wise_adam": lambda dim: (dim, 1),
    "lamb": lambda dim: (dim, dim),
    "partial_row_wise_lamb": lambda dim: (dim, 1),
}

# The names the planner's MODEL.yaml uses for the same optimizers.
_SHORT_NAMES: Mapping[str, str] = {
    "rowwise_adagrad": "exact_row_wise_adagrad",
    "adagrad": "exact_adagrad",
    "sgd": "exact_sgd",
    "partial_rowwise_adam": "partial_row_wise_adam",
    "partial_rowwise_lamb": "partial_row_wise_lamb",
}

PRECISIONS: Tuple[str, ...] = tuple(_PRECISIONS)
"""The supported weight precisions, as FBGEMM's ``SparseType`` values."""
OPTIMIZERS: Tuple[str, ...] = tuple(_OPTIMIZERS)
"""The supported optimizers, as FBGEMM's ``EmbOptimType`` values."""
SHORT_OPTIMIZER_NAMES: Tuple[str, ...] = tuple(_SHORT_NAMES)
"""The planner's short names of the supported optimizers."""


def _value_of(value: object) -> object:
    """The string value of an enum member (FBGEMM's enums), else ``value`` itself."""
    return value.value if isinstance(value, enum.Enum) else value


def optimizer_name(value: object, what: str = "optimizer") -> str:
    """The FBGEMM ``EmbOptimType`` value of a supported optimizer.

    Args:
        value: an ``EmbOptimType``, its string value (``"exact_row_wise_adagrad"``,
            ``"exact_adagrad"``, ``"exact_sgd"``) or a planner short name
            (``"rowwise_adagrad"``, ``"adagrad"``, ``"sgd"``).
        what: the setting's name in the error message.

    Raises:
        ValueError: an unsupported optimizer, naming it and the choices.
    """
    name = _value_of(value)
    if isinstance(name, str):
        name = _SHORT_NAMES.get(name, name)
        if name in _OPTIMIZERS:
            return name
    raise ValueError(
        f"{what}={value!r} must be one of {list(OPTIMIZERS)} (FBGEMM's EmbOptimType) "
        f"or {list(SHORT_OPTIMIZER_NAMES)}"
    )


def state_parts(optimizer: object, dim: int) -> Tuple[int, ...]:
    """Values per row of each of FBGEMM's parts of ``optimizer``'s state on rows of ``dim``
    weights (``TableLayout.state_parts``), for code that holds no TableLayout (checkpoints).

    Raises:
        ValueError: an unsupported optimizer (see ``optimizer_name``).
    """
    return _OPTIMIZERS[optimizer_name(optimizer)](dim)


def precision_name(value: object, what: str = "precision") -> str:
    """The FBGEMM ``SparseType`` value of a supported weight precision.

    Args:
        value: a ``SparseType`` or its string value (``"fp32"``, ``"fp16"``).
        what: the setting's name in the error message.

    Raises:
        ValueError: an unsupported precision, naming it and the choices.
    """
    name = _value_of(value)
    if isinstance(name, str) and name in _PRECISIONS:
        return name
    raise ValueError(f"{what}={value!r} must be one of {list(PRECISIONS)} (FBGEMM's SparseType)")


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """The row layout of one table: ``dim`` weights, then the optimizer's state.

    Args:
        dim: weights per row (a positive integer).
        precision: the weights' precision: ``SparseType`` or its value (``"fp32"``,
            ``"fp16"``); stored as the value.
        optimizer: ``EmbOptimType``, its value or a planner short name (see
            ``optimizer_name``); stored as the ``EmbOptimType`` value.

    Raises:
        ValueError: a bad dim, an unsupported precision or optimizer.
    """

    dim: int
    precision: str
    optimizer: str

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim={self.dim!r} must be a positive integer")
        # Frozen: the normalised names replace what was given.
        object.__setattr__(self, "precision", precision_name(self.precision))
        object.__setattr__(self, "optimizer", optimizer_name(self.optimizer))

    @property
    def element_bytes(self) -> int:
        """Bytes of one weight (and of one store slot)."""
        return _PRECISIONS[self.precision].element_bytes

    @property
    def torch_dtype_name(self) -> str:
        """The name of the weights' torch dtype (``getattr(torch, name)``)."""
        return _PRECISIONS[self.precision].torch_dtype

    @property
    def state_values(self) -> int:
        """fp32 optimizer-state values per row: 1 (row-wise Adagrad), dim (Adagrad), 0 (SGD),
        2 dim (Adam, LAMB), dim + 1 (partial row-wise Adam and LAMB)."""
        return sum(self.state_parts)

    @property
    def state_parts(self) -> Tuple[int, ...]:
        """Values per row of each part of the state, in FBGEMM's order (Adam and LAMB:
        momentum1 then momentum2); a part of 1 is one value per row."""
        return state_parts(self.optimizer, self.dim)

    @property
    def state_slots(self) -> int:
        """Store slots (of ``element_bytes`` each) holding a row's optimizer state."""
        return self.state_values * (_STATE_VALUE_BYTES // self.element_bytes)

    @property
    def row_width(self) -> int:
        """Store slots per row: weights, then optimizer state."""
        return self.dim + self.state_slots

    @property
    def weight_bytes(self) -> int:
        """Bytes of a row's weights."""
        return self.dim * self.element_bytes

    @property
    def state_bytes(self) -> int:
        """Bytes of a row's optimizer state (what FBGEMM allocates for it)."""
        return self.state_values * _STATE_VALUE_BYTES

    @property
    def row_bytes(self) -> int:
        """Bytes of a stored row: weights plus optimizer state."""
        return self.row_width * self.element_bytes

    def state_shape(self, rows: int) -> Optional[Tuple[int, ...]]:
        """Shape of the optimizer state of ``rows`` rows in FBGEMM's layout
        (``split_optimizer_states``): ``(rows,)`` row-wise, ``(rows, dim)`` per weight,
        None without state (SGD); an optimizer of several parts (Adam, LAMB) as one
        ``(rows, state_values)`` block, its parts side by side (``split_state``)."""
        if self.state_values == 0:
            return None
        return (rows,) if self.state_values == 1 else (rows, self.state_values)

    def split_state(self, state: "Any") -> List["Any"]:
        """FBGEMM's parts of a ``(rows, state_values)`` state block (a torch tensor):
        ``[rows]`` for a part of one value per row, else ``[rows, values]``."""
        parts, start = [], 0
        for width in self.state_parts:
            part = state[:, start:start + width]
            parts.append(part.reshape(-1) if width == 1 else part)
            start += width
        return parts
