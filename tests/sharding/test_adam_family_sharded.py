"""The Adam family (ADAM, PARTIAL_ROWWISE_ADAM, LAMB, PARTIAL_ROWWISE_LAMB) through TorchRec on
tiered tables: fused_params and ``apply_optimizer_in_backward(torch.optim.Adam)`` reach the
kernel, a sharded table trains exactly as a lone TieredEmbeddingBags with the same settings,
and the fused optimizer's state_dict has FBGEMM's parts under TorchRec's keys
(``<table>.momentum1``, ``<table>.exp_avg_sq``) plus the step count, and loads back exactly.

World size 1, in this process (FBGEMM's CPU TBE trains no Adam, so a FUSED twin cannot be
the reference: a TieredEmbeddingBags built with the kernel's own config is).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.sharding import (
    TieredEmbeddingBagCollectionSharder,
    TieredEmbeddingCollectionSharder,
    TieredParams,
    tiered_sharding_plan,
)

ROWS, DIM, BATCH, STEPS = 40, 4, 5, 5
FAMILY = [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.LAMB,
          EmbOptimType.PARTIAL_ROWWISE_LAMB]


def _collection(sequence: bool):
    if sequence:
        return EmbeddingCollection(tables=[EmbeddingConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM,
                                                           feature_names=["f"])], device=torch.device("cpu"))
    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t", num_embeddings=ROWS, embedding_dim=DIM,
                                                             feature_names=["f"])], device=torch.device("cpu"))


def _dmp(tmp_path: Path, fused_params: Dict[str, Any], sequence: bool = False, in_backward: Any = None,
         tier: Tier = Tier.SSD) -> DistributedModelParallel:
    module = _collection(sequence)
    if in_backward is not None:
        apply_optimizer_in_backward(torch.optim.Adam, module.parameters(), in_backward)
    plan = tiered_sharding_plan(module, {"t": TieredParams(tier, cache_rows=8, storage_dir=str(tmp_path))}, 1)
    sharder = (TieredEmbeddingCollectionSharder if sequence else TieredEmbeddingBagCollectionSharder)(
        fused_params=dict(fused_params))
    return DistributedModelParallel(module, plan=ShardingPlan({"": plan}), sharders=[sharder],
                                    device=torch.device("cpu"))


def _kernel(dmp):
    (kernel,) = dmp._dmp_wrapped_module.tiered_kernels()
    return kernel


def _batches(steps: int, seed: int = 0) -> List[tuple]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (BATCH,), generator=g)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        out.append((ids, lengths, torch.randn(int(lengths.sum()), DIM, generator=g), torch.randn(BATCH, DIM, generator=g)))
    return out


def train_dmp(dmp, batches, sequence: bool = False) -> None:
    dmp.train()
    for ids, lengths, row_grad, bag_grad in batches:
        out = dmp(KeyedJaggedTensor.from_lengths_sync(["f"], ids, lengths))
        if sequence:
            (out["f"].values() * row_grad).sum().backward()
        else:
            (out.to_dict()["f"] * bag_grad).sum().backward()


def _train_lone(emb: TieredEmbeddingBags, batches, sequence: bool) -> None:
    emb.train()
    for ids, lengths, row_grad, bag_grad in batches:
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        out = emb(ids, offsets)
        (out * (row_grad if sequence else bag_grad)).sum().backward()


def _lone_twin(dmp, tmp_path: Path) -> TieredEmbeddingBags:
    """A TieredEmbeddingBags with the sharded kernel's config (in its own directory), started
    from the sharded table's rows."""
    kernel = _kernel(dmp).emb_module
    emb = TieredEmbeddingBags([(ROWS, DIM)], config=dataclasses.replace(kernel.config, storage_dir=str(tmp_path)))
    weights, state = kernel.read_rows(0, 0, ROWS)
    emb.set_rows(0, torch.arange(ROWS), weights, state)
    return emb


def _rows(emb) -> tuple:
    weights, state = emb.read_rows(0, 0, ROWS)
    return weights.clone(), state.clone()


@pytest.mark.parametrize("sequence", [False, True], ids=["bags", "sequence"])
@pytest.mark.parametrize("optimizer", FAMILY, ids=lambda o: o.name)
def test_fused_params_train_as_a_lone_kernel(process_group, tmp_path: Path, optimizer, sequence: bool) -> None:
    fused = {"optimizer": optimizer, "learning_rate": 0.05, "weight_decay": 0.01, "beta1": 0.8}
    dmp = _dmp(tmp_path / "dmp", fused, sequence)
    emb = _kernel(dmp).emb_module
    assert emb.optimizer == optimizer
    assert dict(emb.config.tbe_settings) == {"beta1": 0.8, "weight_decay": 0.01}
    lone = _lone_twin(dmp, tmp_path / "lone")
    start = _rows(emb)
    batches = _batches(STEPS)
    train_dmp(dmp, batches, sequence)
    _train_lone(lone, batches, sequence)
    trained, want = _rows(emb), _rows(lone)
    assert not torch.equal(trained[0], start[0])
    assert torch.equal(trained[0], want[0]) and torch.equal(trained[1], want[1])
    assert emb.optimizer_step == lone.optimizer_step == STEPS


@pytest.mark.parametrize("sequence", [False, True], ids=["bags", "sequence"])
def test_torch_adam_in_backward_reaches_the_kernel(process_group, tmp_path: Path, sequence: bool) -> None:
    """TorchRec turns torch.optim.Adam into optimizer=ADAM and lr; ``betas`` become FBGEMM's
    beta1 and beta2, and Adam's other keywords at their defaults ask for nothing."""
    dmp = _dmp(tmp_path / "dmp", {}, sequence,
               in_backward={"lr": 0.02, "betas": (0.7, 0.95), "weight_decay": 0.1, "amsgrad": False})
    emb = _kernel(dmp).emb_module
    assert emb.optimizer == EmbOptimType.ADAM
    assert emb.config.learning_rate == 0.02
    assert dict(emb.config.tbe_settings) == {"beta1": 0.7, "beta2": 0.95, "weight_decay": 0.1}
    lone = _lone_twin(dmp, tmp_path / "lone")
    batches = _batches(STEPS, seed=3)
    train_dmp(dmp, batches, sequence)
    _train_lone(lone, batches, sequence)
    trained, want = _rows(emb), _rows(lone)
    assert torch.equal(trained[0], want[0]) and torch.equal(trained[1], want[1])


@pytest.mark.parametrize("fused,match", [
    ({"optimizer": EmbOptimType.ADAM, "betas": (0.9,)}, r"betas.*must be a pair"),
    ({"optimizer": EmbOptimType.ADAM, "betas": (0.9, 0.99), "beta1": 0.8}, r"betas=\(0.9, 0.99\) and beta1=0.8"),
    ({"optimizer": EmbOptimType.ADAM, "amsgrad": True}, r"amsgrad.*torch.optim.Adam"),
    ({"optimizer": EmbOptimType.EXACT_ADAGRAD, "betas": (0.9, 0.99)}, r"beta2=0.99.*read only by ADAM"),
])
def test_torch_adam_keywords_are_refused_naming_them(process_group, tmp_path: Path, fused, match) -> None:
    with pytest.raises(ValueError, match=match):
        _dmp(tmp_path, fused)


@pytest.mark.parametrize("sequence", [False, True], ids=["bags", "sequence"])
@pytest.mark.parametrize("optimizer", FAMILY, ids=lambda o: o.name)
def test_fused_optimizer_state_dict_has_fbgemms_parts_and_loads_back(process_group, tmp_path: Path, optimizer,
                                                                     sequence: bool) -> None:
    fused = {"optimizer": optimizer, "learning_rate": 0.05}
    dmp = _dmp(tmp_path / "a", fused, sequence)
    train_dmp(dmp, _batches(STEPS), sequence)
    emb = _kernel(dmp).emb_module
    state = dmp.fused_optimizer.state_dict()["state"]
    (param,) = state
    entry = state[param]
    assert set(entry) == {"t.momentum1", "t.exp_avg_sq", "t.step"}
    row_wise = optimizer in (EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB)
    assert entry["t.momentum1"].size() == torch.Size([ROWS, DIM])
    assert entry["t.exp_avg_sq"].size() == (torch.Size([ROWS]) if row_wise else torch.Size([ROWS, DIM]))
    assert int(entry["t.step"]) == STEPS
    (m1, m2) = emb.split_optimizer_states()[0]
    assert torch.equal(entry["t.momentum1"].local_shards()[0].tensor, m1)
    assert torch.equal(entry["t.exp_avg_sq"].local_shards()[0].tensor, m2)
    saved = {k: (v.local_shards()[0].tensor.clone() if hasattr(v, "local_shards") else v.clone())
             for k, v in entry.items()}
    model_sd = {k: v.local_shards()[0].tensor.clone() for k, v in dmp.state_dict().items()}

    # Into a fresh model, through load_state_dict: it continues as the trained one does.
    other = _dmp(tmp_path / "b", fused, sequence)
    sd = other.state_dict()
    for k, v in sd.items():
        v.local_shards()[0].tensor.copy_(model_sd[k])
    other.load_state_dict(sd)
    osd = other.fused_optimizer.state_dict()
    for k, v in osd["state"][param].items():
        (v.local_shards()[0].tensor if hasattr(v, "local_shards") else v).copy_(saved[k])
    other.fused_optimizer.load_state_dict(osd)
    assert _kernel(other).emb_module.optimizer_step == STEPS
    assert all(torch.equal(a, b) for a, b in zip(_rows(_kernel(other).emb_module), _rows(emb)))
    more = _batches(3, seed=9)
    train_dmp(dmp, more, sequence)
    train_dmp(other, more, sequence)
    assert all(torch.equal(a, b) for a, b in zip(_rows(_kernel(other).emb_module), _rows(emb)))


def test_set_optimizer_step_reaches_the_kernel(process_group, tmp_path: Path) -> None:
    dmp = _dmp(tmp_path, {"optimizer": EmbOptimType.LAMB})
    dmp.fused_optimizer.set_optimizer_step(11)
    assert _kernel(dmp).emb_module.optimizer_step == 11
    step = dmp.fused_optimizer.state_dict()["state"]["embedding_bags.t.weight"]["t.step"]
    step.fill_(4)  # an in-place write reaches the kernel, as the momenta's do
    train_dmp(dmp, _batches(1))
    assert _kernel(dmp).emb_module.optimizer_step == 5
