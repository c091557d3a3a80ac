"""Quantities with units, as written in topology YAML files and size flags: sizes, rates,
counts, times.

Every parser takes the value and the field's path (for the message) and returns a float in
the base unit (bytes, bytes/s, 1/s or s); every formatter writes a value back in the largest
unit that keeps it exact, so parse(format(x)) == x. Sizes have one parser, ``parse_size``
(for YAML fields and command-line flags alike): SI units are powers of 1000 (1.5GB =
1.5e9 bytes), IEC units powers of 1024 (1.5GiB = 1.5 x 2^30 bytes).
"""

from __future__ import annotations

import decimal
import math
import re
from decimal import Decimal
from typing import Callable, Dict, Tuple

__all__ = ["QUANTITIES", "Quantity", "format_quantity", "parse_quantity", "parse_size"]

SIZE_UNITS: Dict[str, Decimal] = {
    "B": Decimal(1),
    "KB": Decimal(10**3), "MB": Decimal(10**6), "GB": Decimal(10**9), "TB": Decimal(10**12),
    "KiB": Decimal(2**10), "MiB": Decimal(2**20), "GiB": Decimal(2**30), "TiB": Decimal(2**40),
}
"""Byte units: SI (powers of 1000, as disk and bandwidth spec sheets use) and IEC (powers
of 1024, as memory capacities are given)."""

COUNT_UNITS: Dict[str, Decimal] = {"": Decimal(1), "K": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9)}
"""Suffixes of counts (IOPS): ``500K`` = 500,000."""

TIME_UNITS: Dict[str, Decimal] = {"s": Decimal(1), "ms": Decimal("1e-3"), "us": Decimal("1e-6"), "ns": Decimal("1e-9")}

_EXACT = decimal.Context(prec=60)
"""Number x unit is computed in decimal and rounded once to a float, so "0.2ms" is the
float nearest 0.0002, exactly like "200us"."""


def _scale(digits: str, unit: Decimal) -> float:
    return float(_EXACT.multiply(Decimal(digits), unit))

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*)\s*(/s)?\s*$")


class Quantity:
    """One kind of quantity: its units, whether it is per second, and how to print it.

    Args:
        name: what it is, for messages ("size", "bandwidth", ...).
        units: unit name -> factor to the base unit.
        rate_suffix: whether "/s" follows the unit: "required" (bandwidths), "optional"
            (counts, where ``read_iops: 500K`` reads naturally) or "forbidden" (sizes, times).
        bare_allowed: a plain number (no unit) is accepted in the base unit.
        examples: shown in messages.
    """

    def __init__(self, name: str, units: Dict[str, Decimal], rate_suffix: str, bare_allowed: bool,
                 examples: str) -> None:
        self.name = name
        self.units = units
        self.rate_suffix = rate_suffix  # "required", "optional" or "forbidden"
        self.bare_allowed = bare_allowed
        self.examples = examples


QUANTITIES: Dict[str, Quantity] = {
    "size": Quantity("size", SIZE_UNITS, "forbidden", False, "512GiB, 64B, 1.5TB"),
    "byte_count": Quantity("size", {"": Decimal(1), **SIZE_UNITS}, "forbidden", True, "64MiB, 1.5GB, 4096"),
    "bandwidth": Quantity("bandwidth", SIZE_UNITS, "required", False, "2.0GB/s, 400MiB/s"),
    "count_rate": Quantity("count per second", COUNT_UNITS, "optional", True, "500K, 1.5M/s, 12000"),
    "time": Quantity("time", TIME_UNITS, "forbidden", False, "0.5ms, 120ns, 1e-6s"),
}


def parse_quantity(value: object, kind: str, path: str) -> float:
    """Parses ``value`` (a string with a unit, or a plain number where the kind allows it).

    Args:
        value: e.g. "512GiB", "2.0GB/s", "500K", "0.5ms", or 12000 for a count.
        kind: a key of ``QUANTITIES``.
        path: the field, e.g. "tiers.ssd.read_bandwidth", named in errors.

    Returns:
        The value in the base unit (bytes, bytes/s, 1/s or seconds), finite and >= 0.

    Raises:
        ValueError: naming ``path``: no or unknown unit, a missing or superfluous "/s",
            a negative or non-finite value, or not a number at all.
    """
    q = QUANTITIES[kind]
    if isinstance(value, bool):
        raise ValueError(f"{path}: expected a {q.name} such as {q.examples}, got {value!r}")
    if isinstance(value, (int, float)):
        if not q.bare_allowed:
            raise ValueError(f"{path}: {value!r} has no unit; write a {q.name} such as {q.examples}")
        number = float(value)
    elif isinstance(value, str):
        m = _NUMBER.match(value)
        if m is None:
            raise ValueError(f"{path}: cannot read {value!r} as a {q.name} (e.g. {q.examples})")
        digits, unit, per_s = m.groups()
        if unit not in q.units:
            known = ", ".join(u or "(none)" for u in q.units)
            if not unit and not q.bare_allowed:
                raise ValueError(f"{path}: {value!r} has no unit; write a {q.name} such as {q.examples}")
            raise ValueError(f"{path}: unknown unit {unit!r} in {value!r} (a {q.name} takes {known})")
        if per_s and q.rate_suffix == "forbidden":
            raise ValueError(f"{path}: {value!r} is a rate; a {q.name} has no '/s' (e.g. {q.examples})")
        if not per_s and q.rate_suffix == "required":
            raise ValueError(f"{path}: {value!r} lacks '/s'; a {q.name} is per second (e.g. {q.examples})")
        number = _scale(digits, q.units[unit])
    else:
        raise ValueError(f"{path}: expected a {q.name} such as {q.examples}, got {type(value).__name__} {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"{path}: {value!r} is not finite")
    if number < 0:
        raise ValueError(f"{path}: {value!r} is negative")
    return number


def parse_size(value: object, path: str, bare_bytes: bool = False) -> float:
    """Parses a size: "64MiB", "1.5GB" (= 1.5e9 bytes), "512GiB" (= 512 x 2^30 bytes).

    Args:
        value: the size: a number with a unit of ``SIZE_UNITS`` (case as written there).
        path: the field or flag, e.g. "tiers.dram.capacity" or "--dram-budget", named in
            errors.
        bare_bytes: also accept a plain number ("4096", 4096) as bytes, as size flags do;
            a YAML field always needs its unit.

    Returns:
        Bytes, finite and >= 0.

    Raises:
        ValueError: naming ``path``: no unit (unless ``bare_bytes``), an unknown unit, a
            negative or non-finite value, or not a number at all.
    """
    return parse_quantity(value, "byte_count" if bare_bytes else "size", path)


_FORMAT_ORDER: Dict[str, Tuple[str, ...]] = {
    # Units tried largest first; IEC before SI at the same scale only where it is exact.
    "size": ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB", "B"),
    "byte_count": ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB", "B"),
    "bandwidth": ("TB", "GB", "MB", "KB", "B"),
    "count_rate": ("G", "M", "K", ""),
    "time": ("s", "ms", "us", "ns"),
}


def format_quantity(value: float, kind: str) -> str:
    """Writes ``value`` (base unit) with the largest unit that reads back exactly and
    shortly (at most 6 significant digits); else the base unit with full precision.

    ``format_quantity(2**39, "size") == "512GiB"``, ``format_quantity(2.5e9, "bandwidth") == "2.5GB/s"``.
    """
    q = QUANTITIES[kind]
    suffix = "/s" if q.rate_suffix == "required" else ""
    value = float(value)
    fmt: Callable[[float], str] = lambda x: repr(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)
    if value != 0:
        for unit in _FORMAT_ORDER[kind]:
            scaled = value / float(q.units[unit])
            if abs(scaled) < 1:
                continue
            short = f"{scaled:.6g}"
            if "e" not in short and _scale(short, q.units[unit]) == value:  # what parse_quantity computes
                return f"{fmt(float(short))}{unit}{suffix}"
    base = "B" if kind in ("size", "byte_count", "bandwidth") else ("s" if kind == "time" else "")
    return f"{fmt(value)}{base}{suffix}"
