"""TorchRec's own model-parallel correctness harness, run with the tiered sharders in place of
TorchRec's (tests/sharding/test_torchrec_harness.py).

TorchRec's wheel ships the harness in ``torchrec.distributed.test_utils``:
``test_sharding.sharding_single_rank_test`` builds TorchRec's ``TestSparseNN`` (bags) or
``TestSequenceSparseNN`` (sequences) unsharded and again on the meta device, plans the
latter with TorchRec's ``EmbeddingShardingPlanner`` from the given ``constraints`` and
``sharders``, shards it with DistributedModelParallel, loads it from the unsharded model
(``copy_state_dict``: in-place writes into the sharded model's ``state_dict()`` tensors),
trains both one step (the unsharded one with SGD, lr 0.1) and compares their predictions on
every rank. This module gives it what TorchRec's own tests give it -- the tables and feature
groups of ``ModelParallelTestShared`` (bags) and of TorchRec's sequence tests, the test
sharders -- and runs many cases in one pair of spawned processes.

A case (``HarnessCase``) names the collection, the sharding type, the harness options (MEAN
pooling, VBE, in-backward optimizers, FP16 tables, quantized comms), whose sharders run it
(TorchRec's: ``create_test_sharder`` / ``TestEmbeddingCollectionSharder``; ours: the same
restrictions over ``TieredEmbeddingBagCollectionSharder`` / ``TieredEmbeddingCollectionSharder``)
and where chosen tables live: on a tier (``dram``, ``scm``, ``ssd``) or TorchRec's
``key_value``; the other tables are FUSED.

How the plans are made: ``key_value`` tables are TorchRec's own vocabulary --
``ParameterConstraints(compute_kernels=["key_value"], key_value_params=KeyValueParams(...),
cache_params=CacheParams(...))`` in the harness's ``constraints`` -- and TorchRec's planner
plans them as a user's script would. TorchRec has no words for a DRAM or SCM table behind a
row cache, and its planner cannot price the ``customized_kernel`` slot on the CPU
("Unrecognized or unsupported compute kernel"), so tier tables are planned as the FUSED
tables they replace (same sharding type, ranks and shards), and the test sharder
(``torchrec_harness_sharders``) turns their plan entries into ``TieredParameterSharding``
entries (``customized_kernel`` with ``TieredParams``) in ``shard()``, just before our
sharder shards the module. Nothing of TorchRec is patched: the harness's planning, DMP, ``copy_state_dict``,
training and comparison run as TorchRec ships them.

Process groups: ``MultiProcessContext`` (inside the harness) creates and destroys the
default group of every case through ``env://``. Each case gets a TCPStore of its own,
bound by the launching process on a port the OS picks (``ports.master_store``) and held
until all cases are done; the ranks join it as clients (``TORCHELASTIC_USE_AGENT_STORE``,
as torchrun's workers do), so no port is guessed and no case sees another's keys.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
import traceback
import types
from typing import Any, Dict, List, Optional

import torch

from tests.support.ports import HOST, master_store

__all__ = ["HarnessCase", "read_result", "run_cases"]

WORLD_SIZE = 2
TIERS = ("dram", "scm", "ssd")
KEY_VALUE = "key_value"
CACHE_LOAD_FACTOR = 0.2  # of a tiered table's rows (TorchRec's and FBGEMM's default)
# TorchRec's in-backward optimizers of its model-parallel tests (its hypothesis strategies).
IN_BACKWARD = {"embedding_bags": ("SGD", 0.01), "embeddings": ("SGD", 0.2)}


@dataclasses.dataclass
class HarnessCase:
    name: str
    collection: str  # "ebc" (TestSparseNN) or "ec" (TestSequenceSparseNN)
    sharding_type: str  # table_wise / row_wise / column_wise
    sharders: str  # "torchrec" (TorchRec's test sharders) or "tiered" (ours)
    placement: Dict[str, str] = dataclasses.field(default_factory=dict)  # table -> dram/scm/ssd/key_value
    pooling: str = "SUM"  # bags: SUM or MEAN (the harness's mean_tables)
    data_type: str = "FP32"
    vbe: bool = False  # variable_batch_per_feature (TorchRec leaves out weighted tables then)
    in_backward: bool = False  # apply_optimizer_in_backward_config: TorchRec's IN_BACKWARD
    in_backward_optimizer: str = ""  # another torch.optim class for it (e.g. "Adam"), at IN_BACKWARD's lr
    in_backward_eps: float = 0.0  # that optimizer's eps (0: its default)
    qcomms: bool = False  # QCommsConfig(forward FP16, backward BF16)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


# ----------------------------------------------------------------- launcher ----
def run_cases(cases: List[HarnessCase], out_dir: str, timeout: float = 480.0) -> None:
    """Runs ``cases`` one after the other in one pair of spawned ranks; each rank writes
    ``<case>.rank<r>.json`` and its output to ``rank<r>.log`` in ``out_dir``. When the ranks
    die in a case, that case is recorded as such and the remaining ones run in fresh
    processes; past ``timeout`` seconds in all, the ranks are killed and the case they were
    in and those after it are recorded as not finished."""
    from tests.support.dmp_harness import _spawn

    pending = list(cases)
    deadline = time.monotonic() + timeout
    while pending:
        stores = [master_store() for _ in pending]  # held until the ranks are done
        args = [c.to_json() for c in pending]
        ports = [s.port for s in stores]
        codes = _spawn(_worker, [(r, args, ports, out_dir) for r in range(WORLD_SIZE)],
                       max(1.0, deadline - time.monotonic()))
        del stores
        rest = [c for c in pending
                if not all(os.path.exists(_result_path(out_dir, c.name, r)) for r in range(WORLD_SIZE))]
        if not rest:
            return
        if codes == [0] * WORLD_SIZE:
            raise RuntimeError(f"the ranks exited without results for {[c.name for c in rest]}")
        if time.monotonic() >= deadline:
            _write_result(out_dir, rest[0].name, -1, {"ok": False, "error": (
                f"the ranks were still in this case after {timeout:.0f} s of cases (killed: exit codes {codes}); "
                f"their output: {out_dir}/rank<r>.log")})
            for c in rest[1:]:
                _write_result(out_dir, c.name, -1, {"ok": False, "error": "not run: the time for all cases ran out"})
            return
        # The ranks died in the first unfinished case: record it, go on without it.
        _write_result(out_dir, rest[0].name, -1, {"ok": False, "error": (
            f"the ranks died in this case (exit codes {codes}); their output: {out_dir}/rank<r>.log")})
        pending = rest[1:]


def _result_path(out_dir: str, name: str, rank: int) -> str:
    return os.path.join(out_dir, f"{name}.rank{rank}.json" if rank >= 0 else f"{name}.launcher.json")


def _write_result(out_dir: str, name: str, rank: int, result: Dict[str, Any]) -> None:
    with open(_result_path(out_dir, name, rank), "w") as f:
        json.dump(result, f)


def read_result(out_dir: str, name: str) -> Dict[str, Any]:
    """The case's outcome: {"ok": bool, "error": each failing rank's exception on one line,
    then where their output is and their tracebacks, "seconds":
    the slowest rank's time, "package": the torchrec_mtrains the ranks imported, "tiered":
    {table: tier} of the shards our sharder put on the tiered kernel, over all ranks}."""
    launcher = _result_path(out_dir, name, -1)
    if os.path.exists(launcher):
        with open(launcher) as f:
            return json.load(f)
    ranks = []
    for r in range(WORLD_SIZE):
        path = _result_path(out_dir, name, r)
        if not os.path.exists(path):
            return {"ok": False, "error": f"rank {r} wrote no result"}
        with open(path) as f:
            ranks.append(json.load(f))
    failed = [r for r, res in enumerate(ranks) if not res["ok"]]
    summary = [f"rank {r}: {ranks[r]['summary']}" for r in failed]
    details = [f"---- rank {r} ----\n{ranks[r]['error']}" for r in failed]
    tiered: Dict[str, set] = {}
    for res in ranks:
        for table, tier in res["tiered"]:
            tiered.setdefault(table, set()).add(tier)
    where = [f"(the ranks' output: {out_dir}/rank<r>.log)"] if failed else []
    return {"ok": not failed, "error": "\n".join(summary + where + details),
            "seconds": max(res["seconds"] for res in ranks), "package": ranks[0]["package"],
            "tiered": {t: "/".join(sorted(v)) for t, v in tiered.items()}}


# ------------------------------------------------------------------- worker ----
def _worker(rank: int, cases_json: List[str], ports: List[int], out_dir: str) -> None:
    # The ranks' own output (TorchRec's planner logs a lot) goes to out_dir/rank<r>.log.
    log = os.open(os.path.join(out_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    from tests.support import torchrec_sequence_model

    torchrec_sequence_model.install()  # before the harness imports it
    import torchrec_mtrains

    os.environ["MASTER_ADDR"] = HOST
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = str(True)
    for case_json, port in zip(cases_json, ports):
        case = HarnessCase(**json.loads(case_json))
        os.environ["MASTER_PORT"] = str(port)
        print(f"==== case {case.name}", flush=True)
        start = time.monotonic()
        case_dir = os.path.join(out_dir, case.name)
        os.makedirs(case_dir, exist_ok=True)
        sharder = None
        try:
            sharder = _sharder(case, case_dir)
            _run_case(case, rank, sharder, case_dir)
            result: Dict[str, Any] = {"ok": True, "error": ""}
        except BaseException as e:  # noqa: BLE001 -- recorded for the test, then the next case
            summary = " ".join(traceback.format_exception_only(type(e), e)).split()
            result = {"ok": False, "summary": " ".join(summary), "error": traceback.format_exc()}
            print(result["error"], flush=True)
        result.update(seconds=time.monotonic() - start, package=torchrec_mtrains.__file__,
                      tiered=sorted(getattr(sharder, "tiered_shards", ())))
        _write_result(out_dir, case.name, rank, result)
        del sharder
        gc.collect()  # frees the case's models (and their kernels' files) before the next case


def _run_case(case: HarnessCase, rank: int, sharder: Any, case_dir: str) -> None:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.test_utils.test_sharding import sharding_single_rank_test

    kwargs = _model_kwargs(case)
    sharding_single_rank_test(
        rank=rank,
        world_size=WORLD_SIZE,
        sharders=[sharder],
        backend="gloo",
        optim=EmbOptimType.EXACT_SGD,
        constraints=_constraints(case, kwargs["tables"], kwargs.get("weighted_tables") or [], case_dir),
        qcomms_config=_qcomms(case),
        apply_optimizer_in_backward_config=_in_backward(case),
        variable_batch_per_feature=case.vbe,
        **kwargs,
    )


def _model_kwargs(case: HarnessCase) -> Dict[str, Any]:
    """The model, tables and feature groups the harness gets from TorchRec's own tests."""
    from torchrec.distributed.test_utils.test_model import TestSparseNN
    from torchrec.modules.embedding_configs import DataType, EmbeddingConfig, PoolingType

    data_type = DataType[case.data_type]
    if case.collection == "ebc":
        from torchrec.distributed.test_utils.test_model_parallel import ModelParallelTestShared

        # ModelParallelTestShared.setUp's fields, then its own table builder.
        shared = types.SimpleNamespace(num_features=4, num_weighted_features=2, num_shared_features=2)
        shared.table_names = [f"table_{i}" for i in range(6)]
        ModelParallelTestShared._build_tables_and_groups(shared, data_type=data_type)
        return dict(
            model_class=TestSparseNN,
            tables=shared.tables if PoolingType[case.pooling] == PoolingType.SUM else shared.mean_tables,
            # TorchRec's VBE tests run without weighted tables (has_weighted_tables=False).
            weighted_tables=None if case.vbe else shared.weighted_tables,
            embedding_groups=shared.embedding_groups,
        )
    if case.collection != "ec":
        raise ValueError(f"collection={case.collection!r} must be 'ebc' or 'ec'")
    from tests.support.torchrec_sequence_model import TestSequenceSparseNN

    # TorchRec's sequence model-parallel tests (SequenceModelParallelTest.setUp).
    tables = [EmbeddingConfig(num_embeddings=(i + 1) * 11, embedding_dim=16, name=f"table_{i}",
                              feature_names=[f"feature_{i}"], data_type=data_type) for i in range(4)]
    tables += [EmbeddingConfig(num_embeddings=(i + 1) * 11, embedding_dim=16, name=f"table_{i + 4}",
                               feature_names=[f"feature_{i}"], data_type=data_type) for i in range(2)]
    shared_features = [f"feature_{i}" for i in range(2)]
    groups = {"group_0": [f"{f}@{t.name}" if f in shared_features else f for t in tables for f in t.feature_names]}
    return dict(model_class=TestSequenceSparseNN, tables=tables, embedding_groups=groups,
                global_constant_batch=True)


def _constraints(case: HarnessCase, tables: List[Any], weighted_tables: List[Any],
                 case_dir: str) -> Optional[Dict[str, Any]]:
    """TorchRec's constraints of the case's sharding type (column-wise: its tests'
    min_partition for the unweighted tables), plus TorchRec's key_value vocabulary for the
    case's key_value tables."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import CacheParams, KeyValueParams

    min_partition = None
    if case.sharding_type == "column_wise":
        min_partition = 4 if case.collection == "ebc" else 8  # as TorchRec's cw tests
    out: Dict[str, Any] = {}
    if min_partition is not None:
        out = {t.name: ParameterConstraints(min_partition=min_partition) for t in tables}
    dims = {t.name: t.embedding_dim for t in tables + weighted_tables}
    for table, where in case.placement.items():
        if where == KEY_VALUE:
            out[table] = ParameterConstraints(
                min_partition=_key_value_min_partition(dims.get(table), min_partition),
                compute_kernels=[KEY_VALUE],
                key_value_params=KeyValueParams(ssd_storage_directory=os.path.join(case_dir, "kv@local_rank")),
                cache_params=CacheParams(load_factor=CACHE_LOAD_FACTOR, algorithm=CacheAlgorithm.LRU),
            )
        elif where not in TIERS:
            raise ValueError(f"{case.name}: table {table} placed on {where!r}, not one of {TIERS + (KEY_VALUE,)}")
    return out or None


def _key_value_min_partition(dim: Optional[int], min_partition: Optional[int]) -> Optional[int]:
    """TorchRec's planner puts at most one column-wise shard of a key_value table on a rank
    ("COLUMN_WISE sharding requires num_shards <= num_devices"): the table's dim split in
    WORLD_SIZE shards when they are multiples of 4, else one shard -- not the FUSED tables'
    ``min_partition``."""
    if min_partition is None or dim is None:
        return min_partition
    split = dim // WORLD_SIZE
    return split if dim % WORLD_SIZE == 0 and split % 4 == 0 else dim


def _qcomms(case: HarnessCase):
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig

    return QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16) if case.qcomms else None


def _in_backward(case: HarnessCase):
    if not case.in_backward:
        return None
    kwargs = {"eps": case.in_backward_eps} if case.in_backward_eps else {}
    return {name: (getattr(torch.optim, case.in_backward_optimizer or opt), {"lr": lr, **kwargs})
            for name, (opt, lr) in IN_BACKWARD.items()}


def _sharder(case: HarnessCase, case_dir: str):
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.test_utils.test_sharding import SharderType, create_test_sharder

    fused = EmbeddingComputeKernel.FUSED.value
    if case.sharders == "torchrec":
        if case.collection == "ebc":
            return create_test_sharder(SharderType.EMBEDDING_BAG_COLLECTION.value, case.sharding_type, fused,
                                       qcomms_config=_qcomms(case), device=torch.device("cpu"))
        from tests.support.torchrec_sequence_model import TestEmbeddingCollectionSharder

        return TestEmbeddingCollectionSharder(sharding_type=case.sharding_type, kernel_type=fused,
                                              qcomms_config=_qcomms(case))
    if case.sharders != "tiered":
        raise ValueError(f"sharders={case.sharders!r} must be 'torchrec' or 'tiered'")
    from tests.support.torchrec_harness_sharders import tiered_test_sharder

    return tiered_test_sharder(case.collection, case.sharding_type, _tier_params(case, case_dir),
                               qcomms_config=_qcomms(case))


def _tier_params(case: HarnessCase, case_dir: str) -> Dict[str, Any]:
    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredParams

    return {table: TieredParams(Tier[where.upper()], cache_load_factor=CACHE_LOAD_FACTOR,
                                storage_dir=os.path.join(case_dir, "tiers"))
            for table, where in case.placement.items() if where in TIERS}
