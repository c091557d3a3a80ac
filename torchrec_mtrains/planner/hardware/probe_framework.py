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

Run as ``python -m torchrec_mtrains.planner.hardware.probe_framework TABLES BATCH STEPS``:
prints the median step seconds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Tuple

__all__ = ["framework_costs"]

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


def _measure(tables: int, batch: int, steps: int) -> float:
    """Median step seconds of the DLRM with ``tables`` tables (in this process)."""
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from torchrec_mtrains import Tier
    from torchrec_mtrains.planner import ComputeSpec, StorageAwarePlanner, TieredTopology, TierSpec
    from torchrec_mtrains.planner.hardware.timing import step_clock
    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredTrainPipeline

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    names = [f"t{i}" for i in range(tables)]
    configs = [EmbeddingBagConfig(name=n, num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{n}"])
               for n in names]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    model = DLRMTrain(DLRM(ebc, DENSE_IN, list(DENSE_MLP), list(OVER_MLP)))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    # Any CPU node whose DRAM holds the tables whole: the plan keeps them all FUSED.
    node = TieredTopology("probe", "cpu", 1, {Tier.DRAM: TierSpec(2**34, 1e10, 1e10)}, ComputeSpec(1e10))
    sharders = [TieredEmbeddingBagCollectionSharder()]
    plan = StorageAwarePlanner(node, batch_size=batch, world_size=1).plan(model, sharders)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=torch.device("cpu"))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.02))
    pipe = TieredTrainPipeline(dmp, CombinedOptimizer([dmp.fused_optimizer, dense]), torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    batches = [Batch(dense_features=torch.rand(batch, DENSE_IN, generator=gen),
                     sparse_features=KeyedJaggedTensor.from_lengths_sync(
                         keys=[f"f{n}" for n in names], values=torch.randint(ROWS, (tables * batch,), generator=gen),
                         lengths=torch.ones(tables * batch, dtype=torch.int32)),
                     labels=torch.randint(2, (batch,), generator=gen).float()) for _ in range(steps + 3)]
    it = iter(batches)
    clock, times = step_clock(), []
    for i in range(steps + 1):
        t0 = clock()
        pipe.progress(it)
        if i:
            times.append(clock() - t0)
    dist.destroy_process_group()
    return statistics.median(times)


def _run(tables: int, batch: int, steps: int) -> float:
    proc = subprocess.run([sys.executable, "-m", __name__, str(tables), str(batch), str(steps)],
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


if __name__ == "__main__":
    print(_measure(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
