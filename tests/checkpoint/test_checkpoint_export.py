"""export_full_checkpoint: a differential chain (a full step and two deltas) of a model with
tiered tables, trained in this process, becomes one plain DCP checkpoint that loads with
``dcp.load`` into a model whose tables are all TorchRec's own (FUSED) and with
``DifferentialCheckpointer.restore`` into a tiered one, to the trained state exactly; of a
chain saved by two ranks (row- and column-wise shards), it equals what the checkpoints before
differential ones saved of the same model."""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any, Dict, Iterator, Tuple

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from tests.support import dmp_harness as h
from tests.support.dcp_files import read_dcp
from tests.support.ports import file_init_method
from torchrec_mtrains.checkpoint import (
    ChainError,
    DifferentialCheckpointer,
    export_full_checkpoint,
    read_chain,
)

# The SSD/SCM tables start from lazy initial values (a full step lists only their written
# rows); the DRAM table's rows are all written at start (its full step lists every row).
TIERED = {"ssd_a": "ssd", "ssd_b": "dram", "scm_c": "scm", "plain_d": None}
BLOCK_ROWS = 64  # below every table's 300-700 rows: each shard is written in several blocks
SAVE_AT = (3, 6, 9)
CALLER = {"losses": [0.5, 0.25]}
TRAINED_LR = 0.07  # the dense optimizer's, saved as a non-tensor (bytes) item


def _build(root, tiers: Dict[str, Any]):
    """The harness's model (RowWiseAdagrad tables) and an SGD-with-momentum dense optimizer
    whose state_dict has its param_groups (non-tensor items)."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    spec = h.RunSpec(world_size=1, steps=0, out_dir=str(root), storage_dir=str(root / "storage"), tiers=tiers)
    dmp, _ = h._build(spec, 0)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
    dense.save_param_groups(True)
    return dmp, dense


def _old_state(dmp, dense) -> Dict[str, Any]:
    """What the checkpoints before differential ones saved."""
    return {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict(), "dense_optim": dense.state_dict()}


def _flat(value: Any, prefix: str = "") -> Iterator[Tuple[str, torch.Tensor]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}{k}.")
    elif isinstance(value, ShardedTensor):
        full = torch.zeros(value.size(), dtype=value.dtype)
        for shard in value.local_shards():
            where = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
            full[where] = shard.tensor
        yield prefix[:-1], full
    elif isinstance(value, torch.Tensor):
        yield prefix[:-1], value.detach().clone()


def _snapshot(dmp, dense) -> Dict[str, torch.Tensor]:
    """Every weight and optimizer state of a model, as whole tensors."""
    state = _old_state(dmp, dense)
    return dict(_flat({"model": state["model"], "optim": state["optim"]["state"],
                       "dense_optim": state["dense_optim"]["state"]}))


def _differ(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> list:
    assert sorted(a) == sorted(b)
    return sorted(k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k]))


@pytest.fixture(scope="module")
def trained(process_group, tmp_path_factory):
    """(checkpoint dir, the last step, the trained model's snapshot)."""
    from torchrec.optim.keyed import CombinedOptimizer

    from torchrec_mtrains.sharding import TieredTrainPipeline

    root = tmp_path_factory.mktemp("export")
    dmp, dense = _build(root / "trained", TIERED)
    for group in dense.param_groups:
        group["lr"] = TRAINED_LR
    dense.save_param_groups(False)  # CombinedOptimizer wants its optimizers alike in this
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    dense.save_param_groups(True)
    pipeline = TieredTrainPipeline(dmp, optimizer, torch.device("cpu"))
    batches = iter([h.local_batch(s, 0, 1) for s in range(SAVE_AT[-1])])
    ckpt = DifferentialCheckpointer(str(root / "ck"), full_every=5, max_chain_fraction=100.0)
    kinds = []
    for step in range(1, SAVE_AT[-1] + 1):
        pipeline.progress(batches)
        if step in SAVE_AT:
            kinds.append(ckpt.save(step, dmp, dense, CALLER).kind)
    assert kinds == ["full", "delta", "delta"]
    last = ckpt.latest()
    chain = read_chain(last)
    assert sorted({r.complete for r in chain[0].pieces()}) == [False, True]
    assert any(c.count for s in chain[1:] for r in s.pieces() for c in r.chunks)
    return root, last, _snapshot(dmp, dense)


@pytest.fixture(scope="module")
def exported(trained):
    root, last, _ = trained
    destination = str(root / "exported")
    export_full_checkpoint(last, destination, block_rows=BLOCK_ROWS)
    return destination


def test_export_has_the_old_layout(trained, exported):
    root, _, reference = trained
    dmp, dense = _build(root / "layout", {t: None for t in TIERED})
    dense.init_state()
    old = str(root / "old")
    dcp.save(_old_state(dmp, dense), checkpoint_id=old, no_dist=True)
    want = dcp.FileSystemReader(old).read_metadata().state_dict_metadata
    got = dcp.FileSystemReader(exported).read_metadata().state_dict_metadata
    assert sorted(got) == sorted(want)
    for key, md in want.items():
        if isinstance(md, BytesStorageMetadata):
            assert isinstance(got[key], BytesStorageMetadata), key
        else:
            assert (got[key].size, got[key].properties.dtype) == (md.size, md.properties.dtype), key
    for table, (rows, _, _) in h.TABLES.items():  # FUSED tables too: their deltas are rows
        blocks = math.ceil(rows / BLOCK_ROWS)
        assert len(got[f"model.ebc.embedding_bags.{table}.weight"].chunks) == blocks
        assert len(got[f"optim.state.ebc.embedding_bags.{table}.weight.{table}.momentum1"].chunks) == blocks
    assert len([f for f in os.listdir(exported) if f.endswith(".distcp")]) > 2  # blocks in files of their own
    with open(os.path.join(exported, "trainer.json")) as f:
        assert json.load(f) == {**CALLER, "step": SAVE_AT[-1]}
    assert any(k.startswith("dense_optim.") and k.endswith(".momentum_buffer") for k in reference)
    assert any(isinstance(md, BytesStorageMetadata) for md in got.values())


def test_plain_dcp_load_into_fused_tables(trained, exported):
    root, _, reference = trained
    dmp, dense = _build(root / "fused", {t: None for t in TIERED})
    dense.init_state()
    assert _differ(_snapshot(dmp, dense), reference)
    state = _old_state(dmp, dense)
    dcp.load(state, checkpoint_id=exported)
    dmp.load_state_dict(state["model"])
    dmp.fused_optimizer.load_state_dict(state["optim"])
    dense.load_state_dict(state["dense_optim"])
    assert _differ(_snapshot(dmp, dense), reference) == []
    assert [g["lr"] for g in dense.param_groups] == [TRAINED_LR]


def test_restore_into_tiered_tables(trained, exported):
    root, _, reference = trained
    dmp, dense = _build(root / "tiered", {"ssd_a": "dram", "ssd_b": "ssd", "scm_c": "ssd", "plain_d": None})
    dense.init_state()
    assert _differ(_snapshot(dmp, dense), reference)
    trainer = DifferentialCheckpointer(str(root / "ck_restore")).restore(dmp, dense, path=exported)
    assert trainer == {**CALLER, "step": SAVE_AT[-1]}
    assert _differ(_snapshot(dmp, dense), reference) == []
    assert [g["lr"] for g in dense.param_groups] == [TRAINED_LR]


def test_block_size_does_not_change_the_values(trained, exported):
    root, last, _ = trained
    whole = str(root / "exported_whole")
    export_full_checkpoint(last, whole)  # one block per table
    md = dcp.FileSystemReader(whole).read_metadata().state_dict_metadata
    assert len(md["model.ebc.embedding_bags.ssd_a.weight"].chunks) == 1
    values = [read_dcp(path)[0] for path in (exported, whole)]
    assert _differ(*values) == []


def test_damaged_delta_raises_and_leaves_nothing(trained, tmp_path):
    _, last, _ = trained
    chain_copy = tmp_path / "ck"
    shutil.copytree(os.path.dirname(last), chain_copy)
    chain = read_chain(str(chain_copy / os.path.basename(last)))
    step = chain[1]
    chunk = next(c for r in step.pieces() for c in r.chunks if c.count)
    info = step.reader.metadata.storage_data[MetadataIndex(chunk.key, torch.Size([0, 0]))]
    where = os.path.join(step.reader.path, info.relative_path)
    with open(where, "r+b") as f:
        f.seek(info.offset + info.length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    destination = tmp_path / "exported"
    with pytest.raises(ChainError) as error:
        export_full_checkpoint(str(chain_copy / os.path.basename(last)), str(destination), block_rows=BLOCK_ROWS)
    assert error.value.path == where and where in str(error.value)
    assert error.value.step == step.step
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # neither the destination nor a partial one


def test_bad_arguments(trained, exported):
    _, last, _ = trained
    with pytest.raises(ValueError, match="block_rows"):
        export_full_checkpoint(last, exported + "_x", block_rows=0)
    with pytest.raises(FileExistsError, match="exists"):
        export_full_checkpoint(last, exported)


def _train_two_ranks(rank: int, root: str, sharding_type: str, init_method: str) -> None:
    """One rank of a two-rank run: three differential saves, then one as before them."""
    import torch.distributed as dist

    from torchrec_mtrains.sharding import TieredTrainPipeline

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=2)
    spec = h.RunSpec(world_size=2, steps=0, out_dir=root, storage_dir=os.path.join(root, f"storage{rank}"),
                     tiers=TIERED, sharding_type=sharding_type)
    dmp, optimizer = h._build(spec, rank)
    pipeline = TieredTrainPipeline(dmp, optimizer, torch.device("cpu"))
    batches = iter([h.local_batch(s, rank, 2) for s in range(SAVE_AT[-1])])
    ckpt = DifferentialCheckpointer(os.path.join(root, "ck"), full_every=5, max_chain_fraction=100.0)
    for step in range(1, SAVE_AT[-1] + 1):
        pipeline.progress(batches)
        if step in SAVE_AT:
            ckpt.save(step, dmp)
    dcp.save(h._state(dmp, optimizer), checkpoint_id=os.path.join(root, "old"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.slow
# Column-wise only (CI time): its shards split columns and stack the row-wise momentum, the
# layout most unlike a shard's own; row-wise shards are plain row ranges, as world size 1's.
@pytest.mark.parametrize("sharding_type", ["column_wise"])
def test_two_rank_chain_exports_as_the_old_save(tmp_path, sharding_type):
    import multiprocessing

    root = str(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    init = file_init_method(os.path.join(root, "rendezvous"))
    procs = [ctx.Process(target=_train_two_ranks, args=(r, root, sharding_type, init)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    last = os.path.join(root, "ck", "step_%08d" % SAVE_AT[-1])
    chain = read_chain(last)
    assert [len(s.manifests) for s in chain] == [2, 2, 2]
    assert max(sum(1 for r in chain[0].pieces() if r.spec.table == t) for t in TIERED) == 2  # split tables
    export_full_checkpoint(last, os.path.join(root, "exported"), block_rows=BLOCK_ROWS)
    want, want_md = read_dcp(os.path.join(root, "old"))
    got, got_md = read_dcp(os.path.join(root, "exported"))
    assert sorted(got_md) == sorted(want_md)
    assert _differ(got, want) == []
