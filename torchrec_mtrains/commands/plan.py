"""``mtrains plan``: place a model on a hardware profile and size the cluster it needs,
with all four tiers and with HBM + DRAM only.

The printed table has one row per kind of table: tables *alike* -- equal in every field of
their report entry but the name (rows, dim, bytes, tier, cache rows, predicted hit rate,
tier bandwidth, unique rows per step) -- share one row, named by their names' common
prefix and their count (``small_* (x400)``). ``--all-tables`` prints one row per table;
``--json`` always lists every table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

from torchrec_mtrains.planner.hardware.topology import load_topology
from torchrec_mtrains.planner.model.model_spec import ModelSpec, load_model_spec
from torchrec_mtrains.planner.model.sizing import plan_report

__all__ = ["alike_groups", "main"]


_NAME_WIDTH = 23  # characters of the table column


def _gib(b: float) -> str:
    return f"{b / 2**30:,.1f} GiB"


def alike_groups(tables: List[Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
    """(label, first table) per group of alike tables (module docstring), largest first and
    otherwise in report order; a group of one is labelled by its name."""
    groups: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for t in sorted(tables, key=lambda t: -t["bytes"]):
        groups.setdefault(tuple(sorted((k, v) for k, v in t.items() if k != "name")), []).append(t)
    return [(_label([t["name"] for t in members]), members[0]) for members in groups.values()]


def _label(names: List[str], width: int = _NAME_WIDTH) -> str:
    """``prefix* (xN)`` of a group's names (``first +N alike`` when they share no prefix),
    within ``width`` characters: a long prefix is cut, the count is kept."""
    if len(names) == 1:
        return names[0][:width]
    prefix = os.path.commonprefix(names)
    suffix = f"* (x{len(names)})" if prefix else f" +{len(names) - 1} alike"
    return (prefix or names[0])[: max(1, width - len(suffix))] + suffix


def _print(report: Dict[str, Any], out=None, all_tables: bool = False) -> None:
    w = (out or sys.stdout).write
    w(f"model: {len(report['tables'])} tables, {_gib(report['embedding_bytes'])} of embeddings; batch "
      f"{report['batch_size']:,}, target {report['target_qps']:,.0f} QPS; hardware {report['hardware']}\n\n")
    rows = ([(t["name"], t) for t in sorted(report["tables"], key=lambda t: -t["bytes"])] if all_tables
            else alike_groups(report["tables"]))
    if len(rows) < len(report["tables"]):
        w(f"{len(report['tables'])} tables in {len(rows)} rows: alike tables (all figures equal) share one, "
          "'name_* (xN)'; --all-tables lists each\n")
    w(f"{'table':<24}{'rows':>14}{'dim':>5}{'size':>13}  {'tier':<5}{'cache rows':>12}{'hit rate':>9}{'tier GB/s':>10}\n")
    for label, t in rows:
        w(f"{label[:_NAME_WIDTH]:<24}{t['num_embeddings']:>14,}{t['embedding_dim']:>5}{_gib(t['bytes']):>13}  "
          f"{t['tier']:<5}{t['cache_rows']:>12,}{t['hit_rate']:>9.1%}{t['bandwidth_bytes_per_s'] / 1e9:>10.2f}\n")
    w("\nper node:\n")
    for tier, u in report["tier_use_per_node"].items():
        w(f"  {tier:<5} {_gib(u['used_bytes']):>14} of {_gib(u['capacity_bytes']):>14}\n")
    w(f"\nnodes with all tiers:       {report['nodes']:,} ({report['ranks']:,} ranks), predicted "
      f"{report['predicted_qps']:,.0f} QPS\n")
    if report["nodes_hbm_ddr_only"] is not None:
        w(f"nodes with HBM + DRAM only: {report['nodes_hbm_ddr_only']:,}, predicted "
          f"{report['predicted_qps_hbm_ddr_only']:,.0f} QPS\n")
        w(f"node ratio (HBM+DRAM only / all tiers): {report['node_ratio']:.2f}x\n")
    else:
        w(f"HBM + DRAM only: {report['hbm_ddr_only_error']}\n")


def _plot(report: Dict[str, Any], model: ModelSpec, directory: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(directory, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # One curve per kind of table (tables of one `count:` entry share theirs), largest first.
    kinds: Dict[tuple, List[Any]] = {}
    for t in sorted(model.tables, key=lambda t: -t.bytes):
        key = (t.num_embeddings, t.pooling_factor, tuple(np.round(t.locality.lru_hit_rate[::16], 6)))
        kinds.setdefault(key, []).append(t)
    for tables in list(kinds.values())[:8]:
        t = tables[0]
        frac = t.locality.cache_rows / t.num_embeddings
        label = t.name + (f" (and {len(tables) - 1} alike)" if len(tables) > 1 else "")
        ax.semilogx(frac * 100, t.locality.lru_hit_rate * 100, label=label)
    ax.set(xlabel="cache size (% of the table's rows)", ylabel="predicted LRU hit rate (%)",
           title="Hit-rate curves of the largest kinds of table")
    ax.legend(fontsize=7)
    paths.append(os.path.join(directory, "hit_rate_curves.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    tiers = list(report["tier_use_per_node"])
    used = [report["tier_use_per_node"][t]["used_bytes"] / 2**30 for t in tiers]
    cap = [report["tier_use_per_node"][t]["capacity_bytes"] / 2**30 for t in tiers]
    x = np.arange(len(tiers))
    ax.bar(x - 0.2, cap, 0.4, label="capacity", color="#cccccc")
    ax.bar(x + 0.2, used, 0.4, label="used")
    ax.set_xticks(x, tiers)
    ax.set(ylabel="GiB per node", yscale="log", title=f"Placement on {report['nodes']} nodes")
    ax.legend()
    paths.append(os.path.join(directory, "placement.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    return paths


def main(argv: Optional[List[str]] = None) -> int:
    """``mtrains plan``: see the module docstring. Exit code 2 on bad input."""
    parser = argparse.ArgumentParser(prog="mtrains plan", description=__doc__)
    parser.add_argument("--model", required=True, help="MODEL.yaml (batch_size, target_qps, dtype, optimizer, tables)")
    parser.add_argument("--hardware", required=True, help="a hardware YAML or a shipped profile (local, gpu-scm-node)")
    parser.add_argument("--target-qps", type=float, help="override the model's target_qps")
    parser.add_argument("--max-nodes", type=int, default=100_000, help="largest cluster to consider")
    parser.add_argument("--policy", choices=("lru", "lfu", "tinylfu"), default="lru",
                        help="cache policy of the predictions (tinylfu is predicted with the LFU curve)")
    parser.add_argument("--all-tables", action="store_true",
                        help="one row per table (default: alike tables share a row, 'name_* (xN)')")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (every table)")
    parser.add_argument("--plot", metavar="DIR", help="write hit-rate and placement plots (PNG) into DIR")
    args = parser.parse_args(argv)
    try:
        topo = load_topology(args.hardware)
        model = load_model_spec(args.model)
        if args.target_qps is not None:
            if not args.target_qps > 0:
                raise ValueError(f"--target-qps={args.target_qps} must be > 0")
            model = dataclasses.replace(model, target_qps=args.target_qps)
    except (ValueError, OSError) as e:
        print(f"mtrains plan: error: {e}", file=sys.stderr)
        return 2
    try:
        report = plan_report(model, topo, args.max_nodes, args.policy)
    except ValueError as e:  # the model and this hardware together: name both
        print(f"mtrains plan: error: {args.model} on {args.hardware}: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        _print(report, all_tables=args.all_tables)
    if args.plot:
        for path in _plot(report, model, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0
