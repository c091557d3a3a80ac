"""The subprocess of ``probe_framework`` (``mtrains probe-hw``): trains TorchRec's DLRM with
``TABLES`` small tables whole in DRAM through ``DistributedModelParallel`` and
``TieredTrainPipeline`` as one rank of a gloo job, and prints the median seconds of a step.

Usage: ``python -m torchrec_mtrains.commands.framework_step TABLES BATCH STEPS [RANK WORLD PORT
[ROW_WISE [DIM]]]`` (without RANK WORLD PORT: a job of one rank); the first ROW_WISE tables are
sharded row-wise (default 0: the planner's choice, table-wise); DIM is the tables' embedding
dimension (default ``probe_framework.DIM``), which the dense arch's output follows.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from torchrec_mtrains.commands.worker_exit import exit_worker
from torchrec_mtrains.planner.hardware.probe_framework import DENSE_IN, DIM, OVER_MLP, ROWS, dense_mlp

__all__ = ["measure"]


def measure(tables: int, batch: int, steps: int, rank: int = 0, world: int = 1, port: int = 0,
            row_wise: int = 0, dim: int = DIM) -> float:
    """Median step seconds of the DLRM with ``tables`` tables, as rank ``rank`` of ``world``
    (the job's processes meet at 127.0.0.1:``port``; 0 for a job of one rank). With more
    than one rank a step is timed by the wall clock: waiting for the peers' collectives and
    sharing the node's cores with them is the framework's cost too."""
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner.types import ParameterConstraints
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
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    names = [f"t{i}" for i in range(tables)]
    configs = [EmbeddingBagConfig(name=n, num_embeddings=ROWS, embedding_dim=dim, feature_names=[f"f{n}"])
               for n in names]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    model = DLRMTrain(DLRM(ebc, DENSE_IN, list(dense_mlp(dim)), list(OVER_MLP)))
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    # Any CPU node whose DRAM holds the tables whole: the plan keeps them all FUSED.
    node = TieredTopology("probe", "cpu", 1, {Tier.DRAM: TierSpec(2**34, 1e10, 1e10)}, ComputeSpec(1e10))
    sharders = [TieredEmbeddingBagCollectionSharder()]
    constraints = {n: ParameterConstraints(sharding_types=["row_wise"]) for n in names[:row_wise]}
    plan = StorageAwarePlanner(node, batch_size=batch, world_size=world, constraints=constraints).plan(model, sharders)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=torch.device("cpu"))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.02))
    pipe = TieredTrainPipeline(dmp, CombinedOptimizer([dmp.fused_optimizer, dense]), torch.device("cpu"))
    gen = torch.Generator().manual_seed(rank)
    batches = [Batch(dense_features=torch.rand(batch, DENSE_IN, generator=gen),
                     sparse_features=KeyedJaggedTensor.from_lengths_sync(
                         keys=[f"f{n}" for n in names], values=torch.randint(ROWS, (tables * batch,), generator=gen),
                         lengths=torch.ones(tables * batch, dtype=torch.int32)),
                     labels=torch.randint(2, (batch,), generator=gen).float()) for _ in range(steps + 3)]
    it = iter(batches)
    clock, times = (step_clock() if world == 1 else time.perf_counter), []
    for i in range(steps + 1):
        t0 = clock()
        pipe.progress(it)
        if i:
            times.append(clock() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    print(measure(*(int(a) for a in sys.argv[1:])), flush=True)
    exit_worker(0)
