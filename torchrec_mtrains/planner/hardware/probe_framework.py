"""The training framework's own cost per step for ``mtrains probe-hw``: what a TorchRec
training step costs beyond its embedding lookups and dense layers (the sharded collection's
input and output distribution, the KeyedJaggedTensor handling, the interaction and loss,
DDP's gradient reduction, the train pipeline).

A subprocess (its own one-rank gloo process group, so the caller's is untouched) trains
TorchRec's DLRM through ``DistributedModelParallel`` with ``TieredEmbeddingBagCollectionSharder``
and ``TieredTrainPipeline`` on prepared batches, with few and with many small tables whole
in DRAM. The step's time (``timing.step_clock``) less what the profile's TBE and dense
figures cost gives the fixed cost per step (``framework_step_s``) and per table
(``framework_table_s``) by a fit over the two table counts.

The subprocess is ``WORKER`` (``python -m WORKER TABLES BATCH STEPS`` prints the median
step seconds): it builds the model with the planner and the sharder, which sit above this
package.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Callable, Dict, List, Tuple

__all__ = ["framework_costs"]

WORKER = "torchrec_mtrains.commands.framework_step"
TABLE_COUNTS = (2, 12)
BATCH = 512
ROWS = 1000
DIM = 32
DENSE_IN = 13
DENSE_MLP = (128, DIM)
OVER_MLP = (256, 128, 1)


def over_in(tables: int) -> int:
    """The over arch's input width: the dense output and the pairwise dot products."""
    return DIM + (tables + 1) * tables // 2


def _run(tables: int, batch: int, steps: int) -> float:
    proc = subprocess.run([sys.executable, "-m", WORKER, str(tables), str(batch), str(steps)],
                          capture_output=True, text=True, check=False, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the framework probe ({tables} tables) failed: {proc.stderr.strip()[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def framework_costs(steps: int, modeled: Callable[[int, int], float]) -> Tuple[Dict[str, float], Dict[str, str]]:
    """``framework_step_s`` and ``framework_table_s`` and a note per YAML key.

    Args:
        steps: timed steps per table count.
        modeled: ``modeled(tables, batch)`` -> the seconds the profile's other figures
            (TBE, dense layers) give such a step; the rest is the framework's.
    """
    rest: List[Tuple[int, float, float]] = []
    for tables in TABLE_COUNTS:
        t = _run(tables, BATCH, steps)
        rest.append((tables, t, t - modeled(tables, BATCH)))
    (k1, _, r1), (k2, _, r2) = rest
    per_table = max(0.0, (r2 - r1) / (k2 - k1))
    per_step = max(0.0, r1 - per_table * k1)
    seen = "; ".join(f"{k} tables: {t * 1e3:.2f} ms, {r * 1e3:.2f} ms beyond TBE and dense" for k, t, r in rest)
    what = (f"TorchRec DLRM (dense {DENSE_IN}-{'-'.join(map(str, DENSE_MLP))}, over "
            f"{'-'.join(map(str, OVER_MLP))}) trained through DistributedModelParallel + TieredTrainPipeline, "
            f"1 rank, batch {BATCH}, tables of {ROWS:,} x {DIM} whole in DRAM, one id per sample each: {seen}")
    return {"framework_step_s": per_step, "framework_table_s": per_table}, {
        "framework_step_cost": "fixed per step and rank; " + what,
        "framework_table_cost": "per table of the model and step (each rank handles every feature of its batch); "
                                "see framework_step_cost",
    }
