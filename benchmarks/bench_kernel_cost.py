#!/usr/bin/env python3
"""The tiered kernel's own cost per step, against FBGEMM's CPU TBE with the tables in DRAM.

Each case trains the same batches on FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen``
(every table whole in DRAM: the baseline) and on ``TieredEmbeddingBags`` in blocks that
alternate between the two (the machine is shared: absolute times drift, the ratio of
neighbouring blocks holds), and prints the median ratio of steps/s (ours / FBGEMM), each
side's wall and CPU milliseconds per step (CPU: every thread of the process) and the
case's target.

Cases (``--cases``):
- ``all_hit``: 4 tables of 200K x 32, batch 512, pooling 4, Zipf 1.05, a cache as large as
  each table (all hits once warm), SCM tier, prefetch on. Target >= 0.9x.
- ``mid_scm``: 1 table of 1M x 128, batch 4096, pooling 20, Zipf 1.05, 10% cache, SCM,
  prefetch on. Target >= 0.85x.
- ``one_vs_two_kernels``: the ``all_hit`` tables, two on SCM and two on SSD, as one mixed
  kernel (one TBE) against two kernels of one tier each. Reports the ratio (no target).
- ``dram_table_joins``: three SCM tables (10% cache) plus one table whole in DRAM, the DRAM
  table either in the same kernel (DRAM tier, cache as large as the table) or in a FUSED
  FBGEMM TBE beside it. Reports which is faster.

Usage::

    python benchmarks/bench_kernel_cost.py [--cases all_hit,mid_scm,...] [--blocks N]
        [--block-steps N] [--dir DIR] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import numpy as np  # noqa: E402
import torch  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from torchrec_mtrains import Tier  # noqa: E402
from torchrec_mtrains.kernels import TieredEmbeddingBags  # noqa: E402

Batch = Tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    tables: Tuple[Tuple[int, int], ...]  # (rows, dim)
    batch: int
    pooling: int
    target: Optional[float]  # ours / baseline steps/s, at least


CASES: Dict[str, Case] = {
    "all_hit": Case("all_hit", ((200_000, 32),) * 4, 512, 4, 0.9),
    "mid_scm": Case("mid_scm", ((1_000_000, 128),), 4096, 20, 0.85),
    "one_vs_two_kernels": Case("one_vs_two_kernels", ((200_000, 32),) * 4, 512, 4, None),
    "dram_table_joins": Case("dram_table_joins", ((200_000, 32),) * 4, 512, 4, None),
}


def zipf_batches(case: Case, count: int, alpha: float, seed: int) -> List[Batch]:
    """``count`` batches (indices table-major, T * B + 1 offsets) of Zipf ids per table,
    hot ids scattered over the table by a fixed permutation."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(rows) for rows, _ in case.tables]
    n = case.batch * case.pooling
    out = []
    for _ in range(count):
        parts = []
        for (rows, _), perm in zip(case.tables, perms):
            ids = np.empty(0, dtype=np.int64)
            while ids.size < n:
                draw = rng.zipf(alpha, size=2 * n)
                ids = np.concatenate([ids, draw[draw <= rows] - 1])
            parts.append(perm[ids[:n]])
        indices = torch.from_numpy(np.concatenate(parts)).long()
        offsets = torch.arange(0, len(case.tables) * n + 1, case.pooling, dtype=torch.long)
        out.append((indices, offsets))
    return out


def fbgemm(tables: Sequence[Tuple[int, int]], lr: float) -> SplitTableBatchedEmbeddingBagsCodegen:
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in tables],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=lr)


# --stage-threads: the tiered kernels' prefetch_pipeline (None: the kernel's own choice).
STAGE_THREADS: List[Optional[bool]] = [None]


def tiered(tables: Sequence[Tuple[int, int]], tier, cache_rows, directory: str, lr: float) -> TieredEmbeddingBags:
    return TieredEmbeddingBags(list(tables), tier=tier, cache_rows=cache_rows, storage_dir=directory,
                               learning_rate=lr, prefetch_pipeline=STAGE_THREADS[0])


class Trainer:
    """Runs steps of one or more kernels, each on its tables' slice of the batch, with the
    next batch prefetched by the tiered ones (as TorchRec's train pipeline does)."""

    def __init__(self, kernels: List[Tuple[torch.nn.Module, List[int]]], num_tables: int, batch: int) -> None:
        self.kernels = kernels
        self.num_tables, self.batch = num_tables, batch
        # Wall seconds of each phase over the measured steps (where the step's time goes).
        self.phase_seconds = {"prefetch": 0.0, "forward": 0.0, "backward": 0.0}
        self.steps_timed = 0

    def _slice(self, b: Batch, tables: List[int]) -> Batch:
        if len(tables) == self.num_tables:
            return b
        indices, offsets = b
        per_table = self.batch
        parts, lengths = [], []
        for t in tables:
            lo, hi = int(offsets[t * per_table]), int(offsets[(t + 1) * per_table])
            parts.append(indices[lo:hi])
            lengths.append(torch.diff(offsets[t * per_table:(t + 1) * per_table + 1]))
        lens = torch.cat(lengths)
        return torch.cat(parts), torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)])

    def run(self, batches: List[Batch], steps: int, start: int) -> None:
        """``steps`` training steps from batch ``start``; the block's last step prefetches
        nothing, so the next block (maybe another system's) starts with no plan queued."""
        sliced = [[self._slice(batches[(start + i) % len(batches)], ts) for _, ts in self.kernels]
                  for i in range(steps)]
        phase = self.phase_seconds
        for i in range(steps):
            outs = []
            for k, (module, _) in enumerate(self.kernels):
                t0 = time.perf_counter()
                if isinstance(module, TieredEmbeddingBags):
                    if i == 0:
                        module.prefetch(*sliced[0][k])
                    if i + 1 < steps:
                        module.prefetch(*sliced[i + 1][k])
                t1 = time.perf_counter()
                outs.append(module(*sliced[i][k]))
                phase["prefetch"] += t1 - t0
                phase["forward"] += time.perf_counter() - t1
            t2 = time.perf_counter()
            torch.cat(outs, dim=1).sum().backward()
            phase["backward"] += time.perf_counter() - t2
        self.steps_timed += steps


def measure(systems: Dict[str, Trainer], batches: List[Batch], warmup: int, blocks: int,
            block_steps: int) -> Dict[str, Dict[str, List[float]]]:
    """Alternating blocks of every system; per system the wall and CPU seconds per step of
    each block."""
    out: Dict[str, Dict[str, List[float]]] = {name: {"wall": [], "cpu": []} for name in systems}
    for name, trainer in systems.items():
        trainer.run(batches, warmup, 0)
        trainer.phase_seconds = dict.fromkeys(trainer.phase_seconds, 0.0)
        trainer.steps_timed = 0
    step = warmup
    for b in range(blocks):
        order = list(systems.items()) if b % 2 == 0 else list(reversed(systems.items()))
        for name, trainer in order:
            c0, w0 = time.process_time(), time.perf_counter()
            trainer.run(batches, block_steps, step)
            out[name]["wall"].append((time.perf_counter() - w0) / block_steps)
            out[name]["cpu"].append((time.process_time() - c0) / block_steps)
        step += block_steps
    return out


def ratio(times: Dict[str, Dict[str, List[float]]], ours: str, base: str) -> float:
    """Median over blocks of base seconds / ours seconds (steps/s of ours over base)."""
    return statistics.median(b / o for b, o in zip(times[base]["wall"], times[ours]["wall"]))


def systems_of(case: Case, directory: str, lr: float) -> Tuple[Dict[str, Trainer], str, str]:
    """The systems a case compares: (systems, ours, baseline)."""
    T = len(case.tables)
    all_tables = list(range(T))

    def one(module: torch.nn.Module) -> Trainer:
        return Trainer([(module, all_tables)], T, case.batch)

    if case.name == "all_hit":
        return ({"fbgemm": one(fbgemm(case.tables, lr)),
                 "tiered": one(tiered(case.tables, Tier.SCM, [r for r, _ in case.tables], directory, lr))},
                "tiered", "fbgemm")
    if case.name == "mid_scm":
        return ({"fbgemm": one(fbgemm(case.tables, lr)),
                 "tiered": one(tiered(case.tables, Tier.SCM, [r // 10 for r, _ in case.tables], directory, lr))},
                "tiered", "fbgemm")
    cache = [r // 10 for r, _ in case.tables]
    if case.name == "one_vs_two_kernels":
        mixed = tiered(case.tables, (Tier.SCM, Tier.SCM, Tier.SSD, Tier.SSD), cache, f"{directory}/mixed", lr)
        scm = tiered(case.tables[:2], Tier.SCM, cache[:2], f"{directory}/scm", lr)
        ssd = tiered(case.tables[2:], Tier.SSD, cache[2:], f"{directory}/ssd", lr)
        return ({"two_kernels": Trainer([(scm, [0, 1]), (ssd, [2, 3])], T, case.batch),
                 "one_kernel": one(mixed)}, "one_kernel", "two_kernels")
    if case.name == "dram_table_joins":
        rows_dram = case.tables[3][0]
        joined = tiered(case.tables, (Tier.SCM, Tier.SCM, Tier.SCM, Tier.DRAM), cache[:3] + [rows_dram],
                        f"{directory}/joined", lr)
        scm = tiered(case.tables[:3], Tier.SCM, cache[:3], f"{directory}/beside", lr)
        fused = fbgemm(case.tables[3:], lr)
        return ({"fused_beside": Trainer([(scm, [0, 1, 2]), (fused, [3])], T, case.batch),
                 "dram_joins": one(joined)}, "dram_joins", "fused_beside")
    raise ValueError(f"unknown case {case.name!r}; cases: {', '.join(CASES)}")


def run_case(case: Case, args: argparse.Namespace, directory: str) -> dict:
    batches = zipf_batches(case, args.distinct_batches, args.zipf_alpha, args.seed)
    systems, ours, base = systems_of(case, directory, args.learning_rate)
    times = measure(systems, batches, args.warmup_steps, args.blocks, args.block_steps)
    r = ratio(times, ours, base)
    result = {
        "case": case.name, "ours": ours, "baseline": base, "ratio": r, "target": case.target,
        "pass": None if case.target is None else r >= case.target,
        "ms_per_step": {n: 1e3 * statistics.median(t["wall"]) for n, t in times.items()},
        "cpu_ms_per_step": {n: 1e3 * statistics.median(t["cpu"]) for n, t in times.items()},
        # Mean wall ms of each phase a step, over the measured blocks: where the time goes.
        "phase_ms_per_step": {n: {k: 1e3 * v / max(1, t.steps_timed) for k, v in t.phase_seconds.items()}
                              for n, t in systems.items()},
    }
    for trainer in systems.values():
        for module, _ in trainer.kernels:
            if isinstance(module, TieredEmbeddingBags):
                stats = module.cache_stats()
                result.setdefault("hit_rate", {}).update({f"{ours if trainer is systems[ours] else base}."
                                                          f"{k}": v["hit_rate"] for k, v in stats.items()})
                module.close()
    return result


def report(r: dict) -> str:
    verdict = "" if r["target"] is None else f"  target >= {r['target']}x  [{'PASS' if r['pass'] else 'MISS'}]"
    times = ", ".join(f"{n} {r['ms_per_step'][n]:.2f} ms ({r['cpu_ms_per_step'][n]:.2f} ms CPU)"
                      for n in r["ms_per_step"])
    phases = "; ".join(f"{n} " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items())
                       for n, ph in r["phase_ms_per_step"].items())
    return (f"{r['case']:<20} {r['ours']} / {r['baseline']} steps/s = {r['ratio']:.2f}x{verdict}\n"
            f"    per step: {times}\n    phases (ms a step): {phases}")


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="all_hit,mid_scm,one_vs_two_kernels,dram_table_joins",
                   help=f"comma-separated cases of {', '.join(CASES)}")
    p.add_argument("--blocks", type=int, default=8, help="measured blocks per system (they alternate)")
    p.add_argument("--block-steps", type=int, default=40, help="steps per block")
    p.add_argument("--warmup-steps", type=int, default=60, help="steps per system before measuring")
    p.add_argument("--distinct-batches", type=int, default=50, help="batches generated (cycled)")
    p.add_argument("--zipf-alpha", type=float, default=1.05, help="Zipf exponent of the ids")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, default=None, help="where the SCM/SSD files go (a temporary dir)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="few short blocks (a smoke run)")
    p.add_argument("--stage-threads", choices=("auto", "on", "off"), default="auto",
                   help="the tiered kernels' step stages on threads (on), inline (off), or as the kernel picks")
    args = p.parse_args(argv)
    STAGE_THREADS[0] = {"auto": None, "on": True, "off": False}[args.stage_threads]
    if args.quick:
        args.blocks, args.block_steps, args.warmup_steps, args.distinct_batches = 2, 5, 5, 8
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown or args.blocks < 1 or args.block_steps < 1:
        p.error(f"unknown cases {unknown} (known: {', '.join(CASES)}) or non-positive --blocks/--block-steps")
    torch.manual_seed(args.seed)
    results = []
    for name in names:
        with tempfile.TemporaryDirectory(dir=args.dir, prefix=f"kernel_cost_{name}_") as d:
            results.append(run_case(CASES[name], args, d))
        print(report(results[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
