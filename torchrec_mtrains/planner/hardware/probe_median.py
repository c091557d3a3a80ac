"""The median of repeated probes: one profile whose every figure is the median of N.

One probe on a shared machine catches it in one mood: a VM's neighbours can halve its
memory bandwidth for a minute. Probing N times and taking each figure's median gives a
profile that no single slow or fast spell decides, and each figure's note says how far
apart the N measurements were (max / min), so a reader sees which figures are noisy.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Dict, List, Optional, Sequence, TypeVar

from torchrec_mtrains.planner.hardware.topology import yaml_key
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

__all__ = ["median_topology", "spread_notes"]

_Spec = TypeVar("_Spec", TierSpec, ComputeSpec)


def _columns(specs: Sequence[object]) -> Dict[str, List[object]]:
    """Each field's values over ``specs``, by field name."""
    return {f.name: [getattr(s, f.name) for s in specs] for f in dataclasses.fields(specs[0])}


def _is_figure(column: List[object]) -> bool:
    """Whether every probe measured this field (a number in each)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in column)


def _median_spec(specs: Sequence[_Spec]) -> _Spec:
    """Each figure's median over ``specs`` (a field None in any of them stays None;
    integer fields stay integers)."""
    values = {}
    for name, column in _columns(specs).items():
        if not _is_figure(column):
            values[name] = column[0] if all(v == column[0] for v in column) else None
            continue
        m = statistics.median(column)
        # 4 significant digits, as probes write theirs (a mean of two halves adds float noise).
        values[name] = int(round(m)) if all(isinstance(v, int) for v in column) else float(f"{m:.4g}")
    return type(specs[0])(**values)


def median_topology(topologies: Sequence[TieredTopology], source: str) -> TieredTopology:
    """One topology whose tiers' and compute's figures are the medians of ``topologies``
    (probes of one machine: same tiers, ranks and cores).

    Raises:
        ValueError: no topologies, or they have different tiers or ranks per node.
    """
    if not topologies:
        raise ValueError("median_topology needs at least one topology")
    first = topologies[0]
    for t in topologies[1:]:
        if set(t.tiers) != set(first.tiers) or t.ranks_per_node != first.ranks_per_node:
            raise ValueError("median_topology: the probes measured different tiers or ranks per node")
    tiers = {tier: _median_spec([t.tiers[tier] for t in topologies]) for tier in first.tiers}
    compute = _median_spec([t.compute for t in topologies])
    return dataclasses.replace(first, tiers=tiers, compute=compute, source=source)


def _spread(column: List[float]) -> Optional[str]:
    lo, hi = min(column), max(column)
    if lo <= 0:
        return None if hi <= 0 else "some probes measured 0"
    return f"max/min {hi / lo:.2f}"


def spread_notes(topologies: Sequence[TieredTopology]) -> Dict[str, str]:
    """Profile path -> "median of N probes, max/min X" for each figure that varies."""
    n = len(topologies)
    out: Dict[str, str] = {}

    def note(path: str, specs: Sequence[object]) -> None:
        for name, column in _columns(specs).items():
            if not _is_figure(column):
                continue
            spread = _spread([float(v) for v in column])
            if spread is not None and min(column) != max(column):
                out[f"{path}.{yaml_key(name)}"] = f"median of {n} probes, {spread}"

    for tier in topologies[0].tiers:
        note(f"tiers.{tier.value}", [t.tiers[tier] for t in topologies])
    note("compute", [t.compute for t in topologies])
    return out
