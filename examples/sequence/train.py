"""A small sequence recommender on tiered tables: TorchRec's EmbeddingCollection (a row per
id) sharded by the TieredEmbeddingCollectionSharder, placed by the StorageAwarePlanner over
DRAM, SCM and SSD, trained through TorchRec's prefetching pipeline on gloo ranks.

Each sample is a user, the user's history of items (a sequence: long-tailed lengths, up to
--max-length ids) and a candidate item; the label says whether the user clicked it. The
item ids come from the DLRM example's locality model (examples/dlrm/data.py: the
dlrm_datasets reuse histogram), and every item and user has a hidden effect that the labels
follow, so the embeddings have something to learn. The model embeds the history (one row per
id, averaged per user), the candidate and the user, and an MLP scores them.

    torchx run -s local_cwd examples/sequence/component.py:sequence -- --steps 200 --out build/sequence-run
    python examples/sequence/train.py --steps 50          # one process

Writes metrics.json (losses, AUC, QPS, placement, cache hit rates, sequence lengths) to
--out. See docs/example.md ("The sequence model").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "dlrm"))  # the DLRM example's data model and helpers

from data import SyntheticTableSpec, table_locality, table_sampler  # noqa: E402
from placement import DEFAULT_PROFILE, load_hardware, node_of, parse_bytes  # noqa: E402
from progress import progress_bar  # noqa: E402
from report import auc  # noqa: E402

from torchrec_mtrains import Tier  # noqa: E402
from torchrec_mtrains.commands.quiet import quiet_framework_noise  # noqa: E402
from torchrec_mtrains.elastic import init_process_group  # noqa: E402

EXIT_BAD_INPUT = 2
FEATURES = ("history", "candidate", "user")


# --optimizer -> FBGEMM's EmbOptimType value.
OPTIMIZERS = {"rowwise_adagrad": "exact_row_wise_adagrad", "adagrad": "exact_adagrad", "adam": "adam",
              "partial_rowwise_adam": "partial_row_wise_adam", "lamb": "lamb",
              "partial_rowwise_lamb": "partial_row_wise_lamb"}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps")
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank and step")
    p.add_argument("--items", type=int, default=2_000_000, help="rows of the item table")
    p.add_argument("--users", type=int, default=200_000, help="rows of the user table")
    p.add_argument("--embedding-dim", type=int, default=32, help="dim of both tables (multiple of 4)")
    p.add_argument("--mean-length", type=float, default=40.0, help="mean ids of a history")
    p.add_argument("--max-length", type=int, default=2048, help="longest history (the long tail is cut there)")
    p.add_argument("--dram-budget", default="32MiB", help="DRAM per rank the embeddings may use")
    p.add_argument("--scm-budget", default="64MiB", help="SCM per rank ('none': unlimited); the rest goes to SSD")
    p.add_argument("--hardware", default=DEFAULT_PROFILE, help="hardware profile: a shipped name or a YAML file")
    p.add_argument("--storage-dir", default=None, help="where SCM/SSD table files go (default: a temp dir)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per rank for the AUC")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=sorted(OPTIMIZERS),
                   help="the tables' fused optimizer (FBGEMM's; adam is what BERT4Rec and SASRec train with)")
    p.add_argument("--learning-rate", type=float, default=None,
                   help="the tables' learning rate (default: 0.05 for the Adagrads, 0.001 for the Adam family)")
    p.add_argument("--seed", type=int, default=0, help="data and initial weights")
    p.add_argument("--out", default="build/sequence-run", help="output directory (metrics.json)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "items", "users", "max_length", "eval_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.embedding_dim < 4 or args.embedding_dim % 4:
        p.error("--embedding-dim must be a positive multiple of 4 (FBGEMM)")
    if not 1 <= args.mean_length <= args.max_length:
        p.error("--mean-length must lie in [1, --max-length]")
    if args.learning_rate is None:
        args.learning_rate = 0.05 if "adagrad" in args.optimizer else 0.001
    if not args.learning_rate > 0:
        p.error("--learning-rate must be > 0")
    try:
        args.dram_budget_bytes = parse_bytes(args.dram_budget, "--dram-budget")
        args.scm_budget_bytes = None if args.scm_budget.lower() == "none" else parse_bytes(args.scm_budget,
                                                                                            "--scm-budget")
    except ValueError as e:
        p.error(str(e))
    return args


def item_spec(args: argparse.Namespace) -> SyntheticTableSpec:
    """The item table's locality model: a sample looks up its history and its candidate."""
    return SyntheticTableSpec("item", args.items, args.mean_length + 1.0)


def user_spec(args: argparse.Namespace) -> SyntheticTableSpec:
    return SyntheticTableSpec("user", args.users, 1.0)


class SequenceData:
    """Batches of users, their histories and a candidate; ``batch(step, rank)`` is a pure
    function of (seed, stream, step, rank)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.items = table_sampler(item_spec(args), args.seed * 1000)
        self.users = table_sampler(user_spec(args), args.seed * 1000 + 1)

    def lengths(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """History lengths: Lomax(1.5) (a long tail, mean 2) scaled to --mean-length, at
        least 1, cut at --max-length."""
        raw = rng.pareto(1.5, n) * (self.args.mean_length - 1) / 2.0
        return np.minimum(self.args.max_length, 1 + raw.astype(np.int64))

    def batch(self, step: int, rank: int, stream: int = 0):
        from torchrec.datasets.utils import Batch
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        rng = np.random.default_rng([self.args.seed, stream, step, rank])
        b = self.args.batch_size
        lengths = self.lengths(rng, b)
        history, history_effect = self.items.draw(rng, int(lengths.sum()), step)
        candidate, candidate_effect = self.items.draw(rng, b, step)
        user, user_effect = self.users.draw(rng, b, step)
        owner = np.repeat(np.arange(b), lengths)
        mean_history = np.bincount(owner, history_effect, minlength=b) / lengths
        logit = -0.5 + 1.0 * candidate_effect + 0.8 * mean_history + 0.5 * user_effect
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=list(FEATURES), values=torch.from_numpy(np.concatenate([history, candidate, user]).astype(np.int64)),
            lengths=torch.from_numpy(np.concatenate([lengths, np.ones(2 * b, dtype=np.int64)])))
        return Batch(dense_features=torch.zeros(b, 1), sparse_features=kjt, labels=torch.from_numpy(labels))


def mean_by_sample(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sample's mean row of its ``lengths[i]`` rows of ``values`` (samples in order):
    one index_add over the whole batch, however long the sequences."""
    owner = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    total = torch.zeros(lengths.numel(), values.shape[1], dtype=values.dtype).index_add(0, owner, values)
    return total / lengths.clamp(min=1).unsqueeze(1).to(values.dtype)


torch.fx.wrap("mean_by_sample")  # a leaf of the train pipeline's trace of the model


class SequenceModel(nn.Module):
    """History (averaged), candidate and user embeddings -> MLP -> click logit."""

    def __init__(self, args: argparse.Namespace, device: str = "meta") -> None:
        from torchrec import EmbeddingCollection, EmbeddingConfig

        super().__init__()
        d = args.embedding_dim
        self.ec = EmbeddingCollection(tables=[
            EmbeddingConfig(name="item", num_embeddings=args.items, embedding_dim=d,
                            feature_names=["history", "candidate"]),
            EmbeddingConfig(name="user", num_embeddings=args.users, embedding_dim=d, feature_names=["user"]),
        ], device=torch.device(device))
        self.mlp = nn.Sequential(nn.Linear(4 * d, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, batch):
        jts = self.ec(batch.sparse_features)
        mean = mean_by_sample(jts["history"].values(), jts["history"].lengths())
        candidate, user = jts["candidate"].values(), jts["user"].values()
        logits = self.mlp(torch.cat([mean, candidate, user, mean * candidate], dim=1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


def shard(args: argparse.Namespace, model: SequenceModel, world: int, root: str):
    """Plans with the StorageAwarePlanner and shards with DMP; (dmp, dense optimizer, planner)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_mtrains.planner import StorageAwarePlanner
    from torchrec_mtrains.sharding import TieredEmbeddingCollectionSharder

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    budget = {Tier.DRAM: float(args.dram_budget_bytes) * world}
    if args.scm_budget_bytes is not None:
        budget[Tier.SCM] = float(args.scm_budget_bytes) * world
    planner = StorageAwarePlanner(
        node_of(load_hardware(args.hardware), local_world), batch_size=args.batch_size * world, world_size=world,
        locality={s.name: table_locality(s, args.batch_size * world) for s in (item_spec(args), user_spec(args))},
        budget_bytes=budget, storage_dir=root)
    sharder = TieredEmbeddingCollectionSharder(fused_params={"optimizer": EmbOptimType(OPTIMIZERS[args.optimizer]),
                                                             "learning_rate": args.learning_rate})
    plan = planner.plan(model, [sharder])  # the same on every rank: a pure function of its inputs
    dmp = DistributedModelParallel(model, plan=plan, sharders=[sharder], device=torch.device("cpu"))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.02))
    return dmp, dense, planner


def evaluate(dmp, data: SequenceData, args, rank: int) -> float:
    dmp.eval()
    scores, labels = [], []
    with torch.no_grad():
        for step in range(args.eval_batches):
            _, (_, logits, lab) = dmp(data.batch(step, rank, stream=1))
            scores.append(logits)
            labels.append(lab)
    dmp.train()
    local = torch.stack([torch.cat(scores), torch.cat(labels)])
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    both = torch.cat(gathered, dim=1).numpy()
    return auc(both[0], both[1])


def tiered_stats(dmp) -> Dict[str, Dict[str, float]]:
    """Each tiered shard's tier, lookups, hits and rows moved."""
    out = {}
    for m in dmp.modules():
        for kernel in getattr(m, "tiered_kernels", lambda: [])():
            emb = kernel.emb_module
            for t, (name, s) in enumerate(emb.cache_stats().items()):
                out[name] = {"tier": emb.tiers[t].name, "hit_rate": s["hit_rate"], "lookups": s["lookups"],
                             "rows_loaded": s["rows_loaded"], "cache_capacity_rows": s["cache_capacity_rows"]}
    return out


def train(args: argparse.Namespace, rank: int, world: int, root: str) -> Dict:
    from torchrec_mtrains.sharding import TieredTrainPipeline

    torch.manual_seed(args.seed)
    data = SequenceData(args)
    dmp, dense, planner = shard(args, SequenceModel(args), world, root)
    pipeline = TieredTrainPipeline(dmp, dense, torch.device("cpu"))
    batches = (data.batch(step, rank) for step in range(args.steps))
    losses, times = [], []
    bar = progress_bar(args.steps, disable=rank != 0)  # a bar on a terminal, a line now and then in a log
    try:
        for _ in range(args.steps):
            loss, _, _ = pipeline.progress(batches)  # the model's (loss, logits, labels)
            total = loss.clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
            times.append(time.perf_counter())
            bar.set_postfix({"loss": f"{losses[-1]:.4f}"}, refresh=False)
            bar.update(1)
    finally:
        bar.close()
    pipeline.detach()
    warm = len(times) // 4  # the last three quarters: caches warm
    qps = (len(times) - 1 - warm) * args.batch_size * world / (times[-1] - times[warm]) if len(times) > warm + 1 else 0.0
    lengths = np.concatenate([data.lengths(np.random.default_rng([args.seed, 0, s, rank]), args.batch_size)
                              for s in range(min(args.steps, 20))])
    placement = {name: {"tier": p.tier.name, "cache_rows": p.cache_rows, "hit_rate": p.hit_rate}
                 for name, p in planner.last_placement.tables.items()}
    return {"losses": losses, "auc": evaluate(dmp, data, args, rank), "qps": qps, "placement": placement,
            "tiered": tiered_stats(dmp), "world_size": world, "steps": args.steps, "batch_size": args.batch_size,
            "optimizer": args.optimizer, "learning_rate": args.learning_rate,
            "history_length": {"mean": float(lengths.mean()), "p99": float(np.percentile(lengths, 99)),
                               "max": int(lengths.max())},
            "predicted_qps": planner.last_placement.predicted_qps}


def main(argv: Optional[List[str]] = None) -> int:
    quiet_framework_noise()
    args = parse_args(argv)
    try:
        load_hardware(args.hardware)
    except ValueError as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    if world == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "0")
    init_process_group("gloo", rank=rank, world_size=world)
    made = args.storage_dir is None
    root = [args.storage_dir or (tempfile.mkdtemp(prefix="mtrains-sequence-") if rank == 0 else None)]
    dist.broadcast_object_list(root, src=0)
    try:
        metrics = train(args, rank, world, root[0])
    finally:
        dist.barrier()
        if made and rank == 0:
            import shutil

            shutil.rmtree(root[0], ignore_errors=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
        items = metrics["placement"]["item"]
        print(f"sequence model: {world} ranks, {args.steps} steps; loss {metrics['losses'][0]:.4f} -> "
              f"{metrics['losses'][-1]:.4f}; AUC {metrics['auc']:.4f}; {metrics['qps']:,.0f} QPS; items on "
              f"{items['tier']} (hit rate {items['hit_rate']:.2f} predicted); results in {args.out}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
