"""Multi-process DMP training runs for the sharding tests (run in spawned processes).

One run: a small model (an EBC of four tables + a linear layer) trained with
DistributedModelParallel and the TieredTrainPipeline on gloo, from fixed initial weights
and a fixed global batch per step (each rank takes its slice). A run can restore a DCP
checkpoint first, save one after some step, kill itself after saving (SIGKILL, as a crash),
and always writes its losses and a final DCP checkpoint. With a DifferentialCheckpointer
directory it can also restore a chain, save a full or delta step every few steps, and arm
a fault point (``torchrec_mtrains.testing.faults``) that SIGKILLs it inside a save;
``launch_many`` runs several specs one after the other in the same processes (one spawn).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from torchrec_mtrains.commands.worker_exit import exit_worker

from tests.support.ports import file_init_method

BATCH = 32  # global batch size
# name -> (rows, dim, features)
TABLES: Dict[str, tuple] = {
    "ssd_a": (700, 16, 2),
    "ssd_b": (400, 8, 1),
    "scm_c": (500, 12, 1),
    "plain_d": (300, 8, 1),
}


@dataclasses.dataclass
class RunSpec:
    world_size: int
    steps: int  # train until this global step (exclusive)
    out_dir: str
    storage_dir: str
    tiers: Dict[str, Optional[str]]  # table -> "ssd" / "scm" / "dram", or None for FUSED
    sharding_type: str = "table_wise"
    table_sharding: Dict[str, str] = dataclasses.field(default_factory=dict)  # table -> its own sharding_type
    cache_load_factor: float = 0.05
    lookahead: int = 0  # the tiered tables' look-ahead window, and the pipeline's
    restore_from: Optional[str] = None  # DCP checkpoint to start from
    start_step: int = 0
    save_at: Optional[int] = None  # save a DCP checkpoint after this many steps
    save_dir: Optional[str] = None
    kill_after_save: bool = False
    init_file: Optional[str] = None  # full initial weights (torch.save of a dict)
    init_method: str = ""  # the group's rendezvous; launch() sets a file:// one in out_dir
    snapshot_at: List[int] = dataclasses.field(default_factory=list)  # plain DCP saves to out_dir/snap_<step>
    # Differential checkpoints (torchrec_mtrains.checkpoint.DifferentialCheckpointer):
    diff_dir: Optional[str] = None  # the checkpointer's directory
    diff_every: int = 0  # save a full or delta step every this many steps (0: never)
    full_every: int = 4
    diff_async: bool = False  # DifferentialCheckpointer.async_save (each record taken at the next save)
    max_chain_fraction: float = 1.0
    restore_diff: bool = False  # restore from diff_dir first (then start_step is the saved step)
    restore_path: Optional[str] = None  # the chain's last step; None: diff_dir's latest, if any
    fault: Optional[str] = None  # MTRAINS_FAULT of the run's processes, e.g. "checkpoint.write:2"
    fault_trace: Optional[str] = None  # MTRAINS_FAULT_TRACE of the run's processes
    # "torchrec" / "storage_aware": the plan is TorchRec's EmbeddingShardingPlanner's / the
    # StorageAwarePlanner's, from ParameterConstraints: tables of tier "key_value" as TorchRec
    # documents SSD tables (KeyValueParams with storage_dir/emb@local_rank, CacheParams), the
    # others FUSED; "": tiered_sharding_plan.
    planner: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


def feature_names() -> List[str]:
    return [f"{t}_f{i}" for t, (_, _, n) in TABLES.items() for i in range(n)]


class TinyModel(nn.Module):
    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc
        self.dense = nn.Linear(sum(d * n for _, d, n in TABLES.values()), 1)

    def forward(self, batch):
        # By name: a sharded collection's KeyedTensor keeps its groups' order of the features,
        # not the collection's (TorchRec's DLRM reads its pooled features by name too).
        by_name = self.ebc(batch.sparse_features).to_dict()
        pooled = torch.cat([by_name[f] for f in feature_names()], dim=1)
        logits = self.dense(pooled).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, loss.detach()


def make_unsharded(device: str = "cpu") -> TinyModel:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    configs = [
        EmbeddingBagConfig(name=t, num_embeddings=r, embedding_dim=d, feature_names=[f"{t}_f{i}" for i in range(n)])
        for t, (r, d, n) in TABLES.items()
    ]
    return TinyModel(EmbeddingBagCollection(tables=configs, device=torch.device(device)))


def initial_weights(seed: int = 7) -> Dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = make_unsharded()
    for p in model.ebc.parameters():
        nn.init.uniform_(p, -0.3, 0.3)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def global_batch(step: int):
    """The step's global batch: skewed ids, 0-3 ids per feature and sample, labels that
    depend on the ids (so the model has something to learn)."""

    g = torch.Generator().manual_seed(1000 + step)
    lengths, values = [], []
    for t, (rows, _, n) in TABLES.items():
        for _ in range(n):
            ln = torch.randint(0, 4, (BATCH,), generator=g)
            ids = (torch.rand(int(ln.sum()), generator=g) ** 3 * rows).long()
            lengths.append(ln)
            values.append(ids)
    lengths_t = torch.stack(lengths)  # [features, batch]
    labels = (torch.rand(BATCH, generator=g) < 0.3).float()
    return lengths_t, values, labels


def local_batch(step: int, rank: int, world_size: int):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    lengths, values, labels = global_batch(step)
    per = BATCH // world_size
    lo, hi = rank * per, (rank + 1) * per
    vals = []
    for f, ln in enumerate(lengths):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), ln.cumsum(0)])
        vals.append(values[f][offsets[lo] : offsets[hi]])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=feature_names(), values=torch.cat(vals), lengths=lengths[:, lo:hi].reshape(-1)
    )
    return Batch(dense_features=torch.zeros(hi - lo, 1), sparse_features=kjt, labels=labels[lo:hi])


def _build(spec: RunSpec, rank: int):
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

    model = make_unsharded()
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.05})
    if spec.planner:
        plan = _planned(spec, model)
    else:
        plan = ShardingPlan({"ebc": _hand_plan(spec, model)})
    dmp = DistributedModelParallel(
        model, plan=plan, sharders=[TieredEmbeddingBagCollectionSharder()], device=torch.device("cpu"),
    )
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda params: torch.optim.SGD(params, lr=0.1))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense_opt])


def _hand_plan(spec: RunSpec, model: TinyModel):
    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredParams, tiered_sharding_plan

    tables = {
        t: None if tier is None else TieredParams(Tier(tier), cache_load_factor=spec.cache_load_factor,
                                                  storage_dir=spec.storage_dir, state_dict_ram_mb=0.01,
                                                  lookahead=spec.lookahead)
        for t, tier in spec.tiers.items()
    }
    plan = tiered_sharding_plan(model.ebc, tables, spec.world_size, sharding_type=spec.sharding_type)
    for table, sharding_type in spec.table_sharding.items():
        plan[table] = tiered_sharding_plan(model.ebc, tables, spec.world_size, sharding_type=sharding_type)[table]
    return plan


def key_value_constraints(spec: RunSpec):
    """TorchRec's ParameterConstraints of the run's tables: tier "key_value" tables as
    TorchRec documents an SSD table, the others FUSED (table-wise, for the FUSED comparison)."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams, KeyValueParams

    out = {}
    for table, tier in spec.tiers.items():
        sharding = spec.table_sharding.get(table, spec.sharding_type)
        if tier == "key_value":
            out[table] = ParameterConstraints(
                sharding_types=[sharding], compute_kernels=["key_value"],
                key_value_params=KeyValueParams(ssd_storage_directory=os.path.join(spec.storage_dir, "emb@local_rank")),
                cache_params=CacheParams(load_factor=spec.cache_load_factor, algorithm=CacheAlgorithm.LFU),
            )
        else:
            out[table] = ParameterConstraints(sharding_types=[sharding], compute_kernels=["fused"])
    return out


def _planned(spec: RunSpec, model: TinyModel):
    """The plan of ``spec.planner``, made on rank 0 and broadcast."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    from torchrec_mtrains import Tier
    from torchrec_mtrains.planner import StorageAwarePlanner
    from torchrec_mtrains.planner.types import ComputeSpec, TieredTopology, TierSpec
    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

    constraints = key_value_constraints(spec)
    if spec.planner == "torchrec":
        topology = Topology(world_size=spec.world_size, compute_device="cpu", ssd_cap=1 << 30)
        planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    elif spec.planner == "storage_aware":
        node = TieredTopology("test-cpu", "cpu", spec.world_size,
                              {Tier.DRAM: TierSpec(4 << 30, 5e9, 5e9), Tier.SSD: TierSpec(64 << 30, 2e8, 3e8)},
                              ComputeSpec(2e9, 0.002, 2e-7, 1e-6))
        planner = StorageAwarePlanner(node, batch_size=BATCH, world_size=spec.world_size, constraints=constraints)
    else:
        raise ValueError(f"planner={spec.planner!r} must be 'torchrec', 'storage_aware' or ''")
    return planner.collective_plan(model, [TieredEmbeddingBagCollectionSharder()], dist.GroupMember.WORLD)


def _load_initial(dmp, init_file: str) -> None:
    """Copies full initial weights into the model's own state_dict, then loads it."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    full = torch.load(init_file)
    sd = dmp.state_dict()
    for key, value in sd.items():
        src = full[key.replace("_dmp_wrapped_module.", "").replace("module.", "")]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                r, c = shard.metadata.shard_offsets
                h, w = shard.metadata.shard_sizes
                shard.tensor.copy_(src[r : r + h, c : c + w])
        else:
            value.copy_(src)
    dmp.load_state_dict(sd)


def _state(dmp, opt) -> dict:
    return {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}


def _arm_faults(spec: RunSpec, rank: int) -> None:
    """Sets the fault hook's environment (its ``<rank>`` is env RANK); the hook reads it
    when torchrec_mtrains first imports it, which in a freshly spawned process is later."""
    for name, value in (("MTRAINS_FAULT", spec.fault), ("MTRAINS_FAULT_TRACE", spec.fault_trace)):
        if value:
            os.environ[name] = value
            os.environ["RANK"] = str(rank)
        else:
            os.environ.pop(name, None)


def _checkpointer(spec: RunSpec):
    from torchrec_mtrains.checkpoint import DifferentialCheckpointer

    return DifferentialCheckpointer(spec.diff_dir, full_every=spec.full_every,
                                    max_chain_fraction=spec.max_chain_fraction)


def _restore_diff(spec: RunSpec, ckpt, dmp) -> Tuple[int, List[float]]:
    """Restores the chain ending at ``spec.restore_path`` (or the latest); returns the step
    to start from and the losses of the steps before it (``spec.start_step`` and none when
    there is no complete step yet)."""
    if spec.restore_path is None and ckpt.latest() is None:
        return spec.start_step, []
    trainer = ckpt.restore(dmp, None, path=spec.restore_path)  # the dense SGD has no state
    return int(trainer["step"]), list(trainer["losses"])


def _diff_save(spec: RunSpec, ckpt, dmp, step: int, losses: List[float], rank: int) -> None:
    """A differential save (its trainer.json holds every loss since step 0); rank 0 appends
    its record and the directory's listing right after it to out_dir/diff_saves.json (of an
    async save: once the next save or the run's end waited for it)."""
    if spec.diff_async:
        _diff_record(spec, ckpt.wait(), rank)
        ckpt.async_save(step, dmp, None, {"losses": losses})
    else:
        _diff_record(spec, ckpt.save(step, dmp, None, {"losses": losses}), rank)


def _diff_record(spec: RunSpec, record, rank: int) -> None:
    if record is not None and rank == 0:
        path = os.path.join(spec.out_dir, "diff_saves.json")
        saves = json.load(open(path)) if os.path.exists(path) else []
        saves.append({**record.as_dict(), "listing": sorted(os.listdir(spec.diff_dir))})
        with open(path, "w") as f:
            json.dump(saves, f)


def run(rank: int, spec_json: str) -> None:
    spec = RunSpec(**json.loads(spec_json))
    _arm_faults(spec, rank)
    dist.init_process_group("gloo", init_method=spec.init_method, rank=rank, world_size=spec.world_size)
    _run(spec, rank)
    exit_worker(0)


def run_many(rank: int, specs_json: List[str], init_method: str) -> None:
    """Runs specs of one world size (without faults) one after the other in one group."""
    specs = [RunSpec(**json.loads(s)) for s in specs_json]
    _arm_faults(specs[0], rank)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=specs[0].world_size)
    for spec in specs:
        _run(spec, rank)
    exit_worker(0)


def _run(spec: RunSpec, rank: int) -> None:
    from torchrec_mtrains.sharding import TieredTrainPipeline

    torch.manual_seed(0)
    dmp, opt = _build(spec, rank)
    if spec.init_file:
        _load_initial(dmp, spec.init_file)
    if spec.restore_from:
        state = _state(dmp, opt)
        dcp.load(state, checkpoint_id=spec.restore_from)
        dmp.load_state_dict(state["model"])
        dmp.fused_optimizer.load_state_dict(state["optim"])
    if (spec.restore_diff or spec.diff_every) and not spec.diff_dir:
        raise ValueError("restore_diff and diff_every need diff_dir")
    ckpt = _checkpointer(spec) if spec.diff_dir else None
    start, history = _restore_diff(spec, ckpt, dmp) if spec.restore_diff else (spec.start_step, [])
    pipeline = TieredTrainPipeline(dmp, opt, torch.device("cpu"), lookahead=spec.lookahead)
    batches = iter([local_batch(s, rank, spec.world_size) for s in range(start, spec.steps)])
    losses = []
    step = start
    while True:
        try:
            loss = pipeline.progress(batches)
        except StopIteration:
            break
        # The global mean loss (each rank holds the mean of its equal slice).
        dist.all_reduce(loss)
        losses.append(float(loss) / spec.world_size)
        step += 1
        if spec.save_at is not None and step == spec.save_at:
            dcp.save(_state(dmp, opt), checkpoint_id=spec.save_dir)
            dist.barrier()
            if spec.kill_after_save:
                os.kill(os.getpid(), signal.SIGKILL)
        if step in spec.snapshot_at:
            dcp.save(_state(dmp, opt), checkpoint_id=os.path.join(spec.out_dir, f"snap_{step}"))
        if spec.diff_every and step % spec.diff_every == 0:
            _diff_save(spec, ckpt, dmp, step, history + losses, rank)
    if ckpt is not None and spec.diff_async:
        _diff_record(spec, ckpt.wait(), rank)
    dcp.save(_state(dmp, opt), checkpoint_id=os.path.join(spec.out_dir, "final"))
    _write_prefetch_counts(dmp, os.path.join(spec.out_dir, f"prefetched_rank{rank}.json"))
    if rank == 0:
        with open(os.path.join(spec.out_dir, "losses.json"), "w") as f:
            json.dump(losses, f)
    dist.barrier()
    _close_tiers(dmp)


def _close_tiers(dmp) -> None:
    """Closes the tiered stores, as a job's end does: a store file belongs to one open store,
    and the next run in this process (run_many) may adopt the same linked file."""
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    for m in dmp.modules():
        if isinstance(m, ShardedTieredEmbeddingBagCollection):
            for kernel in m.tiered_kernels():
                kernel.close()


def _write_prefetch_counts(dmp, path: str) -> None:
    """Per tiered kernel on this rank: how many forwards found their rows prefetched."""
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    counts = [
        next(iter(kernel.emb_module.cache_stats().values()))["steps_prefetched"]
        for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection)
        for kernel in m.tiered_kernels()
    ]
    with open(path, "w") as f:
        json.dump(counts, f)
    # Per tiered kernel on this rank: the tiers of its tables.
    tiers = [
        sorted({t.name for t in kernel.emb_module.tiers})
        for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection)
        for kernel in m.tiered_kernels()
    ]
    with open(path.replace("prefetched_", "kernel_tiers_"), "w") as f:
        json.dump(tiers, f)
    # Per tiered kernel on this rank: its look-ahead window.
    windows = [
        next(iter(kernel.emb_module.cache_stats().values()))["lookahead"]
        for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection)
        for kernel in m.tiered_kernels()
    ]
    with open(path.replace("prefetched_", "lookahead_"), "w") as f:
        json.dump(windows, f)


def read_kernel_tiers(out_dir: str, world_size: int) -> List[List[List[str]]]:
    """Per rank, per tiered kernel: the sorted tier names of its tables."""
    out = []
    for r in range(world_size):
        with open(os.path.join(out_dir, f"kernel_tiers_rank{r}.json")) as f:
            out.append(json.load(f))
    return out


def _per_kernel(out_dir: str, world_size: int, name: str) -> List[float]:
    """Every rank's list ``<name>_rank<r>.json``, concatenated in rank order."""
    values: List[float] = []
    for r in range(world_size):
        with open(os.path.join(out_dir, f"{name}_rank{r}.json")) as f:
            values += json.load(f)
    return values


def read_lookaheads(out_dir: str, world_size: int) -> List[float]:
    """Every rank's tiered kernels' look-ahead windows."""
    return _per_kernel(out_dir, world_size, "lookahead")


def read_prefetch_counts(out_dir: str, world_size: int) -> List[float]:
    return _per_kernel(out_dir, world_size, "prefetched")


def launch(spec: RunSpec, timeout: float = 300.0) -> List[int]:
    """Runs ``spec`` in ``world_size`` fresh processes; returns their exit codes."""
    if not spec.init_method:
        spec = dataclasses.replace(spec, init_method=file_init_method(os.path.join(spec.out_dir, "rendezvous")))
    return _spawn(run, [(r, spec.to_json()) for r in range(spec.world_size)], timeout)


def launch_many(specs: List[RunSpec], timeout: float = 300.0) -> List[int]:
    """Runs ``specs`` (one world size, no faults) one after the other in ``world_size``
    fresh processes (one spawn for all); returns their exit codes."""
    world = specs[0].world_size
    if any(s.world_size != world or s.fault or s.kill_after_save for s in specs):
        raise ValueError("launch_many: the specs must share one world size and kill no process")
    init = file_init_method(os.path.join(specs[0].out_dir, "rendezvous"))
    args = [s.to_json() for s in specs]
    return _spawn(run_many, [(r, args, init) for r in range(world)], timeout)


def _spawn(target, args: List[tuple], timeout: float) -> List[int]:
    """Runs ``target(*a)`` for each ``a`` in a spawned process; returns their exit codes."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
        codes.append(p.exitcode)
    return codes


def read_final(out_dir: str, name: str = "final") -> Dict[str, torch.Tensor]:
    """A run's final checkpoint (or its ``snap_<step>``) as full tensors (flattened keys)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = os.path.join(out_dir, f"{name}.pt")
    dcp_to_torch_save(os.path.join(out_dir, name), path)
    state = torch.load(path, weights_only=False)
    flat: Dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}{k}.", v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix[:-1]] = obj

    walk("", state)
    return flat


def read_losses(out_dir: str) -> List[float]:
    with open(os.path.join(out_dir, "losses.json")) as f:
        return json.load(f)
