"""Restoring a table that changed between TorchRec's FUSED kernel and a tiered one, when the
optimizers differ: the restore refuses with a ValueError naming both optimizers before
anything is loaded; a FUSED table's Adam-family state (FBGEMM's two parts under TorchRec's
keys) restores into a tiered Adam-family table (world size 1, in this process; FBGEMM's
CPU TBE trains no Adam, so that FUSED state is written by hand)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
import torch.distributed.checkpoint as dcp
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from tests.sharding.test_adam_family_sharded import DIM, ROWS, _batches, _collection, _kernel, _rows, train_dmp
from torchrec_mtrains import Tier
from torchrec_mtrains.checkpoint import DifferentialCheckpointer
from torchrec_mtrains.checkpoint.kind_change import restore_from_dense
from torchrec_mtrains.checkpoint.row_io import StepReader
from torchrec_mtrains.checkpoint.tiered_parts import local_pieces
from torchrec_mtrains.checkpoint.types import table_of
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder, TieredParams, tiered_sharding_plan


def _model(tmp_path: Path, optimizer, tier: Optional[Tier]) -> DistributedModelParallel:
    """One table "t" of ROWS x DIM: tiered on ``tier``, or TorchRec's FUSED kernel (None)."""
    module = _collection(False)
    params = None if tier is None else TieredParams(tier, cache_rows=8, storage_dir=str(tmp_path))
    plan = tiered_sharding_plan(module, {"t": params}, 1)
    sharder = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer, "learning_rate": 0.05})
    return DistributedModelParallel(module, plan=ShardingPlan({"": plan}), sharders=[sharder],
                                    device=torch.device("cpu"))


def _state(dmp):
    """The table's weights and optimizer state, as whole tensors."""
    out = {"weight": torch.cat([s.tensor for s in dmp.state_dict()["embedding_bags.t.weight"].local_shards()])}
    for k, v in dmp.fused_optimizer.state_dict()["state"]["embedding_bags.t.weight"].items():
        out[k] = torch.cat([s.tensor for s in v.local_shards()]) if hasattr(v, "local_shards") else v.clone()
    return {k: v.clone() for k, v in out.items()}


@pytest.mark.parametrize("saved,now", [
    ((EmbOptimType.EXACT_ROWWISE_ADAGRAD, None), (EmbOptimType.ADAM, Tier.SSD)),
    ((EmbOptimType.EXACT_ADAGRAD, None), (EmbOptimType.PARTIAL_ROWWISE_ADAM, Tier.DRAM)),
    ((EmbOptimType.LAMB, Tier.SSD), (EmbOptimType.EXACT_ROWWISE_ADAGRAD, None)),
    ((EmbOptimType.PARTIAL_ROWWISE_LAMB, Tier.DRAM), (EmbOptimType.EXACT_ADAGRAD, None)),
], ids=["fused_rowwise_to_adam", "fused_adagrad_to_partial_adam", "lamb_to_fused_rowwise",
        "partial_lamb_to_fused_adagrad"])
def test_another_optimizer_across_kinds_is_refused_naming_both(process_group, tmp_path: Path, saved, now) -> None:
    dmp = _model(tmp_path / "saved", *saved)
    train_dmp(dmp, _batches(2))
    DifferentialCheckpointer(str(tmp_path / "ck")).save(2, dmp)
    other = _model(tmp_path / "now", *now)
    before = _state(other)
    with pytest.raises(ValueError, match=f"cannot restore the optimizer state of {saved[0].value} .*"
                                         f"trained with {now[0].value}"):
        DifferentialCheckpointer(str(tmp_path / "ck")).restore(other)
    after = _state(other)
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("optimizer", [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB], ids=lambda o: o.name)
def test_a_fused_adam_family_state_restores_into_a_tiered_table(process_group, tmp_path: Path, optimizer) -> None:
    g = torch.Generator().manual_seed(5)
    row_wise = optimizer == EmbOptimType.PARTIAL_ROWWISE_LAMB
    weight = torch.randn(ROWS, DIM, generator=g)
    m1 = torch.randn(ROWS, DIM, generator=g)
    m2 = torch.rand((ROWS,) if row_wise else (ROWS, DIM), generator=g)
    # The dense state a FUSED table trained with the optimizer saves (TorchRec's keys).
    saved = str(tmp_path / "fused_step")
    dcp.save({"model": {"embedding_bags.t.weight": weight},
              "optim": {"state": {"embedding_bags.t.weight": {"t.momentum1": m1, "t.exp_avg_sq": m2}}}},
             checkpoint_id=saved, no_dist=True)
    step = SimpleNamespace(reader=StepReader(saved, 0))
    dmp = _model(tmp_path / "tiered", optimizer, Tier.SSD)
    pieces = local_pieces(dmp)
    restore_from_dense(pieces, {table_of(p.spec) for p in pieces}, [step], block_rows=16)
    emb = _kernel(dmp).emb_module
    got_m1, got_m2 = emb.split_optimizer_states()[0]
    assert torch.equal(_rows(emb)[0], weight)
    assert torch.equal(got_m1, m1) and torch.equal(got_m2, m2)

    # Another optimizer of the same parts' shapes is refused, naming both.
    other = {EmbOptimType.ADAM: EmbOptimType.PARTIAL_ROWWISE_ADAM,
             EmbOptimType.PARTIAL_ROWWISE_LAMB: EmbOptimType.ADAM}[optimizer]
    dmp = _model(tmp_path / "other", other, Tier.DRAM)
    pieces = local_pieces(dmp)
    with pytest.raises(ValueError, match=f"cannot restore the optimizer state of .*{optimizer.value}.*"
                                         f"trained with {other.value}"):
        restore_from_dense(pieces, {table_of(p.spec) for p in pieces}, [step])
