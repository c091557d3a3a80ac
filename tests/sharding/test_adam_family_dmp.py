"""The Adam family on a tiered table sharded over 2 ranks (spawned gloo processes): row-wise
(Adam, partial row-wise LAMB) and column-wise (Adam) shards train as one TieredEmbeddingBags
with the same settings does on the global batch, and the fused optimizer's state_dict has
``<table>.momentum1`` / ``<table>.exp_avg_sq`` / ``<table>.step`` of the table's global
shapes, which a DCP save and load carry into a fresh sharded model that trains on exactly
as the trained one. One spawn runs every case."""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Tuple

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.support.dcp_files import read_dcp
from tests.support.dmp_harness import _spawn
from tests.support.ports import file_init_method

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

ROWS, DIM, BATCH, STEPS, WORLD = 40, 8, 8, 4, 2
# (optimizer, sharding): column-wise only for Adam, whose update is per element (a row-wise
# part of the state, or LAMB's trust ratio, sees one column shard, as TorchRec's own would).
CASES: List[Tuple[str, str]] = [("adam", "row_wise"), ("partial_row_wise_lamb", "row_wise"), ("adam", "column_wise")]
KEY = "embedding_bags.t.weight"


def _name(case: Tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


def _batches(steps: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (BATCH,), generator=g)
        ids = (torch.rand(int(lengths.sum()), generator=g) ** 2 * ROWS).long()
        out.append((ids, lengths, torch.randn(BATCH, DIM, generator=g)))
    return out


def _dmp(root: str, rank: int, optimizer: str, sharding: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    from torchrec_mtrains import Tier
    from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan

    module = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM,
                                                               feature_names=["f"])], device=torch.device("cpu"))
    params = TieredParams(Tier.SSD, cache_rows=8, storage_dir=os.path.join(root, f"storage{rank}"))
    plan = tiered_sharding_plan(module, {"t": params}, WORLD, sharding_type=sharding)
    fused = {"optimizer": EmbOptimType(optimizer), "learning_rate": 0.05, "weight_decay": 0.01}
    return DistributedModelParallel(module, plan=ShardingPlan({"": plan}),
                                    sharders=[TieredEmbeddingBagCollectionSharder(fused_params=fused)],
                                    device=torch.device("cpu"))


def _start_from(dmp, weight: torch.Tensor) -> None:
    """The global ``weight`` into the shards, the optimizer state zeroed."""
    sd = dmp.state_dict()
    for shard in sd[KEY].local_shards():
        (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
        shard.tensor.copy_(weight[r:r + h, c:c + w])
    dmp.load_state_dict(sd)
    osd = dmp.fused_optimizer.state_dict()
    for value in osd["state"][KEY].values():
        for shard in (value.local_shards() if hasattr(value, "local_shards") else []):
            shard.tensor.zero_()
    dmp.fused_optimizer.load_state_dict(osd)


def _train(dmp, batches, rank: int) -> None:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    per = BATCH // WORLD
    lo, hi = rank * per, (rank + 1) * per
    dmp.train()
    for ids, lengths, grad in batches:
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        kjt = KeyedJaggedTensor.from_lengths_sync(["f"], ids[offsets[lo]:offsets[hi]], lengths[lo:hi])
        (dmp(kjt).to_dict()["f"] * grad[lo:hi]).sum().backward()


def _reference(root: str, dmp, weight: torch.Tensor, batches) -> Dict[str, torch.Tensor]:
    """A lone TieredEmbeddingBags with the sharded kernel's settings, trained on the global
    batches, its gradients divided by the world size as TorchRec's sharded backward divides
    them (``comm_ops`` gradient division, as for a FUSED table)."""
    from torchrec_mtrains.kernels import TieredEmbeddingBags

    (kernel,) = dmp._dmp_wrapped_module.tiered_kernels()
    config = dataclasses.replace(kernel.emb_module.config, storage_dir=os.path.join(root, "lone"))
    emb = TieredEmbeddingBags([(ROWS, DIM)], config=config)
    state = torch.zeros(ROWS, emb.layouts[0].state_values)
    emb.set_rows(0, torch.arange(ROWS), weight, state.reshape(-1) if state.shape[1] == 1 else state)
    emb.train()
    for ids, lengths, grad in batches:
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        (emb(ids, offsets) * (grad / WORLD)).sum().backward()
    m1, m2 = emb.split_optimizer_states()[0]
    out = {"weight": emb.read_rows(0, 0, ROWS)[0].clone(), "momentum1": m1, "exp_avg_sq": m2,
           "step": torch.tensor(emb.optimizer_step)}
    emb.close()
    return out


def _worker(rank: int, root: str, init_method: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    weight = torch.empty(ROWS, DIM).uniform_(-0.3, 0.3, generator=torch.Generator().manual_seed(3))
    batches, more = _batches(STEPS), _batches(2, seed=1)
    for case in CASES:
        where = os.path.join(root, _name(case))
        dmp = _dmp(where, rank, *case)
        _start_from(dmp, weight)
        if rank == 0:
            torch.save(_reference(where, dmp, weight, batches), os.path.join(where, "reference.pt"))
        _train(dmp, batches, rank)
        saved = os.path.join(where, "dcp")
        dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=saved)
        # Loads back into a fresh sharded model, which then trains on as the trained one.
        fresh = _dmp(os.path.join(where, "fresh"), rank, *case)
        state = {"model": fresh.state_dict(), "optim": fresh.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=saved)
        fresh.load_state_dict(state["model"])
        fresh.fused_optimizer.load_state_dict(state["optim"])
        kernels = [d._dmp_wrapped_module.tiered_kernels()[0].emb_module for d in (dmp, fresh)]
        assert kernels[1].optimizer_step == kernels[0].optimizer_step == STEPS
        _train(dmp, more, rank)
        _train(fresh, more, rank)
        rows = [[e.split_embedding_weights()[0], *e.split_optimizer_states()[0]] for e in kernels]
        assert all(torch.equal(a, b) for a, b in zip(*rows)), f"{case}: the loaded model trains on differently"
        for e in kernels:
            e.close()
        dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("adam_dmp"))
    init = file_init_method(os.path.join(root, "rendezvous"))
    assert _spawn(_worker, [(r, root, init) for r in range(WORLD)], 300) == [0] * WORLD
    return root


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_sharded_adam_family_trains_as_one_kernel_and_saves_global_state(trained: str, case) -> None:
    where = os.path.join(trained, _name(case))
    want = torch.load(os.path.join(where, "reference.pt"))
    got = read_dcp(os.path.join(where, "dcp"))[0]
    prefix = f"optim.state.{KEY}.t."
    assert {k for k in got if k.startswith(prefix)} == {prefix + k for k in ("momentum1", "exp_avg_sq", "step")}
    assert got[f"model.{KEY}"].shape == (ROWS, DIM)
    assert got[prefix + "momentum1"].shape == (ROWS, DIM)
    assert got[prefix + "exp_avg_sq"].shape == ((ROWS,) if case[0].startswith("partial") else (ROWS, DIM))
    assert got[prefix + "step"].shape == () and int(got[prefix + "step"]) == int(want["step"]) == STEPS
    # Summed over the ranks' samples in another order than the lone kernel sums them: close.
    for name, key in (("weight", f"model.{KEY}"), ("momentum1", prefix + "momentum1"),
                      ("exp_avg_sq", prefix + "exp_avg_sq")):
        torch.testing.assert_close(got[key], want[name], rtol=1e-5, atol=1e-6, msg=f"{case}: {name}")
