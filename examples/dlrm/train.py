"""Train TorchRec's DLRM (or DLRM-DCN) with embedding tables on DRAM, SCM and SSD tiers.

torchrun-style: reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
from the environment (defaults: one process) and spawns nothing. Several nodes (torchrun agents)
are planned as WORLD_SIZE / LOCAL_WORLD_SIZE nodes; each node's ranks keep their table files
under that node's --storage-dir. Launch with torchx::

    torchx run -s local_cwd examples/dlrm/component.py:dlrm -- --steps 200
    torchx run -s local_cwd dist.ddp -j 1x2 --script examples/dlrm/train.py -- --steps 200

Exit codes: 0 done; 1 an I/O error while training or checkpointing (a full disk: the message
names the table or checkpoint and the path; the last complete checkpoint stays usable);
2 bad input (flags, hardware profile, data dir), nothing written to --out.
Restarted by torchrun (TORCHELASTIC_RESTART_COUNT > 0) with a checkpoint in --checkpoint-dir,
it resumes from it as with --resume. See docs/example.md and docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checkpoint import checkpointer_of, flush_tiers, latest_checkpoint  # noqa: E402
from checksum import weights_sha256  # noqa: E402
from data import (  # noqa: E402
    CRITEO_ROWS,
    DEFAULT_TABLES,
    DENSE_FEATURES,
    RAW_ID_BITS,
    SyntheticData,
    criteo_batches,
    criteo_files,
    criteo_multi_hot_sizes,
    criteo_splits,
    criteo_table_rows,
    expected_live_ids,
    hashed_down,
    scaled_tables,
    table_locality,
)
from input_cost import input_seconds_per_sample  # noqa: E402
from placement import (  # noqa: E402
    DEFAULT_PROFILE,
    TableInfo,
    check_fits,
    is_tiered,
    load_hardware,
    make_planner,
    parse_bytes,
    placement_rows,
    tier_of,
)
from progress import progress_bar  # noqa: E402
from report import auc, format_table, write_outputs  # noqa: E402
from run_config import load_run_config, preset_path  # noqa: E402
from tier_report import max_over_mean, rows_read_per_rank, tier_counters  # noqa: E402

from torchrec_mtrains.checkpoint.quantize import QUANTIZE_KINDS  # noqa: E402
from torchrec_mtrains.commands.quiet import quiet_framework_noise  # noqa: E402
from torchrec_mtrains.elastic import exit_when_agent_dies, init_process_group, stop_if_orphaned  # noqa: E402
from torchrec_mtrains.planner.hardware.units import parse_quantity  # noqa: E402
from torchrec_mtrains.testing.faults import fault_point  # noqa: E402

EXIT_IO_ERROR = 1
EXIT_BAD_INPUT = 2
DEFAULT_DRAM_BUDGET = "64MiB"  # per rank: the default model then needs SCM and SSD
DEFAULT_SCM_BUDGET = "128MiB"  # per rank: SCM is the scarce middle tier (PMem / CXL), the rest goes to SSD
VIRTUAL_MIN_ROWS = 500_000  # --virtual-tables: tables of at least this many rows become virtual
VIRTUAL_BUCKETS = 1024  # a virtual table's buckets (TorchRec's total_num_buckets): ranks take runs of them
VIRTUAL_ROOM = 2.0  # a virtual table holds this many times the distinct ids the run is expected to draw
VIRTUAL_TRIGGER = 0.8  # ...and evicts once a rank holds this share of them (room for a step's new ids)


class BadInput(ValueError):
    """User input the run cannot work with: reported, exit code 2."""


def _row_wise(args: argparse.Namespace, tables) -> List[str]:
    """``--row-wise`` as table names; ValueError naming an unknown one."""
    names = [n.strip() for n in args.row_wise.split(",") if n.strip()]
    known = {t.name for t in tables}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--row-wise names unknown tables {unknown}; the tables are {sorted(known)}")
    return names


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=None,
                   help="YAML of flag defaults and synthetic tables (see run_config.py); flags given here win")
    p.add_argument("--preset", default=None,
                   help="a shipped --config by name: beyond-ram (tables larger than this machine's RAM)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="hash every table's ids down into at most this many rows (the all-DRAM baseline of a "
                        "model too large for DRAM)")
    p.add_argument("--steps", type=int, default=200, help="train until this global step")
    p.add_argument("--batch-size", type=int, default=512, help="samples per rank and step")
    p.add_argument("--seed", type=int, default=0, help="data and initial weights")
    p.add_argument("--embedding-dim", type=int, default=32, help="dim of every table (multiple of 4)")
    p.add_argument("--table-scale", type=float, default=1.0,
                   help="synthetic tables get this fraction of their rows (at least 1,000): small runs for tests")
    p.add_argument("--drift", type=float, default=0.01,
                   help="share of each synthetic table's ranked rows that move to fresh ids per step, in [0, 1)")
    p.add_argument("--dcn", action="store_true", help="DLRM-DCN (cross layers) instead of DLRM's dot interaction")
    p.add_argument("--virtual-tables", action="store_true",
                   help=f"the tables of >= {VIRTUAL_MIN_ROWS:,} rows become virtual tables (use_virtual_table) fed "
                        f"raw ids from [0, 2^{RAW_ID_BITS}): each id its own row, none hashed together")
    p.add_argument("--lookahead", type=int, default=None,
                   help="the tiered tables' look-ahead window in batches (their plans keep every row the next "
                        "LOOKAHEAD batches use; the pipeline prefetches that far ahead); default: the planner's")
    p.add_argument("--row-wise", default="",
                   help="comma-separated tables the planner must shard row-wise (TorchRec's ParameterConstraints "
                        "sharding_types); the others it shards as it predicts best")
    p.add_argument("--hardware", default=DEFAULT_PROFILE,
                   help="hardware profile: a shipped name (local) or a YAML file (`mtrains probe-hw --out F`)")
    p.add_argument("--dram-budget", default=DEFAULT_DRAM_BUDGET,
                   help="DRAM per rank the embeddings may use (FUSED tables + row caches), e.g. 64MiB, 2GB")
    p.add_argument("--scm-budget", default=DEFAULT_SCM_BUDGET,
                   help="SCM per rank the embeddings may use (tables and their files), e.g. 128MiB; 'none': "
                        "as much as the hardware profile has")
    p.add_argument("--target-qps", type=float, default=None,
                   help="throughput the planner must feed from the tiers (samples/s, all ranks; default: as fast "
                        "as the embedding compute, i.e. tiers must not slow the step)")
    p.add_argument("--input-time-per-sample", default="measure",
                   help="CPU time a rank spends making one sample's input (e.g. 10us), which the planner adds to "
                        "the step it predicts and plans for; 'measure' (default): timed on a few batches at start, "
                        "the slowest rank's")
    p.add_argument("--storage-dir", default=None,
                   help="where this node's SCM/SSD table files go (each rank in "
                        "rank_<r>/; a node-local disk; default: a temp dir)")
    p.add_argument("--criteo-dir", "--data-dir", dest="data_dir", default=None,
                   help="Criteo in TorchRec's npy form, made by `python -m torchrec.datasets.scripts."
                        "npy_preproc_criteo` (default: synthetic data)")
    p.add_argument("--criteo-rows", default=str(CRITEO_ROWS),
                   help="rows of each Criteo table (ids hashed into them): one count, or 26 comma-separated; "
                        "--max-rows caps them")
    p.add_argument("--criteo-multi-hot", action="store_true",
                   help="--criteo-dir holds MLPerf DLRM-DCNv2's multi-hot files (<name>_sparse_multi_hot.npz)")
    p.add_argument("--checkpoint-dir", default=None, help="DCP checkpoints go here")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save every N steps (0: never): a delta of the tiered rows written since the last save")
    p.add_argument("--full-every", type=int, default=4,
                   help="every K-th save is a full one (all tiered rows that left their initial value)")
    p.add_argument("--keep-chains", type=int, default=1, help="keep the N newest checkpoint chains")
    p.add_argument("--max-chain-fraction", type=float, default=1.0,
                   help="a full save comes sooner once a chain's deltas would hold more rows than this fraction of "
                        "its full save's (what a restore reads beyond the full save)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--resume-from", default=None, metavar="STEP_DIR",
                   help="continue from this checkpoint step (a step_* directory; --checkpoint-dir defaults to "
                        "its parent)")
    p.add_argument("--async-checkpoint", action="store_true",
                   help="save in the background: training stops only for the save's snapshot, and the rows are "
                        "written while it goes on (latest moves once a save is complete)")
    p.add_argument("--checkpoint-quantize", choices=QUANTIZE_KINDS, default=None,
                   help="deltas store their rows' weights in this lossy encoding (full steps and optimizer state "
                        "stay exact; default: exact)")
    p.add_argument("--copy-ssd-tables", action="store_true",
                   help="checkpoints copy the rows of SSD tables (default: link the block-store file and save "
                        "its location map)")
    p.add_argument("--weights-checksum", action="store_true",
                   help="metrics.json gets weights_sha256, a SHA-256 of the trained weights (to compare runs; reads "
                        "every row from its tier: seconds for the default model)")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per rank for the final AUC")
    p.add_argument("--log-every", type=int, default=10, help="progress-bar / AUC-curve update interval (steps)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo); cuda (nccl) is not built")
    p.add_argument("--out", default="build/example-run", help="output directory (metrics.json, plots)")
    first, _ = p.parse_known_args(argv)
    tables = None
    if first.config and first.preset:
        p.error("give --config or --preset, not both")
    if first.config or first.preset:
        try:
            path = first.config or preset_path(first.preset)
            defaults, tables = load_run_config(path, {a.dest: a.default for a in p._actions})
        except ValueError as e:
            p.error(str(e))
        p.set_defaults(**defaults)
    args = p.parse_args(argv)
    args.tables = list(DEFAULT_TABLES) if tables is None else tables
    if args.max_rows is not None and args.max_rows < 1:
        p.error(f"--max-rows must be >= 1, got {args.max_rows}")
    for name in ("steps", "batch_size", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint_every < 0 or args.eval_batches < 0:
        p.error("--checkpoint-every and --eval-batches must be >= 0")
    if args.full_every < 1 or args.keep_chains < 1:
        p.error("--full-every and --keep-chains must be >= 1")
    if not args.max_chain_fraction > 0:
        p.error(f"--max-chain-fraction must be > 0, got {args.max_chain_fraction}")
    if not 0 <= args.drift < 1:
        p.error(f"--drift must be in [0, 1), got {args.drift}")
    if not 0 < args.table_scale <= 1:
        p.error(f"--table-scale must be in (0, 1], got {args.table_scale}")
    if args.embedding_dim < 4 or args.embedding_dim % 4:
        p.error(f"--embedding-dim must be a positive multiple of 4, got {args.embedding_dim}")
    if args.resume_from:
        args.resume = True
        args.checkpoint_dir = args.checkpoint_dir or os.path.dirname(os.path.abspath(args.resume_from))
    if args.criteo_multi_hot and not args.data_dir:
        p.error("--criteo-multi-hot needs --criteo-dir")
    try:
        criteo_table_rows(args.criteo_rows)
    except ValueError as e:
        p.error(str(e))
    if (args.checkpoint_every or args.resume) and not args.checkpoint_dir:
        p.error("--checkpoint-every and --resume need --checkpoint-dir")
    if args.virtual_tables:
        clash = [f for f, on in (("--weights-checksum", args.weights_checksum), ("--criteo-dir", args.data_dir)) if on]
        if clash:
            p.error(f"--virtual-tables does not work with {', '.join(clash)}: a virtual table has no state_dict "
                    "of rows to hash (its rows are keyed by id), and Criteo's ids come hashed already "
                    "(docs/virtual-tables.md)")
    try:
        args.dram_budget_bytes = parse_bytes(args.dram_budget, "--dram-budget")
        args.scm_budget_bytes = (None if str(args.scm_budget).lower() == "none"
                                 else parse_bytes(args.scm_budget, "--scm-budget"))
        args.input_s_per_sample = (None if str(args.input_time_per_sample).lower() == "measure" else
                                   parse_quantity(args.input_time_per_sample, "time", "--input-time-per-sample"))
    except ValueError as e:
        p.error(str(e))
    return args


def dist_env() -> Tuple[int, int, int]:
    """(rank, world size, local rank) from the environment torchrun sets."""
    try:
        return tuple(int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)))
    except ValueError as e:
        raise BadInput(f"bad torchrun environment: {e}") from None


def node_shape(world: int) -> Tuple[int, int]:
    """(ranks per node, nodes) of a job of ``world`` ranks: torchrun's LOCAL_WORLD_SIZE ranks
    on each node (default: all on one node)."""
    text = os.environ.get("LOCAL_WORLD_SIZE", str(world))
    try:
        local = int(text)
    except ValueError:
        raise BadInput(f"bad torchrun environment: LOCAL_WORLD_SIZE={text!r} is not an integer") from None
    if local < 1 or world % local:
        raise BadInput(f"bad torchrun environment: LOCAL_WORLD_SIZE={local} does not divide WORLD_SIZE={world} "
                       "(every node must run as many ranks)")
    return local, world // local


def table_infos(args: argparse.Namespace) -> Tuple[List[TableInfo], Optional[List[str]]]:
    """The model's tables, and the Criteo file prefixes when --data-dir is given."""
    if args.data_dir:
        from torchrec.datasets.criteo import DEFAULT_CAT_NAMES

        try:
            prefixes = criteo_files(args.data_dir, args.criteo_multi_hot)
            rows = criteo_table_rows(args.criteo_rows, args.max_rows)
            ids = criteo_multi_hot_sizes(prefixes[0]) if args.criteo_multi_hot else [1] * len(rows)
        except (ValueError, OSError) as e:
            raise BadInput(str(e)) from None
        return [TableInfo(f"t_{n}", r, args.embedding_dim, {"pooling_factor": float(k), "zipf_alpha": 1.05})
                for n, r, k in zip(DEFAULT_CAT_NAMES, rows, ids)], prefixes
    world = dist_env()[1]
    full = scaled_tables(args.table_scale, args.tables)
    virtual = set(virtual_names(args, full))
    infos = []
    for spec, t in zip(full, hashed_down(full, args.max_rows)):
        locality = table_locality(t, args.batch_size * world, args.steps, args.drift)
        if spec.name not in virtual:
            infos.append(TableInfo(t.name, t.num_rows, args.embedding_dim, locality))
            continue
        # Sized by the ids the run draws (the planner's live_ids), not by its id space.
        live = expected_live_ids(spec, args.batch_size * world, args.steps, args.drift)
        locality = {**table_locality(spec, args.batch_size * world, None, args.drift),
                    "live_ids": int(VIRTUAL_ROOM * live) + 4096}
        infos.append(TableInfo(spec.name, 1 << RAW_ID_BITS, args.embedding_dim, locality, virtual=True,
                               source_rows=spec.num_rows))
    return infos, None


def virtual_names(args: argparse.Namespace, specs) -> List[str]:
    """The tables --virtual-tables makes virtual: the large ones."""
    return [t.name for t in specs if args.virtual_tables and t.num_rows >= VIRTUAL_MIN_ROWS]


def build_model(args: argparse.Namespace, tables: List[TableInfo], features: List[str]):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain

    configs = [virtual_config(t, f) if t.virtual else
               EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                  feature_names=[f]) for t, f in zip(tables, features)]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    dense_sizes, over_sizes = [128, args.embedding_dim], [256, 128, 1]
    if args.dcn:
        net = DLRM_DCN(ebc, DENSE_FEATURES, dense_sizes, over_sizes, dcn_num_layers=2, dcn_low_rank_dim=16)
    else:
        net = DLRM(ebc, DENSE_FEATURES, dense_sizes, over_sizes)
    return DLRMTrain(net)


def virtual_config(t: TableInfo, feature: str):
    """TorchRec's config of a virtual table: its ids are keys in [0, 2^RAW_ID_BITS), split into
    buckets over the ranks; a count policy evicts the ids seen once (their count decayed
    below 1) when a rank nears the live ids it is planned for; initial weights as the dense
    table's."""
    from torchrec import EmbeddingBagConfig
    from torchrec.modules.embedding_configs import CountBasedEvictionPolicy

    world = dist_env()[1]
    live = int(t.locality["live_ids"])
    bound = (1.0 / t.source_rows) ** 0.5
    policy = CountBasedEvictionPolicy(training_id_eviction_trigger_count=int(VIRTUAL_TRIGGER * live / world),
                                      eviction_threshold=1, decay_rate=0.99)
    return EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                              feature_names=[feature], use_virtual_table=True, total_num_buckets=VIRTUAL_BUCKETS,
                              virtual_table_eviction_policy=policy, weight_init_min=-bound, weight_init_max=bound)


def shard(args, model, planner):
    """DMP with our sharder; returns (dmp, dense optimizer, combined optimizer)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

    ebc = model.model.sparse_arch.embedding_bag_collection
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    sharders = [TieredEmbeddingBagCollectionSharder()]
    plan = planner.plan(model, sharders)  # the same on every rank: a pure function of its inputs
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=torch.device("cpu"))
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.02))
    return dmp, dense, CombinedOptimizer([dmp.fused_optimizer, dense])


def cache_counts(dmp, names: List[str]) -> torch.Tensor:
    """[tables, 2] (hits, unique rows per step, summed) of this rank's tiered shards."""
    from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection

    out = torch.zeros(len(names), 2, dtype=torch.float64)
    index = {n: i for i, n in enumerate(names)}
    for m in dmp.modules():
        if isinstance(m, ShardedTieredEmbeddingBagCollection):
            for kernel in m.tiered_kernels():
                for shard_name, s in kernel.emb_module.cache_stats().items():
                    i = index[shard_name.split(".r")[0]]
                    out[i, 0] += s["hits"]
                    out[i, 1] += s["unique_rows"]
    return out


def global_cache_counts(dmp, placement: Dict[str, str]) -> torch.Tensor:
    """``cache_counts`` of every tiered table summed over all ranks (a collective); rows in
    the order of ``tiered_names(placement)``."""
    counts = cache_counts(dmp, tiered_names(placement))
    dist.all_reduce(counts)
    return counts


def tiered_names(placement: Dict[str, str]) -> List[str]:
    return sorted(t for t, tier in placement.items() if tier in ("SCM", "SSD", "DRAM"))


def hit_rates(dmp, placement: Dict[str, str]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Per tiered table and per tier, over all ranks (a collective)."""
    return rates_of(global_cache_counts(dmp, placement), placement)


def rates_of(counts: torch.Tensor, placement: Dict[str, str]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Per tiered table and per tier, from ``global_cache_counts`` (or a difference of two)."""
    names = tiered_names(placement)
    per_table = {n: float(c[0] / c[1]) if c[1] else float("nan") for n, c in zip(names, counts)}
    per_tier: Dict[str, float] = {}
    for tier in sorted({placement[n] for n in names}):
        c = sum(counts[i] for i, n in enumerate(names) if placement[n] == tier)
        per_tier[tier] = float(c[0] / c[1]) if c[1] else float("nan")
    return per_table, per_tier


def evaluate(dmp, batches, rank: int) -> float:
    """AUC over held-out batches, gathered from all ranks."""
    dmp.eval()
    scores, labels = [], []
    with torch.no_grad():
        for batch in batches:
            _, (_, logits, lab) = dmp(batch)
            scores.append(logits.float())
            labels.append(lab.float())
    dmp.train()
    local = torch.stack([torch.cat(scores), torch.cat(labels)]) if scores else torch.zeros(2, 0)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    both = torch.cat(gathered, dim=1).numpy()
    return auc(both[0], both[1]) if both.size else float("nan")


class Trainer:
    """The training loop: pipeline, losses, AUC windows, progress bar, checkpoints."""

    def __init__(self, args, dmp, dense_opt, optimizer, placement: Dict[str, str], rank: int, world: int,
                 lookahead: int = 0) -> None:
        from torchrec_mtrains.sharding import TieredTrainPipeline

        self.args, self.dmp, self.dense_opt, self.rank, self.world = args, dmp, dense_opt, rank, world
        self.placement = placement
        self.pipeline = TieredTrainPipeline(dmp, optimizer, torch.device("cpu"), lookahead=lookahead)
        self.checkpointer = checkpointer_of(args) if args.checkpoint_dir else None
        self.checkpoints: List[Dict] = []  # this run's saves, for metrics.json
        self.state: Dict = {"losses": [], "auc_curve": [], "seed": args.seed}
        self.window: List[Tuple[np.ndarray, np.ndarray]] = []
        self.step_times: List[float] = []
        # Global cache counts when the run's last quarter starts: the hit rate after it is
        # the warm caches' (what the planner predicts), without the cold start.
        self.warm_from: Optional[torch.Tensor] = None
        self.warm_from_step: Optional[int] = None

    def run(self, batches, start: int) -> None:
        bar = progress_bar(self.args.steps, initial=start, disable=self.rank != 0)
        try:
            self._loop(bar, batches, start)
            if self.checkpointer is not None:
                self._record(self.checkpointer.wait())  # the last save in the background
        finally:
            bar.close()  # an error message then starts on a line of its own

    def _loop(self, bar, batches, start: int) -> None:
        step = start
        last_quarter = start + (3 * (self.args.steps - start)) // 4
        while True:
            try:
                loss, logits, labels = self.pipeline.progress(batches)
            except StopIteration:
                break
            step += 1
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            self.state["losses"].append(float(loss) / self.world)
            self.step_times.append(time.perf_counter())
            self.window.append((logits.float().numpy(), labels.float().numpy()))
            fault_point("step")
            bar.update(1)
            if step % self.args.log_every == 0 or step == self.args.steps:
                self._log(bar, step)
            if step == last_quarter < self.args.steps:  # every rank reaches it: a collective is safe
                self.warm_from, self.warm_from_step = global_cache_counts(self.dmp, self.placement), step
            if self.args.checkpoint_every and step % self.args.checkpoint_every == 0:
                self._checkpoint(step)

    def _checkpoint(self, step: int) -> None:
        ckpt = self.checkpointer
        if self.args.async_checkpoint:  # the previous one ends first (its failure raised here)
            self._record(ckpt.wait())
            ckpt.async_save(step, self.dmp, self.dense_opt, self.state)
        else:
            self._record(ckpt.save(step, self.dmp, self.dense_opt, self.state))

    def _record(self, record) -> None:
        if record is not None:
            self.checkpoints.append(record.as_dict())

    def _log(self, bar, step: int) -> None:
        scores = np.concatenate([w[0] for w in self.window])
        labels = np.concatenate([w[1] for w in self.window])
        self.state["auc_curve"].append({"step": step, "auc": auc(scores, labels)})
        self.window.clear()
        _, per_tier = hit_rates(self.dmp, self.placement)
        info = {"loss": f"{self.state['losses'][-1]:.4f}", "qps": f"{self.qps():,.0f}"}
        info.update({f"hit_{t}": f"{h:.3f}" for t, h in per_tier.items()})
        bar.set_postfix(info, refresh=True)

    def qps(self) -> float:
        """Global samples per second over this run's steps after the first (warm-up)."""
        if len(self.step_times) < 2:
            return float("nan")
        span = self.step_times[-1] - self.step_times[0]
        return (len(self.step_times) - 1) * self.args.batch_size * self.world / span if span > 0 else float("nan")


def prepare(args) -> Tuple[List[TableInfo], Optional[List[str]], object]:
    """Everything that can fail on user input, before any process group: exits 2 on error."""
    rank, world, _ = dist_env()
    local_world, _ = node_shape(world)
    tables, prefixes = table_infos(args)
    try:
        hardware = load_hardware(args.hardware)
        planner = make_planner(hardware, tables, world, args.batch_size, args.dram_budget_bytes, "<storage-dir>",
                               args.target_qps, args.scm_budget_bytes, local_world, lookahead=args.lookahead)
        check_fits(planner, build_model(args, tables, [f"f_{t.name}" for t in tables]), args.dram_budget)
        _row_wise(args, tables)
    except ValueError as e:
        raise BadInput(str(e)) from None
    try:
        latest = latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
    except ValueError as e:  # a damaged `latest` pointer
        raise BadInput(str(e)) from None
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if not args.resume and restarts > 0 and latest:
        args.resume = True  # torchrun restarted the job: continue from its last checkpoint
        if rank == 0:
            print(f"train.py: restart {restarts}: resuming from {latest}",
                  file=sys.stderr, flush=True)
    if args.resume_from and not os.path.exists(os.path.join(args.resume_from, "trainer.json")):
        raise BadInput(f"--resume-from: {args.resume_from!r} is not a complete checkpoint step (no trainer.json)")
    if args.resume and not args.resume_from and latest is None:
        raise BadInput(f"--resume: no complete checkpoint in {args.checkpoint_dir!r}")
    if args.device == "cuda":
        raise BadInput("--device cuda: the tiered kernel is CPU-only in this build (see docs/sharding.md)")
    return tables, prefixes, hardware


def storage_root(args, rank: int) -> Tuple[str, bool]:
    """The run's storage directory; (path, made here). --storage-dir is each node's own
    (node-local); the default temp dir has rank 0's path on every node (created by the
    tables that need it, removed by each node's local rank 0)."""
    if args.storage_dir:
        return args.storage_dir, False
    obj = [tempfile.mkdtemp(prefix="mtrains-dlrm-") if rank == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    return obj[0], True


def main(argv: Optional[List[str]] = None) -> int:
    quiet_framework_noise()
    args = parse_args(argv)
    try:
        tables, prefixes, hardware = prepare(args)
    except BadInput as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rank, world, local_rank = dist_env()
    local_world, _ = node_shape(world)
    exit_when_agent_dies(f"train.py rank {rank}")  # no orphan trains on if torchrun's agent dies
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # the node's cores over its ranks
    if world == 1:  # a plain `python train.py`: a process group of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "0")  # the OS picks a free one: runs side by side never collide
    init_process_group("gloo", rank=rank, world_size=world)
    root, made = storage_root(args, rank)
    try:
        code = train(args, tables, prefixes, hardware, root, rank, world)
    except OSError as e:
        stop_if_orphaned()
        # A full disk, a failing device: the message names the table or checkpoint and the
        # path. No collective here: the other ranks may be stuck in one (torchrun ends them).
        # On a line of its own: rank 0's progress bar may be mid-line on the same stream.
        print(f"\ntrain.py: error (rank {rank}): {e}", file=sys.stderr, flush=True)
        if made and local_rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        return EXIT_IO_ERROR
    except BaseException:
        stop_if_orphaned()  # a collective failed because a peer stopped: the agent is gone
        raise
    dist.barrier()
    if made and local_rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()
    return code


def criteo_train_batches(args, tables: List[TableInfo], prefixes: List[str], rank: int, world: int):
    """This rank's training batches of the Criteo files (TorchRec's split), from the start."""
    files, stage = criteo_splits(prefixes)["train"]
    return criteo_batches(files, args.batch_size, rank, world, [t.num_embeddings for t in tables], stage,
                          args.criteo_multi_hot)


def criteo_iterators(args, tables: List[TableInfo], prefixes: List[str], rank: int, world: int, start: int):
    """(training batches from step ``start``, held-out batches) of this rank from the Criteo
    files: TorchRec's split (``criteo_splits``), ids hashed into each table's rows."""
    import itertools

    hashes = [t.num_embeddings for t in tables]
    eval_files, eval_stage = criteo_splits(prefixes)["eval"]
    train_data = criteo_train_batches(args, tables, prefixes, rank, world)
    if rank == 0 and len(train_data) < args.steps:
        print(f"train.py: note: {args.data_dir} holds {len(train_data)} batches per rank: training stops there, "
              f"before --steps {args.steps}", file=sys.stderr, flush=True)
    eval_data = criteo_batches(eval_files, args.batch_size, rank, world, hashes, eval_stage, args.criteo_multi_hot)
    return itertools.islice(train_data, start, args.steps), itertools.islice(eval_data, args.eval_batches)


def train(args, tables, prefixes, hardware, root: str, rank: int, world: int) -> int:
    t0 = time.perf_counter()
    local_world, nodes = node_shape(world)
    if prefixes:
        from torchrec.datasets.criteo import DEFAULT_CAT_NAMES

        features = list(DEFAULT_CAT_NAMES)
    else:
        data = SyntheticData(scaled_tables(args.table_scale, args.tables), args.batch_size, args.seed, args.drift,
                             args.max_rows, raw_id_tables=[t.name for t in tables if t.virtual])
        features = data.feature_names()
    input_s = args.input_s_per_sample
    if input_s is None:  # --input-time-per-sample measure: time this rank's own batches
        sample = (criteo_train_batches(args, tables, prefixes, rank, world) if prefixes
                  else data.batches(0, args.steps, rank, stream=2))  # a stream training never draws
        input_s = input_seconds_per_sample(sample, args.batch_size)
    planner = make_planner(hardware, tables, world, args.batch_size, args.dram_budget_bytes, root, args.target_qps,
                           args.scm_budget_bytes, local_world, input_s, row_wise=_row_wise(args, tables),
                           lookahead=args.lookahead)
    torch.manual_seed(args.seed)
    dmp, dense_opt, optimizer = shard(args, build_model(args, tables, features), planner)
    placement, rows = tier_of(planner), placement_rows(planner)
    tiered = {t: tier for t, tier in placement.items() if is_tiered(planner, t)}
    trainer = Trainer(args, dmp, dense_opt, optimizer, tiered, rank, world, planner.last_lookahead)
    if trainer.checkpointer is not None:
        # Held until the job ends, as each rank's storage directory is (its tables lock it
        # when sharded): a second job on the same checkpoint directory stops here, before
        # it trains or writes anything.
        trainer.checkpointer.claim_directory()
    start, restore_seconds = 0, None
    if args.resume:
        t0 = time.perf_counter()
        trainer.state = trainer.checkpointer.restore(dmp, dense_opt, path=args.resume_from)
        restore_seconds = time.perf_counter() - t0
        start = trainer.state.pop("step")
        if trainer.state.get("seed") != args.seed:
            print(f"train.py: warning: checkpoint seed {trainer.state.get('seed')} != --seed {args.seed}",
                  file=sys.stderr)
    if rank == 0:
        p = planner.last_placement
        print(f"placement by StorageAwarePlanner ({hardware.name}, --dram-budget {args.dram_budget}, "
              f"--scm-budget {args.scm_budget} per rank, "
              f"{world} ranks on {nodes} node{'s' if nodes > 1 else ''} of {local_world}; predicted "
              f"{p.predicted_qps:,.0f} QPS, the input batches {input_s * args.batch_size * 1e3:.1f} ms per rank "
              f"and step of it; predicted step per rank: "
              + ", ".join(f"{r}: {s * 1e3:.1f} ms" for r, s in enumerate(planner.last_rank_step_s))
              + f"; look-ahead window {planner.last_lookahead} batches):\n" + format_table(rows), flush=True)
    if prefixes:
        train_it, eval_it = criteo_iterators(args, tables, prefixes, rank, world, start)
    else:
        train_it = data.batches(start, args.steps, rank)
        eval_it = data.batches(0, args.eval_batches, rank, stream=1)
    trainer.run(train_it, start)
    trainer.pipeline.detach()  # the model's own forward again, for the evaluation
    final_auc = evaluate(dmp, eval_it, rank)
    counts = global_cache_counts(dmp, tiered)
    per_table, per_tier = rates_of(counts, tiered)
    flush_tiers(dmp)  # every row trained is on its tier: what the run materialised
    tiers = tier_counters(dmp, trainer.step_times)
    checksum = weights_sha256(dmp) if args.weights_checksum else None
    warm_table, warm_tier = rates_of(counts - trainer.warm_from, tiered) if trainer.warm_from is not None else ({}, {})
    metrics = {
        "losses": trainer.state["losses"], "qps": trainer.qps(), "auc": final_auc,
        "hit_rate": per_table, "hit_rate_per_tier": per_tier, "placement": placement,
        "hit_rate_warm": warm_table, "hit_rate_warm_per_tier": warm_tier, "hit_rate_warm_from_step": trainer.warm_from_step,
        "auc_curve": trainer.state["auc_curve"], "steps": args.steps, "resumed_from": start,
        "restore_seconds": restore_seconds,
        "world_size": world, "nodes": nodes, "ranks_per_node": local_world, "weights_sha256": checksum,
        "batch_size_per_rank": args.batch_size, "hardware": hardware.name,
        "dram_budget_bytes_per_rank": args.dram_budget_bytes, "scm_budget_bytes_per_rank": args.scm_budget_bytes,
        "dcn": args.dcn,
        "predicted_qps": planner.last_placement.predicted_qps,
        "lookahead": planner.last_lookahead,
        "input_seconds_per_sample": input_s,
        "predicted_hit_rate": {t: planner.last_placement.tables[t].hit_rate for t in tiered},
        "data": "criteo" if prefixes else "synthetic", "wall_seconds": time.perf_counter() - t0,
        "step_times": [t - trainer.step_times[0] for t in trainer.step_times] if trainer.step_times else [],
        "predicted_step_seconds": (args.batch_size * world / planner.last_placement.predicted_qps
                                   if planner.last_placement.predicted_qps > 0 else float("nan")),
        "predicted_rank_step_seconds": list(planner.last_rank_step_s),
        "tiers": tiers, "table_rows": {t.name: t.num_embeddings for t in tables},
        "embedding_dim": args.embedding_dim, "checkpoints": trainer.checkpoints,
        "virtual_tables": sorted(t.name for t in tables if t.virtual),
    }
    if rank == 0:
        finish(args, metrics, rows)
    return 0


def finish(args, metrics: Dict, rows: List[Dict]) -> None:
    """Prints the summary and writes --out (rank 0)."""
    warm_from = metrics.get("hit_rate_warm_from_step")
    for r in rows:
        h = metrics["hit_rate"].get(r["table"])
        r["hit_rate"] = "-" if h is None else f"{h:.3f}"
        if warm_from is not None:
            h = metrics["hit_rate_warm"].get(r["table"])
            r[f"hit_after_{warm_from}"] = "-" if h is None else f"{h:.3f}"
    lines = [
        "placement and cache hit rates (unique rows per step found in the row cache"
        + (f"; hit_after_{warm_from}: over the steps after {warm_from}, warm caches" if warm_from is not None else "")
        + "):",
        format_table(rows),
        f"QPS (samples/s, all ranks, steps after the first of this run): {metrics['qps']:,.0f} measured, "
        f"{metrics['predicted_qps']:,.0f} predicted by the planner (predicted / measured "
        f"{metrics['predicted_qps'] / metrics['qps']:.2f})",
        "hit rate per tier: " + ", ".join(f"{t} {h:.3f}" for t, h in metrics["hit_rate_per_tier"].items()),
    ]
    ranks = metrics["tiers"].get("ranks", [])
    if ranks:
        reads = rows_read_per_rank(ranks)
        device = [r.get("tier_device_reads", 0.0) for r in ranks]
        predicted = metrics["predicted_rank_step_seconds"] or [float("nan")] * len(ranks)
        lines.append("per rank, step predicted / measured (median), rows read from its tiers (first touches, "
                     "made in place, apart) and SSD device reads: " + "; ".join(
                         f"{i}: {p * 1e3:.1f} / {r['step_seconds_median'] * 1e3:.1f} ms, {n:,.0f} rows "
                         f"(+{r.get('tier_first_touches', 0.0):,.0f} first touches), {d:,.0f} device reads"
                         for i, (p, r, n, d) in enumerate(zip(predicted, ranks, reads, device)))
                     + "".join(f" ({what} max / mean {max_over_mean(v):.2f})"
                               for what, v in (("rows read", reads), ("device reads", device)) if sum(v) > 0))
    if warm_from is not None and metrics["hit_rate_warm_per_tier"]:
        lines.append(f"hit rate per tier after step {warm_from}: "
                     + ", ".join(f"{t} {h:.3f}" for t, h in metrics["hit_rate_warm_per_tier"].items()))
    text = "\n".join(lines + [
        f"AUC (held-out, {args.eval_batches} batches per rank): {metrics['auc']:.4f}",
        f"loss: first {metrics['losses'][0]:.4f}, last {metrics['losses'][-1]:.4f} ({len(metrics['losses'])} steps)",
    ])
    notes = write_outputs(args.out, metrics, text)
    print(text + "".join(f"\nnote: {n}" for n in notes) + f"\nresults in {os.path.abspath(args.out)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
