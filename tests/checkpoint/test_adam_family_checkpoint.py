"""Differential checkpoints of tables trained with the Adam family: rows of 2 dim or dim + 1
state values and the step count of the bias correction round-trip exactly through full and
delta steps, so training continues bit for bit after a restore, also into tables on another
tier; a restore refuses another optimizer's state (world size 1, in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from tests.sharding.test_adam_family_sharded import ROWS, _batches, _dmp, _kernel, _rows, train_dmp
from torchrec_mtrains import Tier
from torchrec_mtrains.checkpoint import DifferentialCheckpointer

N, M = 4, 3  # steps before the saves, steps after


def _trained_and_saved(tmp_path: Path, fused, tier: Tier, sequence: bool = False):
    """A model trained N steps with a full save after step 2 and a delta after step N,
    then M more steps; returns (its rows after N + M steps, the checkpoint directory)."""
    dmp = _dmp(tmp_path / "trained", fused, sequence, tier=tier)
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"))
    batches = _batches(N + M)
    train_dmp(dmp, batches[:2], sequence)
    ckpt.save(2, dmp)
    train_dmp(dmp, batches[2:N], sequence)
    record = ckpt.save(N, dmp)
    assert record.kind == "delta"
    train_dmp(dmp, batches[N:], sequence)
    emb = _kernel(dmp).emb_module
    assert emb.optimizer_step == N + M
    rows = _rows(emb)
    emb.close()  # an SSD table's store file is linked by the checkpoint: one process opens it at a time
    return rows, batches[N:]


@pytest.mark.parametrize("optimizer", [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB,
                                       EmbOptimType.PARTIAL_ROWWISE_ADAM], ids=lambda o: o.name)
@pytest.mark.parametrize("tiers", [(Tier.SSD, Tier.SSD), (Tier.DRAM, Tier.SSD), (Tier.SSD, Tier.SCM)],
                         ids=lambda t: f"{t[0].name}_to_{t[1].name}")
def test_restore_continues_bit_identically(process_group, tmp_path: Path, optimizer, tiers) -> None:
    fused = {"optimizer": optimizer, "learning_rate": 0.05, "weight_decay": 0.01}
    want, rest = _trained_and_saved(tmp_path, fused, tiers[0])
    fresh = _dmp(tmp_path / "fresh", fused, tier=tiers[1])
    DifferentialCheckpointer(str(tmp_path / "ckpt")).restore(fresh)
    emb = _kernel(fresh).emb_module
    assert emb.optimizer_step == N
    train_dmp(fresh, rest)
    got = _rows(emb)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("quantize", ["int8", "fp16"])
def test_a_quantized_delta_keeps_the_momenta_and_step_exact(process_group, tmp_path: Path, quantize: str) -> None:
    """Lossy deltas encode only the weights: both momenta and the step come back exact."""
    fused = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.05}
    dmp = _dmp(tmp_path / "trained", fused, tier=Tier.SSD)
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"), link_ssd_tables=False, quantize=quantize)
    batches = _batches(N)
    train_dmp(dmp, batches[:2])
    ckpt.save(2, dmp)
    train_dmp(dmp, batches[2:])
    assert ckpt.save(N, dmp).kind == "delta"
    want_w, want_state = _rows(_kernel(dmp).emb_module)
    _kernel(dmp).emb_module.close()
    fresh = _dmp(tmp_path / "fresh", fused, tier=Tier.SCM)
    DifferentialCheckpointer(str(tmp_path / "ckpt")).restore(fresh)
    emb = _kernel(fresh).emb_module
    got_w, got_state = _rows(emb)
    assert emb.optimizer_step == N
    assert torch.equal(got_state, want_state)  # momentum1 and momentum2, bit for bit
    assert float((got_w - want_w).abs().max()) <= float(want_w.abs().max()) * 2**-7  # the encoding's error


def test_a_sequence_table_restores_bit_identically(process_group, tmp_path: Path) -> None:
    fused = {"optimizer": EmbOptimType.LAMB, "learning_rate": 0.05}
    want, rest = _trained_and_saved(tmp_path, fused, Tier.SCM, sequence=True)
    fresh = _dmp(tmp_path / "fresh", fused, sequence=True, tier=Tier.DRAM)
    DifferentialCheckpointer(str(tmp_path / "ckpt")).restore(fresh)
    train_dmp(fresh, rest, sequence=True)
    got = _rows(_kernel(fresh).emb_module)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("saved,now", [
    (EmbOptimType.EXACT_ADAGRAD, EmbOptimType.PARTIAL_ROWWISE_ADAM),
    (EmbOptimType.ADAM, EmbOptimType.LAMB),
    (EmbOptimType.PARTIAL_ROWWISE_LAMB, EmbOptimType.EXACT_ADAGRAD),
], ids=lambda o: o.name)
def test_a_restore_refuses_another_optimizers_state(process_group, tmp_path: Path, saved, now) -> None:
    dmp = _dmp(tmp_path / "saved", {"optimizer": saved, "learning_rate": 0.05})
    train_dmp(dmp, _batches(2))
    ckpt = DifferentialCheckpointer(str(tmp_path / "ckpt"))
    ckpt.save(2, dmp)
    other = _dmp(tmp_path / "other", {"optimizer": now, "learning_rate": 0.05})
    with pytest.raises(ValueError, match=f"cannot restore the optimizer state of {saved.value}.*{now.value}"):
        DifferentialCheckpointer(str(tmp_path / "ckpt")).restore(other)
