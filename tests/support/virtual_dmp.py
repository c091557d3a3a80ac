"""A tiny model with a virtual table in TorchRec's own words, trained by DMP on gloo ranks
(tests/sharding/test_virtual_tables_dmp.py).

The model: an EmbeddingBagCollection of a virtual table (``use_virtual_table=True``,
``total_num_buckets``, a ``CountBasedEvictionPolicy``; ids drawn from [0, 2^40)) and a
plain table, planned by TorchRec's ``EmbeddingShardingPlanner`` with
``ParameterConstraints(compute_kernels=[<a virtual-table kernel>])``, sharded by DMP with
the tiered sharder. Only the embeddings train (a fixed linear layer, a summed loss), so the
updates of a global batch are the same on any number of ranks. Each rank writes its losses
and its virtual shards' stats to ``out_dir/rank<r>.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List

import torch
import torch.distributed as dist
from torch import nn

from torchrec_mtrains.commands.worker_exit import exit_worker

BATCH = 64  # global batch
DIM = 8
VIRTUAL_IDS = 2**40
BUCKETS = 8


@dataclasses.dataclass
class VirtualRun:
    out_dir: str
    world_size: int
    kernel: str  # dram_virtual_table | ssd_virtual_table | dram_ssd_virtual_table
    storage_dir: str
    steps: int = 12
    trigger: int = 100_000  # live ids per rank before an eviction pass (the policy's trigger)
    # The plain (FUSED, table-wise) table's share of the head's input. 0 for comparisons
    # across world sizes: TorchRec's FUSED table-wise table itself trains differently on 1
    # and 2 ranks here (its losses part after the first step), which is not what they test.
    plain_weight: float = 1.0
    planner: str = "torchrec"  # or "storage_aware" (the same constraints)
    cache_load_factor: float = 0.0  # the virtual table's row cache (CacheParams.load_factor); 0: the default
    # Checkpoints: saves (DifferentialCheckpointer in ckpt_dir) after the steps in save_at;
    # a run with ``restore`` (a step directory) restores it first and trains from ``start``.
    # Each save and restore writes the rank's virtual rows to out_dir/state<step>.rank<r>.pt.
    # TorchRec divides embedding gradients by the world size (as DDP averages); off, a run
    # trains the same on any number of ranks, so a restore onto another world size compares
    # with the uninterrupted run.
    gradient_division: bool = True
    ckpt_dir: str = ""
    save_at: List[int] = dataclasses.field(default_factory=list)
    restore: str = ""
    start: int = 0
    init_method: str = ""


class Model(nn.Module):
    def __init__(self, ebc: nn.Module, plain_weight: float) -> None:
        super().__init__()
        self.ebc, self.plain_weight = ebc, plain_weight
        torch.manual_seed(3)
        self.head = nn.Linear(2 * DIM, 1)  # never stepped (DDP wraps it, so it takes grads)

    def forward(self, kjt, labels):
        return self.loss(self.ebc(kjt).to_dict(), labels)

    def loss(self, by_name, labels):
        plain = by_name["f_plain"] * self.plain_weight
        logits = self.head(torch.cat([by_name["f_virt"], plain], dim=1)).squeeze(1)
        return nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum")


class PipelinedModel(Model):
    """The model of a TorchRec ``Batch`` (what a train pipeline feeds): (loss, loss)."""

    def forward(self, batch):
        loss = self.loss(self.ebc(batch.sparse_features).to_dict(), batch.labels)
        return loss, loss.detach()


def configs(trigger: int):
    from torchrec import EmbeddingBagConfig
    from torchrec.modules.embedding_configs import CountBasedEvictionPolicy

    policy = CountBasedEvictionPolicy(training_id_eviction_trigger_count=trigger, eviction_threshold=2,
                                      decay_rate=0.8)
    return [
        EmbeddingBagConfig(name="virt", num_embeddings=VIRTUAL_IDS, embedding_dim=DIM, feature_names=["f_virt"],
                           use_virtual_table=True, total_num_buckets=BUCKETS, virtual_table_eviction_policy=policy,
                           weight_init_min=-0.1, weight_init_max=0.1),
        EmbeddingBagConfig(name="plain", num_embeddings=50, embedding_dim=DIM, feature_names=["f_plain"],
                           weight_init_min=-0.1, weight_init_max=0.1),
    ]


def global_batch(step: int):
    """Raw 64-bit ids: a hot set reused every step and a cold tail seen once."""
    g = torch.Generator().manual_seed(500 + step)
    hot = torch.randint(0, VIRTUAL_IDS, (300,), generator=torch.Generator().manual_seed(1))
    lengths = torch.randint(1, 4, (BATCH,), generator=g)
    n = int(lengths.sum())
    take_hot = torch.rand(n, generator=g) < 0.6
    ids = torch.where(take_hot, hot[torch.randint(0, 300, (n,), generator=g)],
                      torch.randint(0, VIRTUAL_IDS, (n,), generator=g))
    plain = torch.randint(0, 50, (BATCH,), generator=g)
    labels = (torch.rand(BATCH, generator=g) < 0.4).float()
    return lengths, ids, plain, labels


def local_batch(step: int, rank: int, world: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, ids, plain, labels = global_batch(step)
    per = BATCH // world
    lo, hi = rank * per, (rank + 1) * per
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    v = ids[int(starts[lo]): int(starts[hi])]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f_virt", "f_plain"], values=torch.cat([v, plain[lo:hi]]),
        lengths=torch.cat([lengths[lo:hi], torch.ones(hi - lo, dtype=torch.long)]))
    return kjt, labels[lo:hi]


def pipeline_batch(step: int, rank: int, world: int):
    """``local_batch`` as a TorchRec ``Batch`` (what a train pipeline takes)."""
    from torchrec.datasets.utils import Batch

    kjt, labels = local_batch(step, rank, world)
    return Batch(dense_features=torch.zeros(labels.numel(), 1), sparse_features=kjt, labels=labels)


def run(rank: int, spec_json: str) -> None:
    spec = VirtualRun(**json.loads(spec_json))
    world = spec.world_size
    dist.init_process_group("gloo", init_method=spec.init_method, rank=rank, world_size=world)
    if not spec.gradient_division:
        from torchrec.distributed.comm_ops import set_gradient_division

        set_gradient_division(False)
    dmp, plan = build(spec, dist.GroupMember.WORLD)
    ckpt = None
    if spec.ckpt_dir:
        from torchrec_mtrains.checkpoint import DifferentialCheckpointer

        ckpt = DifferentialCheckpointer(spec.ckpt_dir, full_every=10, max_chain_fraction=100.0)
    if spec.restore:
        ckpt.restore(dmp, None, path=spec.restore)
        torch.save(virtual_rows(dmp), os.path.join(spec.out_dir, f"state{spec.start}.rank{rank}.pt"))
    losses: List[float] = []
    for step in range(spec.start, spec.steps):
        kjt, labels = local_batch(step, rank, world)
        loss = dmp(kjt, labels)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total))
        if step + 1 in spec.save_at:
            ckpt.save(step + 1, dmp, None, {})
            torch.save(virtual_rows(dmp), os.path.join(spec.out_dir, f"state{step + 1}.rank{rank}.pt"))
    stats: Dict[str, Dict[str, float]] = {}
    for emb in tiered_kernels(dmp):
        for name, s in emb.cache_stats().items():
            if "live_ids" in s:
                stats[name] = {k: s[k] for k in ("live_ids", "ids_evicted", "eviction_passes", "capacity",
                                                 "index_bytes_per_live_id", "index_bytes_per_row_used")}
    plan_entry = plan.plan[""]["virt"] if "" in plan.plan else next(iter(plan.plan.values()))["virt"]
    with open(os.path.join(spec.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "virtual": stats, "kernel": plan_entry.compute_kernel,
                   "sharding": plan_entry.sharding_type}, f)
    for emb in tiered_kernels(dmp):
        emb.close()
    exit_worker(0)


def build(spec: VirtualRun, pg, pipelined: bool = False):
    """The model planned and sharded by DMP on ``pg`` (already initialised); (dmp, plan).
    ``pipelined``: the model takes TorchRec ``Batch``es (``pipeline_batch``)."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv

    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

    # On the meta device, as TorchRec builds large models: DMP materialises the shards only.
    model = (PipelinedModel if pipelined else Model)(EmbeddingBagCollection(tables=configs(spec.trigger), device=torch.device("meta")), spec.plain_weight)
    kv = None
    if spec.kernel != "dram_virtual_table":
        kv = KeyValueParams(ssd_storage_directory=os.path.join(spec.storage_dir, "r@local_rank"))
    cache = CacheParams(load_factor=spec.cache_load_factor) if spec.cache_load_factor else None
    constraints = {
        "virt": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=[spec.kernel],
                                     key_value_params=kv, use_virtual_table=True, cache_params=cache),
        "plain": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]),
    }
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    # Row-wise Adagrad named: the comparisons read each live id's optimizer state.
    sharder = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                                "learning_rate": 0.05})
    plan = _planner(spec, constraints).collective_plan(model, [sharder], pg)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), plan=plan,
                                   sharders=[sharder], device=torch.device("cpu"))
    return dmp, plan


def virtual_rows(dmp) -> Dict[str, torch.Tensor]:
    """This rank's live ids of the virtual table (global, ascending), their weights and
    optimizer state."""
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection
    from torchrec_mtrains.sharding.kernel import shard_offsets

    parts = []
    for m in dmp.modules():
        if isinstance(m, ShardedTieredEmbeddingBagCollection):
            for kernel in m.tiered_kernels():
                for t, table in kernel.shards():
                    if table.name == "virt":
                        ids, _ = kernel.emb_module.virtual_ids(t)
                        weights, state = kernel.emb_module.read_ids(t, ids)
                        parts.append((ids + shard_offsets(table)[0], weights, state))
    ids = torch.cat([p[0] for p in parts])
    order = torch.argsort(ids)
    return {"ids": ids[order], "weights": torch.cat([p[1] for p in parts])[order],
            "state": torch.cat([p[2] for p in parts])[order]}


def tiered_kernels(dmp) -> List:
    """The TieredEmbeddingBags of every sharded tiered collection, bags or sequences (the
    lookups hold them outside the module tree)."""
    from torchrec_mtrains.sharding.tiered_state import TieredTablesState

    return [k.emb_module for m in dmp.modules() if isinstance(m, TieredTablesState) for k in m.tiered_kernels()]


def _planner(spec: VirtualRun, constraints):
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from torchrec_mtrains import Tier
    from torchrec_mtrains.planner import StorageAwarePlanner
    from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec

    if spec.planner == "torchrec":
        return EmbeddingShardingPlanner(topology=Topology(world_size=spec.world_size, compute_device="cpu"),
                                        constraints=constraints)
    node = TieredTopology("test-cpu", "cpu", spec.world_size,
                          {Tier.DRAM: TierSpec(4 << 30, 5e9, 5e9), Tier.SSD: TierSpec(64 << 30, 2e8, 3e8)},
                          ComputeSpec(2e9, 0.002, 2e-7, 1e-6))
    return StorageAwarePlanner(node, batch_size=BATCH, world_size=spec.world_size, constraints=constraints,
                               storage_dir=spec.storage_dir)


def launch(spec: VirtualRun, timeout: float = 300.0) -> List[int]:
    from tests.support.dmp_harness import _spawn
    from tests.support.ports import file_init_method

    if not spec.init_method:
        spec = dataclasses.replace(spec, init_method=file_init_method(os.path.join(spec.out_dir, "rendezvous")))
    return _spawn(run, [(r, json.dumps(dataclasses.asdict(spec))) for r in range(spec.world_size)], timeout)


def read(out_dir: str, world: int) -> List[dict]:
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(world)]
