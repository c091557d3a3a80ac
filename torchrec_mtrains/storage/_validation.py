"""Input checks shared by every row store; errors name the table and the bad value."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Iterator, Union

import torch

PathLike = Union[str, "os.PathLike[str]"]

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def as_ids(table: str, ids: object) -> torch.Tensor:
    """Returns ``ids`` as a contiguous 1-D int64 CPU tensor, or raises ValueError."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.dtype not in _INT_DTYPES:
        raise ValueError(f"{table}: ids must be an integer tensor, got dtype {ids.dtype}")
    if ids.dim() != 1:
        raise ValueError(f"{table}: ids must be 1-D, got shape {tuple(ids.shape)}")
    if ids.device.type != "cpu":
        raise ValueError(f"{table}: ids must be on the CPU, got {ids.device}")
    return ids.to(torch.int64).contiguous()


def check_id_range(table: str, ids: torch.Tensor, num_rows: int) -> None:
    """Raises IndexError naming the first id outside ``[0, num_rows)``."""
    if ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= num_rows)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        raise IndexError(
            f"{table}: row id {int(ids[pos])} at position {pos} is outside [0, {num_rows})"
        )


def check_row_range(table: str, start: object, stop: object, num_rows: int) -> None:
    """Raises ValueError unless ``start`` and ``stop`` are integers, IndexError naming the
    table and the range unless ``0 <= start <= stop <= num_rows``."""
    for name, value in (("start", start), ("stop", stop)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{table}: {name}={value!r} must be an integer")
    if not 0 <= start <= stop <= num_rows:
        raise IndexError(
            f"{table}: row range [{start}, {stop}) is not a range of the table's rows "
            f"[0, {num_rows}) (needs 0 <= start <= stop <= {num_rows})"
        )


@contextlib.contextmanager
def id_range_checked_by_op(table: str, ids: torch.Tensor, num_rows: int) -> Iterator[None]:
    """For a C++ op that checks every id before it touches a row (CheckSlots): its
    IndexError becomes ``check_id_range``'s, naming the table, the id and its position.
    Saves the separate range pass of torch ops on every call."""
    try:
        yield
    except IndexError:
        check_id_range(table, ids, num_rows)
        raise


def check_rows(table: str, rows: object, n: int, width: int, dtype: torch.dtype, name: str) -> None:
    """Raises ValueError unless ``rows`` is a CPU tensor of ``dtype`` shaped ``[n, width]``."""
    if not isinstance(rows, torch.Tensor):
        raise ValueError(f"{table}: {name} must be a torch.Tensor, got {type(rows).__name__}")
    if rows.dtype != dtype:
        raise ValueError(f"{table}: {name} has dtype {rows.dtype}, the table holds {dtype}")
    if tuple(rows.shape) != (n, width):
        raise ValueError(
            f"{table}: {name} has shape {tuple(rows.shape)}, expected ({n}, {width})"
            " = (len(ids), dim + state_dim)"
        )
    if rows.device.type != "cpu":
        raise ValueError(f"{table}: {name} must be on the CPU, got {rows.device}")


def check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} must be an integer in [{lo}, {hi}]")


def check_number(name: str, value: object, lo: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < lo
    ):
        raise ValueError(f"{name}={value!r} must be a finite number >= {lo}")


def check_init_range(init_range: object) -> None:
    if (
        not isinstance(init_range, (tuple, list))
        or len(init_range) != 2
        or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in init_range)
        or init_range[0] > init_range[1]
    ):
        raise ValueError(f"init_range={init_range!r} must be (lo, hi), finite, lo <= hi")


def check_path(path: PathLike) -> str:
    """Returns ``path`` as an absolute str, or raises ValueError."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    text = os.fspath(path)
    if not text or "\0" in text:
        raise ValueError(f"path {text!r} is empty or contains a NUL byte")
    return os.path.abspath(text)
