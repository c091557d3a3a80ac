"""Where the example's tables go: hardware profiles and the placement of tables on tiers.

``plan_tables`` is the one function that decides placement. The storage-aware planner
(``torchrec_mtrains.planner.StorageAwarePlanner``) is not available yet; until it is, a
simple, honest rule stands in for it (see ``plan_tables``). Swapping in the planner is a
change to ``plan_tables`` only: it receives the hardware (a ``TieredTopology``, the
planner's own input type) and returns per-table ``TieredParams`` (None = plain FUSED in
DRAM), which is what the planner's plan carries too.

Hardware profiles: a built-in name (``PROFILES``) or a YAML file::

    name: my-node
    ranks_per_node: 2            # informative; the launch decides the world size
    tiers:                       # per rank; a tier left out is absent
      dram: {capacity_gb: 8}
      scm:  {capacity_gb: 64, path: /mnt/pmem/emb}     # path: where that tier's files go
      ssd:  {capacity_gb: 512, path: /mnt/nvme/emb, read_gb_per_s: 3.0, write_gb_per_s: 2.0}

Bandwidths are optional (defaults: ``_DEFAULT_BANDWIDTH_GB_PER_S``, spec-sheet orders of
magnitude); the rule below uses capacities only, the planner will use the rest.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from torchrec_mtrains import Tier
from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec
from torchrec_mtrains.sharding import TieredParams

__all__ = ["PROFILES", "TableInfo", "load_hardware", "parse_bytes", "plan_tables", "tier_paths"]

GIB = 1 << 30
CACHE_LOAD_FACTOR = 0.1  # cache rows per table row of a tiered table (the suggestion)
ROW_STATE_BYTES = 4  # EXACT_ROWWISE_ADAGRAD: one float32 of optimizer state per row

# (read, write) GB/s per tier: rough spec-sheet figures (DDR5 channel pair, Optane PMem
# 200 interleaved, a PCIe 4 NVMe SSD at 4 KiB random). Used only as the planner's input.
_DEFAULT_BANDWIDTH_GB_PER_S: Dict[Tier, Tuple[float, float]] = {
    Tier.DRAM: (40.0, 30.0),
    Tier.SCM: (6.0, 2.0),
    Tier.SSD: (2.5, 1.5),
}
_ACCESS_BYTES = {Tier.DRAM: 64, Tier.SCM: 256, Tier.SSD: 4096}

# Built-in profiles: per-rank capacities in GiB.
PROFILES: Dict[str, Dict[Tier, float]] = {
    "cpu-node": {Tier.DRAM: 4.0, Tier.SCM: 16.0, Tier.SSD: 256.0},  # DRAM, PMem and NVMe
    "cpu-no-scm": {Tier.DRAM: 4.0, Tier.SSD: 256.0},
    "dram-only": {Tier.DRAM: 4.0},
}
DEFAULT_PROFILE = "cpu-node"


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A table as placement sees it: its name and size."""

    name: str
    num_embeddings: int
    embedding_dim: int

    @property
    def bytes(self) -> int:
        """Weights (float32) plus row-wise optimizer state, as stored on any tier."""
        return self.num_embeddings * (self.embedding_dim * 4 + ROW_STATE_BYTES)


def parse_bytes(text: str) -> int:
    """``"64MiB"``, ``"1.5GB"``, ``"4096"`` -> bytes. ValueError naming the text."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 64MiB, 1.5GB, 4096)")
    unit = m.group(2).upper().rstrip("B").rstrip("I")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return int(float(m.group(1)) * scale)


def _tier_spec(tier: Tier, capacity_gb: float, entry: Mapping) -> TierSpec:
    read, write = _DEFAULT_BANDWIDTH_GB_PER_S[tier]
    return TierSpec(
        capacity_bytes=float(capacity_gb) * GIB,
        read_bytes_per_s=float(entry.get("read_gb_per_s", read)) * 1e9,
        write_bytes_per_s=float(entry.get("write_gb_per_s", write)) * 1e9,
        access_bytes=_ACCESS_BYTES[tier],
    )


def load_hardware(spec: str) -> Tuple[TieredTopology, Dict[Tier, str]]:
    """A profile name or a YAML file -> (topology, tier -> directory for its files).

    Raises:
        ValueError: unknown profile, unreadable or malformed YAML (the message says which).
    """
    if spec in PROFILES:
        tiers = {t: _tier_spec(t, gb, {}) for t, gb in PROFILES[spec].items()}
        topo = TieredTopology(spec, "cpu", 1, tiers, ComputeSpec(tbe_bytes_per_s=10e9), source="built-in profile")
        return topo, {}
    if not spec.endswith((".yaml", ".yml")):
        raise ValueError(f"--hardware {spec!r}: not a profile ({', '.join(PROFILES)}) nor a .yaml file")
    try:
        with open(spec) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--hardware {spec!r}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--hardware {spec!r}: not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tiers"), dict) or not doc["tiers"]:
        raise ValueError(f"--hardware {spec!r}: needs a 'tiers' map (dram/scm/ssd -> {{capacity_gb: ...}})")
    tiers: Dict[Tier, TierSpec] = {}
    paths: Dict[Tier, str] = {}
    for key, entry in doc["tiers"].items():
        try:
            tier = Tier(str(key).lower())
        except ValueError:
            raise ValueError(f"--hardware {spec!r}: unknown tier {key!r} (dram, scm, ssd)") from None
        if tier is Tier.HBM:
            raise ValueError(f"--hardware {spec!r}: tier hbm: this example runs on the CPU")
        if not isinstance(entry, dict) or not isinstance(entry.get("capacity_gb"), (int, float)) \
                or entry["capacity_gb"] < 0:
            raise ValueError(f"--hardware {spec!r}: tier {key}: needs capacity_gb >= 0, got {entry!r}")
        tiers[tier] = _tier_spec(tier, entry["capacity_gb"], entry)
        if entry.get("path"):
            paths[tier] = str(entry["path"])
    name = str(doc.get("name", os.path.basename(spec)))
    topo = TieredTopology(name, "cpu", int(doc.get("ranks_per_node", 1)), tiers,
                          ComputeSpec(tbe_bytes_per_s=10e9), source=spec)
    return topo, paths


def tier_paths(paths: Mapping[Tier, str], storage_dir: str) -> Dict[Tier, str]:
    """Directory of each file-backed tier: the profile's path, else ``storage_dir/<tier>``."""
    return {t: paths.get(t, os.path.join(storage_dir, t.value)) for t in (Tier.SCM, Tier.SSD)}


def _capacity(hardware: TieredTopology, tier: Tier, world_size: int) -> float:
    spec = hardware.tiers.get(tier)
    return 0.0 if spec is None else spec.capacity_bytes * world_size


def plan_tables(
    model_tables: Sequence[TableInfo],
    world_size: int,
    hardware: TieredTopology,
    dram_budget_bytes: int,
    storage_dir: str,
    storage_paths: Optional[Mapping[Tier, str]] = None,
) -> Tuple[Dict[str, Optional[TieredParams]], List[Dict[str, object]]]:
    """Places every table on a tier: table -> TieredParams (None: plain FUSED in DRAM), and
    one summary row per table (table, rows, dim, MiB, tier, cache_rows).

    The stand-in rule (until StorageAwarePlanner replaces this function's body):
      1. DRAM the embeddings may use = ``min(dram_budget_bytes, profile DRAM) * world_size``.
      2. Tables go FUSED into DRAM smallest first while the FUSED tables plus the row caches
         (``CACHE_LOAD_FACTOR`` of each remaining table) fit that budget.
      3. Of the remaining (largest) tables, the larger half goes to SSD, the rest to SCM; a
         table that does not fit the tier's capacity (summed over ranks) moves to the other
         tier, SCM first for the smaller ones.
    Capacities are checked summed over ranks (table-wise sharding spreads tables by size).

    Raises:
        ValueError: the profile cannot hold the model (says how much is missing where).
    """
    if dram_budget_bytes <= 0:
        raise ValueError(f"--dram-budget must be > 0 bytes, got {dram_budget_bytes}")
    dram = min(float(dram_budget_bytes) * world_size, _capacity(hardware, Tier.DRAM, world_size))
    by_size = sorted(model_tables, key=lambda t: (t.bytes, t.name))
    fused: List[TableInfo] = []
    used = 0.0
    for i, table in enumerate(by_size):
        rest_caches = sum(CACHE_LOAD_FACTOR * t.bytes for t in by_size[i + 1:])
        if used + table.bytes + rest_caches > dram:
            break
        fused.append(table)
        used += table.bytes
    tiered = by_size[len(fused):][::-1]  # largest first
    caches = sum(CACHE_LOAD_FACTOR * t.bytes for t in tiered)
    if used + caches > dram:
        raise ValueError(
            f"hardware {hardware.name!r}: the row caches of the tiered tables need {caches / 2**20:,.1f} MiB "
            f"of DRAM, more than the {dram / 2**20:,.1f} MiB the embeddings may use "
            f"(--dram-budget x {world_size} ranks, at most the profile's DRAM)"
        )
    free = {t: _capacity(hardware, t, world_size) for t in (Tier.SCM, Tier.SSD)}
    n_ssd = math.ceil(len(tiered) / 2)
    placed: Dict[str, Tier] = {}
    for i, table in enumerate(tiered):
        order = (Tier.SSD, Tier.SCM) if i < n_ssd else (Tier.SCM, Tier.SSD)
        tier = next((t for t in order if free[t] >= table.bytes), None)
        if tier is None:
            raise ValueError(
                f"hardware {hardware.name!r} cannot hold the model: table {table.name} "
                f"({table.bytes / 2**20:,.1f} MiB) fits neither DRAM (budget) nor the free SCM "
                f"({free[Tier.SCM] / 2**20:,.1f} MiB) or SSD ({free[Tier.SSD] / 2**20:,.1f} MiB) "
                f"over {world_size} ranks; raise --dram-budget or pick a larger profile"
            )
        free[tier] -= table.bytes
        placed[table.name] = tier

    dirs = tier_paths(storage_paths or {}, storage_dir)
    params: Dict[str, Optional[TieredParams]] = {}
    rows: List[Dict[str, object]] = []
    for table in sorted(model_tables, key=lambda t: -t.bytes):
        tier = placed.get(table.name)
        params[table.name] = None if tier is None else TieredParams(
            tier, cache_load_factor=CACHE_LOAD_FACTOR, storage_dir=dirs[tier])
        rows.append({
            "table": table.name, "rows": table.num_embeddings, "dim": table.embedding_dim,
            "MiB": round(table.bytes / 2**20, 1), "tier": "DRAM (fused)" if tier is None else tier.name,
            "cache_rows": 0 if tier is None else math.ceil(CACHE_LOAD_FACTOR * table.num_embeddings),
        })
    return params, rows
