"""Where the example's tables go: the storage-aware planner on a hardware profile.

``--hardware`` is a profile of ``torchrec_mtrains.planner.load_topology``: ``local`` (this
kind of machine, measured by ``mtrains probe-hw``) or a YAML file of the same schema
(``mtrains probe-hw --out my-node.yaml`` writes one). The planner
(``StorageAwarePlanner``) places every table on DRAM (plain FUSED), SCM or SSD with a cache
size, within ``--dram-budget`` per rank for the embeddings (whole DRAM tables plus row
caches), from each table's locality (the synthetic data's reuse histogram, shares of lookups
by reuse count, or Zipf law), and spreads
the tables over the ranks.

A job of several nodes (torchrun's ``LOCAL_WORLD_SIZE`` ranks on each) is planned on nodes of
that many ranks (``node_of``): the profile's per-rank figures hold for every rank, wherever
it runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingType

from torchrec_mtrains import Tier
from torchrec_mtrains.planner import (
    PlacementError,
    StorageAwarePlanner,
    TieredTopology,
    load_topology,
)
from torchrec_mtrains.planner.hardware.units import parse_size

__all__ = ["DEFAULT_PROFILE", "TableInfo", "check_fits", "is_tiered", "load_hardware", "make_planner", "node_of",
           "parse_bytes", "placement_rows", "tier_of"]

DEFAULT_PROFILE = "local"


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """A table as the planner sees it: size and locality (MODEL.yaml's table keys)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    locality: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"pooling_factor": 1.0, "zipf_alpha": 1.05})
    # A virtual table (--virtual-tables): ``num_embeddings`` is its id space, ``source_rows``
    # the rows its ids come from (its initial weights' range, as the dense table's).
    virtual: bool = False
    source_rows: int = 0


def parse_bytes(text: str, flag: str = "size") -> int:
    """``"64MiB"`` (64 x 2^20), ``"1.5GB"`` (1.5e9), ``"4096"`` -> bytes, by the planner's
    size parser (``parse_size``: SI units are powers of 1000, IEC ones powers of 1024).
    ValueError naming ``flag`` and the text."""
    return int(parse_size(text, flag, bare_bytes=True))


def load_hardware(spec: str) -> TieredTopology:
    """A profile name or YAML path -> the topology; ValueError if unusable here."""
    topo = load_topology(spec)
    if topo.compute_device != "cpu":
        raise ValueError(
            f"--hardware {spec!r} is a {topo.compute_device} node; the tiered kernel runs on the CPU in this "
            "build (use `mtrains plan` to size such a cluster)"
        )
    return topo


def node_of(hardware: TieredTopology, ranks_per_node: int) -> TieredTopology:
    """``hardware`` as a node of ``ranks_per_node`` ranks (the job's local world size).

    The profile's figures are per rank (capacities, bandwidths, cores per rank) and stay so:
    only the node's shape changes, so that a job of ``world_size`` ranks is planned on
    ``world_size / ranks_per_node`` nodes. Raises ValueError if ``ranks_per_node`` < 1.
    """
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks per node must be an integer >= 1, got {ranks_per_node!r}")
    if ranks_per_node == hardware.ranks_per_node:
        return hardware
    cores = hardware.cores_per_node
    if cores is not None:
        cores = cores * ranks_per_node / hardware.ranks_per_node  # the same cores per rank
        cores = int(cores) if cores == int(cores) else cores
    return dataclasses.replace(hardware, ranks_per_node=ranks_per_node, cores_per_node=cores)


def make_planner(
    hardware: TieredTopology,
    tables: Sequence[TableInfo],
    world_size: int,
    batch_size_per_rank: int,
    dram_budget_bytes: int,
    storage_dir: Optional[str],
    target_qps: Optional[float] = None,
    scm_budget_bytes: Optional[int] = None,
    ranks_per_node: Optional[int] = None,
    input_s_per_sample: float = 0.0,
    row_wise: Sequence[str] = (),
    lookahead: Optional[int] = None,
) -> StorageAwarePlanner:
    """The example's planner: the embeddings within ``dram_budget_bytes`` of DRAM per rank
    and, when given, ``scm_budget_bytes`` of SCM per rank (the rest goes to SSD), on nodes
    of ``ranks_per_node`` ranks (``node_of``; default: the profile's); the input pipeline
    costs ``input_s_per_sample`` of a rank's CPU per sample; the tables ``row_wise`` names
    are sharded row-wise (TorchRec's ParameterConstraints); ``lookahead``: the tiered tables'
    look-ahead window (None: the plan picks it)."""
    if dram_budget_bytes <= 0:
        raise ValueError(f"--dram-budget must be > 0 bytes, got {dram_budget_bytes}")
    if scm_budget_bytes is not None and scm_budget_bytes < 0:
        raise ValueError(f"--scm-budget must be >= 0 bytes, got {scm_budget_bytes}")
    budget = {Tier.DRAM: float(dram_budget_bytes) * world_size}
    if scm_budget_bytes is not None:
        budget[Tier.SCM] = float(scm_budget_bytes) * world_size
    if ranks_per_node is not None:
        hardware = node_of(hardware, ranks_per_node)
    return StorageAwarePlanner(
        hardware,
        batch_size=batch_size_per_rank * world_size,
        world_size=world_size,
        target_qps=target_qps,
        locality={t.name: dict(t.locality) for t in tables},
        budget_bytes=budget,
        storage_dir=storage_dir,
        input_s_per_sample=input_s_per_sample,
        constraints={name: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value]) for name in row_wise},
        lookahead=lookahead,
    )


def check_fits(planner: StorageAwarePlanner, ebc: nn.Module, dram_budget: str) -> None:
    """Raises ValueError (for exit code 2) when the profile cannot hold the model."""
    try:
        planner.place(ebc)
    except PlacementError as e:
        raise ValueError(f"the hardware cannot hold the model with --dram-budget {dram_budget}: {e}") from None


def placement_rows(planner: StorageAwarePlanner) -> List[Dict[str, object]]:
    """One summary row per table of the planner's last plan, largest first."""
    p, model = planner.last_placement, planner.last_model
    rows = []
    for t in sorted(model.tables, key=lambda t: -t.bytes):
        where = p.tables[t.name]
        assign = planner.last_assignment.get(t.name)
        fused = where.tier is Tier.DRAM and where.cache_rows == 0 and not t.virtual
        tier = "DRAM (fused)" if fused else where.tier.name + (" (virtual)" if t.virtual else "")
        rows.append({  # a virtual table's rows: the live ids it is planned for
            "table": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim, "MiB": round(t.bytes / 2**20, 1),
            "tier": tier, "cache_rows": where.cache_rows,
            "pred_hit": "-" if fused else f"{where.hit_rate:.3f}",
            "ranks": "-" if assign is None else ",".join(map(str, assign.ranks)),
        })
    return rows


def tier_of(planner: StorageAwarePlanner) -> Dict[str, str]:
    """table -> tier name ("DRAM" for plain FUSED tables and DRAM-tier tables alike)."""
    return {name: t.tier.name for name, t in planner.last_placement.tables.items()}


def is_tiered(planner: StorageAwarePlanner, name: str) -> bool:
    """Whether the table runs on the tiered kernel (a virtual table always does)."""
    t = planner.last_placement.tables[name]
    virtual = any(m.virtual for m in planner.last_model.tables if m.name == name)
    return virtual or not (t.tier is Tier.DRAM and t.cache_rows == 0)
