"""Hardware profiles: ``TieredTopology`` from and to YAML.

A profile describes one node type, per rank::

    name: gpu-scm-node
    source: public spec sheets (see comments)
    compute_device: cuda            # cpu | cuda
    ranks_per_node: 8
    cores_per_node: 80              # optional: CPU cores of the node (the contention term)
    host_device_bandwidth: 25GB/s   # cuda only: the PCIe link of one GPU
    compute:
      tbe_bandwidth: 400GB/s        # ComputeSpec.tbe_bytes_per_s
      tbe_row_update_bandwidth: 100GB/s  # ComputeSpec.tbe_row_update_bytes_per_s (optional)
      step_overhead: 0.2ms          # ComputeSpec.step_overhead_s
      cache_row_cost: 20ns          # ComputeSpec.cache_row_s
      dense_time_per_sample: 0.1us  # ComputeSpec.dense_s_per_sample
      # optional, measured by probe-hw: lookup_cost, step_background_cpu,
      # lookup_background_cpu (the tiered kernel); dense_mac_cost, dense_activation_cost,
      # dense_layer_cost (a dense layer's cost from its shape); framework_step_cost,
      # framework_table_cost (the training framework per step), row_wise_group_cost and
      # row_wise_setup_cost (a row-wise sharding group's collectives per step, per table
      # and once); see ComputeSpec
    tiers:
      hbm: {capacity: 80GB, read_bandwidth: 2TB/s, write_bandwidth: 2TB/s}
      ssd:
        capacity: 800GB
        read_bandwidth: 3.2GB/s
        write_bandwidth: 1GB/s
        read_iops: 800K             # counts: plain, or with K/M/G (and optional /s)
        write_iops: 250K
        access_size: 4KiB           # TierSpec.access_bytes (default 64B)

Units are explicit: sizes in B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB
(powers of 1024); bandwidths are sizes "/s"; times in s, ms, us, ns. Each field may instead
be given under its dataclass name with the unit in the key (``capacity_bytes: 1e12``,
``read_bytes_per_s``, ``step_overhead_s``, ...) as a plain number. Unknown keys, unknown
units, negative, missing or duplicated values raise ``ValueError`` naming the field's path
(e.g. ``tiers.ssd.read_bandwidth``).

Shipped profiles (``profiles/*.yaml``) load by name: ``load_topology("gpu-scm-node")``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from torchrec_mtrains.planner.hardware.units import format_quantity, parse_quantity
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec
from torchrec_mtrains.types import Tier

__all__ = ["PROFILE_DIR", "load_topology", "parse_topology", "shipped_profiles", "topology_to_yaml", "yaml_key"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
"""Where the shipped profiles live (package data)."""

COMPUTE_DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class _Field:
    """One YAML field: its human key (unit in the value), its dataclass name (unit in the
    key, plain number), the kind of quantity, and whether it is required and > 0."""

    key: str
    attr: str
    kind: str  # a units.QUANTITIES key, or "int" for plain positive integers
    required: bool = True
    positive: bool = True


_TIER_FIELDS: Tuple[_Field, ...] = (
    _Field("capacity", "capacity_bytes", "size"),
    _Field("read_bandwidth", "read_bytes_per_s", "bandwidth"),
    _Field("write_bandwidth", "write_bytes_per_s", "bandwidth"),
    _Field("read_iops", "read_iops", "count_rate", required=False),
    _Field("write_iops", "write_iops", "count_rate", required=False),
    _Field("access_size", "access_bytes", "size", required=False),
    _Field("row_cpu_cost", "row_cpu_s", "time", required=False, positive=False),
    _Field("miss_cpu_cost", "miss_cpu_s", "time", required=False, positive=False),
    _Field("write_back_cpu_cost", "write_back_cpu_s", "time", required=False, positive=False),
    _Field("first_touch_cpu_cost", "first_touch_cpu_s", "time", required=False, positive=False),
)
_COMPUTE_FIELDS: Tuple[_Field, ...] = (
    _Field("tbe_bandwidth", "tbe_bytes_per_s", "bandwidth"),
    _Field("tbe_row_update_bandwidth", "tbe_row_update_bytes_per_s", "bandwidth", required=False, positive=False),
    _Field("step_overhead", "step_overhead_s", "time", required=False, positive=False),
    _Field("cache_row_cost", "cache_row_s", "time", required=False, positive=False),
    _Field("dense_time_per_sample", "dense_s_per_sample", "time", required=False, positive=False),
    _Field("lookup_cost", "lookup_s", "time", required=False, positive=False),
    _Field("step_background_cpu", "step_background_cpu_s", "time", required=False, positive=False),
    _Field("lookup_background_cpu", "lookup_background_cpu_s", "time", required=False, positive=False),
    _Field("dense_mac_cost", "dense_mac_s", "time", required=False, positive=False),
    _Field("dense_activation_cost", "dense_activation_s", "time", required=False, positive=False),
    _Field("dense_layer_cost", "dense_layer_s", "time", required=False, positive=False),
    _Field("framework_step_cost", "framework_step_s", "time", required=False, positive=False),
    _Field("framework_table_cost", "framework_table_s", "time", required=False, positive=False),
    _Field("framework_table_sample_cost", "framework_table_sample_s", "time", required=False, positive=False),
    _Field("row_wise_group_cost", "row_wise_group_s", "time", required=False, positive=False),
    _Field("row_wise_setup_cost", "row_wise_setup_s", "time", required=False, positive=False),
    _Field("framework_output_byte_cost", "framework_output_byte_s", "time", required=False, positive=False),
)
_OPTIONAL_COMPUTE = frozenset(f.attr for f in _COMPUTE_FIELDS[5:])
"""Compute fields written only when non-zero or noted: profiles without them read back the same."""
_LINK_FIELD = _Field("host_device_bandwidth", "host_device_bytes_per_s", "bandwidth", required=False)
_CORES_KEY = "cores_per_node"
_TOP_KEYS = ("name", "source", "compute_device", "ranks_per_node", _CORES_KEY, "compute", "tiers",
             _LINK_FIELD.key, _LINK_FIELD.attr)


def yaml_key(attr: str) -> str:
    """The profile key of a ``TierSpec`` or ``ComputeSpec`` field (e.g. ``read_iops``,
    ``tbe_bytes_per_s`` -> ``tbe_bandwidth``); KeyError for a field profiles do not have."""
    for f in _TIER_FIELDS + _COMPUTE_FIELDS:
        if f.attr == attr:
            return f.key
    raise KeyError(attr)


def shipped_profiles() -> List[str]:
    """Names of the profiles shipped with the package (``profiles/<name>.yaml``)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_topology(hw: "str | os.PathLike[str]") -> TieredTopology:
    """Loads a hardware profile.

    Args:
        hw: a YAML file's path, or the name of a shipped profile ("local", "gpu-scm-node").

    Raises:
        FileNotFoundError: ``hw`` is neither an existing file nor a shipped profile.
        ValueError: the file is not valid YAML or breaks the schema (the message names
            the file and the field).
    """
    path = Path(hw)
    if not path.is_file():
        shipped = PROFILE_DIR / f"{os.fspath(hw)}.yaml"
        if os.sep in os.fspath(hw) or not shipped.is_file():
            raise FileNotFoundError(
                f"hardware profile {os.fspath(hw)!r}: no such file and not a shipped profile "
                f"(shipped: {', '.join(shipped_profiles())})")
        path = shipped
    text = path.read_text()
    try:
        return parse_topology(text, default_name=path.stem)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def parse_topology(text: str, default_name: str = "") -> TieredTopology:
    """Parses a profile's YAML text (see the module docstring for the schema).

    Args:
        text: the YAML document.
        default_name: the name when the document has no ``name``.

    Raises:
        ValueError: naming the field's path.
    """
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not valid YAML: {e}") from None
    top = _mapping(doc, "(document)")
    _check_keys(top, _TOP_KEYS, "")
    name = top.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: must be a non-empty string, got {name!r}")
    source = top.get("source", "")
    if not isinstance(source, str):
        raise ValueError(f"source: must be a string, got {source!r}")
    device = _required(top, "compute_device", "")
    if device not in COMPUTE_DEVICES:
        raise ValueError(f"compute_device: {device!r} must be one of {', '.join(COMPUTE_DEVICES)}")
    ranks = _required(top, "ranks_per_node", "")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks_per_node: {ranks!r} must be an integer >= 1")
    cores = top.get(_CORES_KEY)
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ValueError(f"{_CORES_KEY}: {cores!r} must be an integer >= 1")
    tiers_doc = _mapping(_required(top, "tiers", ""), "tiers")
    if not tiers_doc:
        raise ValueError("tiers: at least one tier is needed")
    tiers: Dict[Tier, TierSpec] = {}
    for key, spec in tiers_doc.items():
        tier = _tier(key)
        values = _fields(_mapping(spec, f"tiers.{key}"), _TIER_FIELDS, f"tiers.{key}")
        if "access_bytes" in values:
            values["access_bytes"] = _whole(values["access_bytes"], f"tiers.{key}.access_size")
        tiers[tier] = TierSpec(**values)
    compute = ComputeSpec(**_fields(_mapping(_required(top, "compute", ""), "compute"), _COMPUTE_FIELDS, "compute"))
    link = _fields(top, (_LINK_FIELD,), "", check_keys=False).get(_LINK_FIELD.attr)
    topo = TieredTopology(name=name, compute_device=device, ranks_per_node=ranks,
                          tiers=dict(sorted(tiers.items(), key=lambda kv: list(Tier).index(kv[0]))),
                          compute=compute, host_device_bytes_per_s=link, source=source, cores_per_node=cores)
    _check_consistent(topo)
    return topo


def _check_consistent(topo: TieredTopology) -> None:
    cache = topo.cache_tier()
    if cache not in topo.tiers:
        raise ValueError(f"tiers.{cache.value}: missing; compute_device {topo.compute_device} "
                         f"keeps its caches in {cache.value}")
    if topo.compute_device == "cpu":
        if Tier.HBM in topo.tiers:
            raise ValueError("tiers.hbm: a cpu node has no HBM (set compute_device: cuda)")
        if topo.host_device_bytes_per_s is not None:
            raise ValueError(f"{_LINK_FIELD.key}: only for compute_device cuda")
    elif topo.host_device_bytes_per_s is None:
        raise ValueError(f"{_LINK_FIELD.key}: missing; needed for compute_device cuda (the PCIe link)")


def _tier(key: object) -> Tier:
    names = [t.value for t in Tier]
    if not isinstance(key, str) or key not in names:
        raise ValueError(f"tiers.{key}: unknown tier (tiers are {', '.join(names)})")
    return Tier(key)


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: must be a mapping, got {type(value).__name__} {value!r}")
    return value


def _required(doc: Mapping[str, Any], key: str, prefix: str) -> Any:
    if key not in doc or doc[key] is None:
        raise ValueError(f"{_join(prefix, key)}: missing")
    return doc[key]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _check_keys(doc: Mapping[str, Any], allowed: Tuple[str, ...], prefix: str) -> None:
    for key in doc:
        if key not in allowed:
            raise ValueError(f"{_join(prefix, str(key))}: unknown key (allowed: {', '.join(allowed)})")


def _fields(doc: Mapping[str, Any], fields: Tuple[_Field, ...], prefix: str, check_keys: bool = True) -> Dict[str, Any]:
    """Reads ``fields`` of ``doc`` into dataclass keyword arguments."""
    if check_keys:
        _check_keys(doc, tuple(k for f in fields for k in dict.fromkeys((f.key, f.attr))), prefix)
    out: Dict[str, Any] = {}
    for f in fields:
        human, plain = f.key in doc, f.attr in doc and f.attr != f.key
        if human and plain:
            raise ValueError(f"{_join(prefix, f.key)}: given twice (as {f.key} and {f.attr})")
        if not human and not plain:
            if f.required:
                raise ValueError(f"{_join(prefix, f.key)}: missing")
            continue
        key = f.key if human else f.attr
        path = _join(prefix, key)
        value = doc[key]
        if value is None:
            raise ValueError(f"{path}: missing (empty value)")
        if plain:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path}: the unit is in the key; expected a plain number, got {value!r}")
            value = float(value)
            if value != value or value in (float("inf"), float("-inf")) or value < 0:
                raise ValueError(f"{path}: {value!r} must be a finite number >= 0")
        else:
            value = parse_quantity(value, f.kind, path)
        if f.positive and value <= 0:
            raise ValueError(f"{path}: must be > 0, got {doc[key]!r}")
        out[f.attr] = value
    return out


def _whole(value: float, path: str) -> int:
    if value != int(value):
        raise ValueError(f"{path}: must be a whole number of bytes, got {value!r}")
    return int(value)


def topology_to_yaml(topo: TieredTopology, notes: Optional[Mapping[str, str]] = None, header: str = "") -> str:
    """Writes ``topo`` as a profile that ``parse_topology`` reads back equal.

    Args:
        topo: the topology.
        notes: field path (e.g. "tiers.ssd.read_iops") -> a comment written after it.
        header: comment lines written above the document (without "# ").

    Raises:
        ValueError: a note names a path the document does not have.
    """
    notes = dict(notes or {})
    lines: List[str] = [f"# {line}".rstrip() for line in header.splitlines()]

    def emit(indent: int, key: str, value: str, path: str) -> None:
        note = notes.pop(path, "")
        lines.append(f"{'  ' * indent}{key}:" + (f" {value}" if value else "") + (f"  # {note}" if note else ""))

    emit(0, "name", _scalar(topo.name), "name")
    emit(0, "source", _scalar(topo.source), "source")
    emit(0, "compute_device", topo.compute_device, "compute_device")
    emit(0, "ranks_per_node", str(topo.ranks_per_node), "ranks_per_node")
    if topo.cores_per_node is not None:
        emit(0, _CORES_KEY, str(topo.cores_per_node), _CORES_KEY)
    if topo.host_device_bytes_per_s is not None:
        emit(0, _LINK_FIELD.key, format_quantity(topo.host_device_bytes_per_s, "bandwidth"), _LINK_FIELD.key)
    emit(0, "compute", "", "compute")
    for f in _COMPUTE_FIELDS:
        value = getattr(topo.compute, f.attr)
        if value or f.attr not in _OPTIONAL_COMPUTE or f"compute.{f.key}" in notes:
            emit(1, f.key, format_quantity(value, f.kind), f"compute.{f.key}")
    emit(0, "tiers", "", "tiers")
    for tier, spec in topo.tiers.items():
        emit(1, tier.value, "", f"tiers.{tier.value}")
        for f in _TIER_FIELDS:
            value = getattr(spec, f.attr)
            if value is not None:
                emit(2, f.key, format_quantity(value, f.kind), f"tiers.{tier.value}.{f.key}")
    if notes:
        raise ValueError(f"notes for fields the profile does not have: {', '.join(sorted(notes))}")
    return "\n".join(lines) + "\n"


def _scalar(text: str) -> str:
    """A YAML scalar for a string (quoted only where plain style would change it)."""
    dumped = yaml.safe_dump(text, default_flow_style=True, width=10**9).strip()
    return dumped[:-4].rstrip() if dumped.endswith("\n...") else dumped.removesuffix("...").rstrip()
