"""A tiny sequence model -- a TorchRec EmbeddingCollection (a row per id) and a fixed head --
trained by DMP on gloo ranks through TorchRec's prefetching train pipeline
(tests/sharding/test_sequence_dmp.py).

Every run starts from the same weights (the unsharded collection's, which DMP loads into
FUSED and tiered tables alike) and trains on the same global batches of jagged sequences.
Each rank writes its losses (``losses.json``) and the final weights and fused optimizer
state as a DCP checkpoint (``final/``), so runs of any plan compare table by table.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from torchrec_mtrains.commands.worker_exit import exit_worker

from tests.support.virtual_dmp import tiered_kernels

BATCH = 16  # global batch
DIM = 8
TABLES = {"seq_a": 400, "seq_b": 300, "seq_c": 200}  # name -> rows; one feature each
MAX_LEN = 12  # a sample's sequence length is uniform in [0, MAX_LEN]


@dataclasses.dataclass
class SequenceRun:
    out_dir: str
    world_size: int
    storage_dir: str
    tiers: Dict[str, Optional[str]]  # table -> "ssd" / "scm" / "dram" (tiered) or None (FUSED)
    sharding_type: str = "table_wise"
    steps: int = 10
    # "hand": tiered_sharding_plan; "key_value": TorchRec's EmbeddingShardingPlanner with
    # ParameterConstraints(compute_kernels=["key_value"]) on the tables ``tiers`` names.
    planner: str = "hand"
    # Differential checkpoints in ckpt_dir: a save after the last step (``save``), or a
    # restore of the step directory ``restore`` first, then training from step ``start``.
    ckpt_dir: str = ""
    save: bool = False
    restore: str = ""
    start: int = 0
    init_method: str = ""


def feature(table: str) -> str:
    return f"f_{table}"


class SequenceModel(nn.Module):
    def __init__(self, ec: nn.Module) -> None:
        super().__init__()
        self.ec = ec
        torch.manual_seed(11)
        self.head = nn.Linear(DIM, 1)  # never stepped

    def forward(self, batch):
        by_feature = self.ec(batch.sparse_features)
        loss = sum((self.head(by_feature[feature(t)].values()).squeeze(1) - 0.5).pow(2).sum() for t in TABLES)
        return loss, loss.detach()


def make_collection(device: str = "cpu"):
    from torchrec import EmbeddingCollection, EmbeddingConfig

    torch.manual_seed(5)
    return EmbeddingCollection(
        tables=[EmbeddingConfig(name=t, num_embeddings=rows, embedding_dim=DIM, feature_names=[feature(t)])
                for t, rows in TABLES.items()],
        device=torch.device(device))


def global_batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    lengths = {t: torch.randint(0, MAX_LEN + 1, (BATCH,), generator=g) for t in TABLES}
    values = {t: torch.randint(0, rows, (int(lengths[t].sum()),), generator=g) for t, rows in TABLES.items()}
    return lengths, values


def local_batch(step: int, rank: int, world: int):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, values = global_batch(step)
    per = BATCH // world
    lo, hi = rank * per, (rank + 1) * per
    vals, lens = [], []
    for t in TABLES:
        starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths[t].cumsum(0)])
        vals.append(values[t][int(starts[lo]): int(starts[hi])])
        lens.append(lengths[t][lo:hi])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[feature(t) for t in TABLES], values=torch.cat(vals),
                                              lengths=torch.cat(lens))
    return Batch(dense_features=torch.zeros(hi - lo, 1), sparse_features=kjt, labels=torch.zeros(hi - lo))


_TIERS = {"ssd": "SSD", "scm": "SCM", "dram": "DRAM"}
_FUSED_PARAMS = {"learning_rate": 0.05, "eps": 0.01}


def _plan(spec: SequenceRun, model: SequenceModel, pg):
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import KeyValueParams, ShardingPlan

    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredParams, tiered_sharding_plan
    from torchrec_mtrains.sharding.sharder import TieredEmbeddingCollectionSharder

    sharder = TieredEmbeddingCollectionSharder(fused_params=_optimizer_params())
    if spec.planner == "hand":
        tables = {t: None if tier is None else TieredParams(getattr(Tier, _TIERS[tier]), cache_load_factor=0.2,
                                                             storage_dir=spec.storage_dir)
                  for t, tier in spec.tiers.items()}
        plan = tiered_sharding_plan(model.ec, tables, spec.world_size, sharding_type=spec.sharding_type)
        return ShardingPlan({"ec": plan}), sharder
    kv = KeyValueParams(ssd_storage_directory=os.path.join(spec.storage_dir, "kv@local_rank"))
    constraints = {t: ParameterConstraints(sharding_types=[spec.sharding_type],
                                           compute_kernels=["key_value" if tier else "fused"],
                                           key_value_params=kv if tier else None)
                   for t, tier in spec.tiers.items()}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=spec.world_size, compute_device="cpu"),
                                       constraints=constraints)
    return planner.collective_plan(model, [sharder], pg), sharder


def _optimizer_params() -> dict:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return {**_FUSED_PARAMS, "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD}


def run(rank: int, spec_json: str) -> None:
    import torch.distributed.checkpoint as dcp

    spec = SequenceRun(**json.loads(spec_json))
    dist.init_process_group("gloo", init_method=spec.init_method, rank=rank, world_size=spec.world_size)
    pg = dist.GroupMember.WORLD
    dmp, plan = build(spec, pg)
    ckpt = None
    if spec.ckpt_dir:
        from torchrec_mtrains.checkpoint import DifferentialCheckpointer

        ckpt = DifferentialCheckpointer(spec.ckpt_dir, link_ssd_tables=False)
    if spec.restore:
        ckpt.restore(dmp, None, path=spec.restore)
    losses = train(dmp, range(spec.start, spec.steps), rank, spec.world_size)
    if spec.save:
        ckpt.save(spec.steps, dmp, None, {})
    kernels = {name: ps.compute_kernel for name, ps in plan.plan["ec"].items()}
    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    dcp.save(state, checkpoint_id=os.path.join(spec.out_dir, "final"), process_group=pg)
    if rank == 0:
        with open(os.path.join(spec.out_dir, "losses.json"), "w") as f:
            json.dump({"losses": losses, "kernels": kernels}, f)
    for emb in tiered_kernels(dmp):
        emb.close()
    exit_worker(0)


def build(spec: SequenceRun, pg):
    """The model planned and sharded by DMP on ``pg`` (initialised); (dmp, plan)."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    model = SequenceModel(make_collection())
    plan, sharder = _plan(spec, model, pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan, sharders=[sharder],
                                   device=torch.device("cpu"))
    return dmp, plan


def train(dmp, steps: range, rank: int, world: int, on_step=None) -> List[float]:
    """Trains ``steps`` through TorchRec's prefetching pipeline; the global losses.
    ``on_step(s)`` after step s - 1 (a save: the next step is prefetched by then)."""
    from torchrec_mtrains.sharding import TieredTrainPipeline

    opt = torch.optim.SGD([p for p in dmp.parameters() if p.requires_grad], lr=0.0)  # the head stays fixed
    pipeline = TieredTrainPipeline(dmp, opt, torch.device("cpu"))
    batches = iter([local_batch(s, rank, world) for s in steps])
    losses: List[float] = []
    for s in steps:
        loss = pipeline.progress(batches).clone()
        dist.all_reduce(loss)
        losses.append(float(loss))
        if on_step is not None:
            on_step(s + 1)
    pipeline.detach()
    return losses


def launch(spec: SequenceRun, timeout: float = 300.0) -> List[int]:
    from tests.support.dmp_harness import _spawn
    from tests.support.ports import file_init_method

    if not spec.init_method:
        spec = dataclasses.replace(spec, init_method=file_init_method(os.path.join(spec.out_dir, "rendezvous")))
    return _spawn(run, [(r, json.dumps(dataclasses.asdict(spec))) for r in range(spec.world_size)], timeout)


def read(out_dir: str) -> dict:
    from tests.support.dmp_harness import read_final

    with open(os.path.join(out_dir, "losses.json")) as f:
        doc = json.load(f)
    doc["final"] = read_final(out_dir)
    return doc
