#!/usr/bin/env python3
"""The cache plan of an all-hit batch alone: CPU ns per id with the dense row-to-slot map
against without it (the baseline, the set scan), in the same run.

One table's cache index (``torch.classes.mtrains.KernelCacheIndex``, no TBE, no tier) of
1M slots plans Zipf batches whose rows are all cached once warm; each ``plan_step`` call
returns the CPU time of the C++ plan on its thread (the index and the binding's tensors),
which is what is counted. The two indexes -- map forced on, map forced off -- plan the same
batches in alternating blocks (the machine is shared: neighbouring blocks see the same
load), each block every distinct batch once; the figure of each is the median over blocks
and the ratio is on / off. Every measured plan is checked to load nothing, and the two
indexes to give the same slots.

Cases (``--cases``):
- ``table_1m``: 1M rows, 1M cache slots (every row fits).
- ``table_8m``: 8M rows, 1M cache slots (the map is 32 MB; Zipf's tail spreads the
  batches' rows over a larger table).

Target: ``<= 8 ns/id`` with the map. The rule's verdict for the case (would
``TieredConfig.dense_slot_map=None`` keep the map at ``--row-bytes``?) is printed beside it.

Usage::

    python benchmarks/bench_plan.py [--cases table_1m,table_8m] [--ids N] [--blocks N]
        [--distinct-batches N] [--policy lru|lfu|tinylfu] [--row-bytes B] [--scale F]
        [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np  # noqa: E402
import torch  # noqa: E402

from torchrec_mtrains._ops import load_extension  # noqa: E402
from torchrec_mtrains.slot_map import dense_map_pays  # noqa: E402

TARGET_NS_PER_ID = 8.0
"""The goal for an all-hit batch's plan with the map, at 1M cached rows."""
_DEFAULT_ROW_BYTES = 260  # dim 64 in fp32 with row-wise Adagrad's one state value


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    rows: int
    slots: int


CASES = {c.name: c for c in (Case("table_1m", 1 << 20, 1 << 20), Case("table_8m", 8 << 20, 1 << 20))}


def zipf_batches(rows: int, ids: int, count: int, alpha: float, seed: int) -> List[torch.Tensor]:
    """``count`` batches of ``ids`` Zipf ids in ``[0, rows)``, hot ids scattered over the
    table by a fixed permutation (as ``bench_kernel_cost.zipf_batches``)."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows)
    out = []
    for _ in range(count):
        drawn = np.empty(0, dtype=np.int64)
        while drawn.size < ids:
            draw = rng.zipf(alpha, size=2 * ids)
            drawn = np.concatenate([drawn, draw[draw <= rows] - 1])
        out.append(torch.from_numpy(perm[drawn[:ids]]).long())
    return out


class Planner:
    """One cache index planning steps in order (the step counter is its own)."""

    def __init__(self, case: Case, dense_map: bool, policy: str) -> None:
        self.index = torch.classes.mtrains.KernelCacheIndex([case.slots], [case.rows], [dense_map], 32, policy)
        self.step = 0

    def plan(self, ids: torch.Tensor) -> tuple:
        got = self.index.plan_step(ids, [0, ids.numel()], self.step, self.step - 1, True)
        self.step += 1
        return got

    def block(self, batches: List[torch.Tensor]) -> float:
        """Plans every batch once; CPU ns per id over the block. Raises if a plan loads a row."""
        ns = ids = 0
        for b in batches:
            got = self.plan(b)
            if len(got[1]):
                raise RuntimeError(f"step {self.step - 1} loaded {got[2][0].numel()} rows: not all hits "
                                   "(more warm-up, or a larger cache)")
            ns += got[7]
            ids += b.numel()
        return ns / ids


def run_case(case: Case, args: argparse.Namespace) -> dict:
    batches = zipf_batches(case.rows, args.ids, args.distinct_batches, args.zipf_alpha, args.seed)
    off, on = Planner(case, False, args.policy), Planner(case, True, args.policy)
    for _ in range(args.warmup_rounds):  # fill the caches; the two must agree slot for slot
        for b in batches:
            a, m = off.plan(b), on.plan(b)
            if not torch.equal(a[0], m[0]):
                raise RuntimeError(f"{case.name}: the plans with and without the map differ")
    blocks: Dict[str, List[float]] = {"off": [], "on": []}
    for _ in range(args.blocks):
        blocks["off"].append(off.block(batches))
        blocks["on"].append(on.block(batches))
    off_ns, on_ns = statistics.median(blocks["off"]), statistics.median(blocks["on"])
    distinct = float(np.mean([b.unique().numel() for b in batches]))
    return {
        "case": case.name, "rows": case.rows, "slots": case.slots, "ids_per_batch": args.ids,
        "distinct_rows_per_batch": distinct, "policy": args.policy, "blocks": args.blocks,
        "off_ns_per_id": off_ns, "on_ns_per_id": on_ns, "ratio_on_off": on_ns / off_ns,
        "off_blocks_ns_per_id": blocks["off"], "on_blocks_ns_per_id": blocks["on"],
        "map_bytes": 4 * case.rows, "row_bytes": args.row_bytes,
        "rule_keeps_map": dense_map_pays(case.rows, case.slots, args.row_bytes),
        "target_ns_per_id": TARGET_NS_PER_ID, "pass": on_ns <= TARGET_NS_PER_ID,
    }


def report(r: dict) -> str:
    rule = "keeps" if r["rule_keeps_map"] else "does not keep"
    return (f"{r['case']:<9} {r['rows']:>10,} rows, {r['slots']:,} slots, {r['ids_per_batch']:,} ids "
            f"({r['distinct_rows_per_batch']:,.0f} distinct) a batch, {r['policy']}: "
            f"map off {r['off_ns_per_id']:.2f} ns/id, map on {r['on_ns_per_id']:.2f} ns/id, "
            f"on/off {r['ratio_on_off']:.2f}x  target <= {r['target_ns_per_id']:g} ns/id "
            f"[{'PASS' if r['pass'] else 'MISS'}]\n"
            f"    blocks off {', '.join(f'{x:.2f}' for x in r['off_blocks_ns_per_id'])}; "
            f"on {', '.join(f'{x:.2f}' for x in r['on_blocks_ns_per_id'])}; the rule {rule} the "
            f"{r['map_bytes'] / 2**20:,.1f} MiB map at {r['row_bytes']}-byte rows")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated cases of {', '.join(CASES)}")
    p.add_argument("--ids", type=int, default=1 << 17, help="ids per batch")
    p.add_argument("--blocks", type=int, default=7, help="measured blocks per index (they alternate)")
    p.add_argument("--distinct-batches", type=int, default=8, help="batches generated (each block plans all)")
    p.add_argument("--warmup-rounds", type=int, default=2, help="passes over the batches before measuring")
    p.add_argument("--zipf-alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--policy", default="lru", choices=("lru", "lfu", "tinylfu"))
    p.add_argument("--row-bytes", type=int, default=_DEFAULT_ROW_BYTES,
                   help="row bytes the rule's verdict is printed for (default: dim 64, fp32, row-wise Adagrad)")
    p.add_argument("--scale", type=float, default=1.0, help="scales every case's rows and slots (--quick: 1/32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="small tables and batches, 3 blocks (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.ids, args.blocks, args.distinct_batches, args.scale = 1 << 12, 3, 3, 1 / 32
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown or min(args.blocks, args.ids, args.distinct_batches, args.warmup_rounds) < 1 or args.scale <= 0:
        p.error(f"unknown cases {unknown} (known: {', '.join(CASES)}) or a non-positive --blocks, --ids, "
                "--distinct-batches, --warmup-rounds or --scale")
    load_extension()
    torch.set_num_threads(1)
    print(f"cache plan of all-hit batches, CPU ns per id of the plan's thread ({_cpu_model()})", flush=True)
    results = []
    for name in names:
        case = CASES[name]
        case = Case(name, max(1, int(case.rows * args.scale)), max(1, int(case.slots * args.scale)))
        results.append(run_case(case, args))
        print(report(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
