"""The training framework's own cost per step for ``mtrains probe-hw``: what a TorchRec
training step costs beyond its embedding lookups and dense layers (the sharded collection's
input and output distribution, the KeyedJaggedTensor handling, the interaction and loss,
DDP's gradient reduction, the train pipeline).

Subprocesses (a gloo job of their own, so the caller's process group is untouched: as many
ranks as a node runs, since the ranks' collectives and their sharing of the node's cores are
the framework's cost too) train TorchRec's DLRM through ``DistributedModelParallel`` with ``TieredEmbeddingBagCollectionSharder``
and ``TieredTrainPipeline`` on prepared batches, with few and with many small tables whole
in DRAM. The step's time (``timing.step_clock``) less what the profile's TBE and dense
figures cost gives the fixed cost per step (``framework_step_s``) and per table by a fit
over the two table counts; the many-table job again at ``LARGE_BATCH`` splits the per-table
cost into a fixed part (``framework_table_s``) and a part per sample
(``framework_table_sample_s``): a table's slice of the input, its pooled output and the
interaction's share grow with the batch (at batch 512 the per-table cost was 278 us, at
2,048 953 us, so a figure taken at one batch misjudged the other by 3x). The same job with
tables of ``WIDE_DIM`` takes from that per-sample part what grows with a pooled output's
bytes (``framework_output_byte_s``: the output all-to-all and the interaction move 4x the
bytes at dimension 128 as at 32). Ranks sharing a
node's cores make single jobs jittery (one job's median step of the same model moved 2x
between back-to-back runs on an idle 2-core VM), so the jobs alternate ``REPEATS`` times
and each one's median is fitted.

With more than one rank, ``row_wise_group_cost`` times the many-table job with none, a few
and several of its tables row-wise (``ROW_WISE_COUNTS``: one sharding group, whose
collectives every rank joins each step), alternating: the line through the medians of the
two row-wise counts gives what each row-wise table adds (``row_wise_group_s``, its slope)
and what the group costs once it exists (``row_wise_setup_s``, its excess over the
table-wise job at none). A one-table probe cannot tell the two apart, and its difference of
two noisy jobs spread 4.4x between probes.

Each subprocess is ``WORKER`` (``python -m WORKER TABLES BATCH STEPS RANK WORLD PORT`` prints
its median step seconds; the slowest rank's is the job's): it builds the model with the planner and the sharder, which sit above this
package.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Tuple

__all__ = ["framework_costs", "row_wise_group_cost"]

WORKER = "torchrec_mtrains.commands.framework_step"
TABLE_COUNTS = (2, 12)
ROW_WISE_COUNTS = (0, 2, 6)  # of the TABLE_COUNTS[1] tables
REPEATS = 3
BATCH = 512
LARGE_BATCH = 2048
ROWS = 1000
DIM = 32
WIDE_DIM = 128
DENSE_IN = 13
DENSE_HIDDEN = 128
OVER_MLP = (256, 128, 1)


def dense_mlp(dim: int = DIM) -> Tuple[int, ...]:
    """The dense arch's layer widths after its input: its output is as wide as the tables."""
    return (DENSE_HIDDEN, dim)


def over_in(tables: int, dim: int = DIM) -> int:
    """The over arch's input width: the dense output and the pairwise dot products."""
    return dim + (tables + 1) * tables // 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tables: int, batch: int, steps: int, ranks: int, row_wise: int = 0, dim: int = DIM) -> float:
    """The slowest rank's median step seconds of a ``ranks``-rank job (its first
    ``row_wise`` tables sharded row-wise; tables of ``dim``)."""
    args = [sys.executable, "-m", WORKER, str(tables), str(batch), str(steps)]
    port = _free_port() if ranks > 1 else 0
    procs = [subprocess.Popen(args + [str(r), str(ranks), str(port), str(row_wise), str(dim)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    medians = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"the framework probe ({tables} tables, {ranks} ranks) failed: {err.strip()[-2000:]}")
            medians.append(float(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return max(medians)


def framework_costs(steps: int, modeled: Callable[[int, int, int], float],
                    ranks: int = 1, repeats: int = REPEATS) -> Tuple[Dict[str, float], Dict[str, str]]:
    """``framework_step_s``, ``framework_table_s``, ``framework_table_sample_s`` and
    ``framework_output_byte_s`` and a note per YAML key.

    Args:
        steps: timed steps per job.
        modeled: ``modeled(tables, batch, dim)`` -> the seconds the profile's other figures
            (TBE, dense layers) give such a step; the rest is the framework's.
        ranks: the job's ranks, all on this node (the profile's ranks per node).
        repeats: jobs per case (alternating); each case's median job is fitted.
    """
    k1, k2 = TABLE_COUNTS
    jobs = [(k1, BATCH, DIM), (k2, BATCH, DIM), (k2, LARGE_BATCH, DIM), (k2, LARGE_BATCH, WIDE_DIM)]
    runs: Dict[Tuple[int, int, int], List[float]] = {job: [] for job in jobs}
    for _ in range(max(1, repeats)):
        for tables, batch, dim in jobs:
            runs[(tables, batch, dim)].append(_run(tables, batch, steps, ranks, dim=dim))
    rest: List[Tuple[Tuple[int, int, int], float, float]] = []
    for job in jobs:
        t = statistics.median(runs[job])
        rest.append((job, t, t - modeled(*job)))
    (_, _, r1), (_, _, r2), (_, _, r3), (_, _, r4) = rest
    per_table_at_batch = max(0.0, (r2 - r1) / (k2 - k1))
    per_step = max(0.0, r1 - per_table_at_batch * k1)
    # What the wider tables add beyond the model, per byte of a sample's pooled outputs.
    per_byte = max(0.0, (r4 - r3) / (k2 * LARGE_BATCH * 4 * (WIDE_DIM - DIM)))
    # What the larger batch adds beyond the model, put on the tables (the fixed per-step
    # part does not grow with the batch), less its bytes' share.
    per_sample = max(0.0, (r3 - r2) / (k2 * (LARGE_BATCH - BATCH)) - per_byte * 4 * DIM)
    per_table = max(0.0, per_table_at_batch - (per_sample + per_byte * 4 * DIM) * BATCH)
    seen = "; ".join(f"{k} tables of {d} at batch {b}: {t * 1e3:.2f} ms (median of {len(runs[(k, b, d)])} jobs: "
                     f"{', '.join(f'{x * 1e3:.1f}' for x in runs[(k, b, d)])}), {r * 1e3:.2f} ms beyond TBE and dense"
                     for (k, b, d), t, r in rest)
    what = (f"TorchRec DLRM (dense {DENSE_IN}-{'-'.join(map(str, dense_mlp()))}, over "
            f"{'-'.join(map(str, OVER_MLP))}) trained through DistributedModelParallel + TieredTrainPipeline, "
            f"{ranks} rank(s) on this node (wall clock when more than one), batch {BATCH} per rank, tables of {ROWS:,} x {DIM} whole in DRAM, one id per sample each: {seen}")
    return {"framework_step_s": per_step, "framework_table_s": per_table, "framework_table_sample_s": per_sample,
            "framework_output_byte_s": per_byte}, {
        "framework_step_cost": "fixed per step and rank; " + what,
        "framework_table_cost": "per table of the model and step (each rank handles every feature of its batch), "
                                "beyond framework_table_sample_cost; see framework_step_cost",
        "framework_table_sample_cost": f"per table, step and sample of the rank's batch: the {k2}-table "
                                       f"job's growth from batch {BATCH} to {LARGE_BATCH} beyond the model, less "
                                       "framework_output_byte_cost's share; see framework_step_cost",
        "framework_output_byte_cost": f"per byte of a sample's pooled outputs (4 x dim per bag table), step and "
                                      f"sample of the rank's batch: the {k2}-table job at batch {LARGE_BATCH}, "
                                      f"tables of {WIDE_DIM} against {DIM}, beyond the model; see framework_step_cost",
    }


def row_wise_group_cost(steps: int, ranks: int, repeats: int = REPEATS) -> Tuple[Dict[str, float], Dict[str, str]]:
    """``row_wise_group_s`` and ``row_wise_setup_s`` and a note per YAML key: the
    many-table job with ``ROW_WISE_COUNTS`` of its tables row-wise (medians of ``repeats``
    alternating jobs each). Both 0 with one rank (a row-wise table then has no peers to
    exchange with)."""
    if ranks < 2:
        note = "one rank per node: no row-wise collectives to pay"
        return {"row_wise_group_s": 0.0, "row_wise_setup_s": 0.0}, {"row_wise_group_cost": note,
                                                                    "row_wise_setup_cost": note}
    tables = TABLE_COUNTS[1]
    runs: Dict[int, List[float]] = {k: [] for k in ROW_WISE_COUNTS}
    for _ in range(max(1, repeats)):
        for row_wise in ROW_WISE_COUNTS:
            runs[row_wise].append(_run(tables, BATCH, steps, ranks, row_wise))
    none, few, several = (statistics.median(runs[k]) for k in ROW_WISE_COUNTS)
    k_few, k_several = ROW_WISE_COUNTS[1:]
    per_table = max(0.0, (several - few) / (k_several - k_few))
    setup = max(0.0, few - per_table * k_few - none)
    seen = "; ".join(f"{k} row-wise: {statistics.median(v) * 1e3:.2f} ms (jobs: "
                     f"{', '.join(f'{x * 1e3:.1f}' for x in v)})" for k, v in runs.items())
    what = f"the framework_step_cost job with {tables} tables, {ranks} ranks, {seen}"
    return {"row_wise_group_s": per_table, "row_wise_setup_s": setup}, {
        "row_wise_group_cost": f"per step on every rank for each row-wise table: the slope between "
                               f"{k_few} and {k_several} tables row-wise; {what}",
        "row_wise_setup_cost": f"per step on every rank once any table is row-wise: the line's excess at none "
                               f"over all table-wise; see row_wise_group_cost",
    }
