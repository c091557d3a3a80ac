"""export_full_checkpoint of tiered tables trained with the Adam family: the export holds
FBGEMM's parts of each table's optimizer state under TorchRec's keys (``<table>.momentum1``,
``<table>.exp_avg_sq``, one value per row for the partial row-wise ones) and the step count
(``<table>.step``), equal to the kernel's ``split_optimizer_states()`` and to a plain DCP
save of the trained model; it restores into a tiered model that then trains on exactly as
the trained one (world size 1, in this process). The single-part optimizers keep their one
``momentum1``."""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.distributed.checkpoint as dcp
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from tests.support.dcp_files import read_dcp
from tests.sharding.test_adam_family_sharded import DIM, ROWS, _batches, _dmp, _kernel, _rows, train_dmp
from torchrec_mtrains import Tier
from torchrec_mtrains.checkpoint import DifferentialCheckpointer, export_full_checkpoint

PARAM = "embedding_bags.t.weight"


def _table_items(tensors: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {k: v for k, v in tensors.items() if k.startswith((f"model.{PARAM}", f"optim.state.{PARAM}."))}


@pytest.mark.parametrize("optimizer", [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB,
                                       EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.EXACT_ADAGRAD],
                         ids=lambda o: o.name)
def test_export_keeps_fbgemms_parts_under_torchrecs_keys(process_group, tmp_path: Path, optimizer) -> None:
    fused = {"optimizer": optimizer, "learning_rate": 0.05}
    dmp = _dmp(tmp_path / "trained", fused, tier=Tier.SSD)
    ckpt = DifferentialCheckpointer(str(tmp_path / "ck"))
    batches = _batches(8)
    train_dmp(dmp, batches[:2])
    ckpt.save(2, dmp)
    train_dmp(dmp, batches[2:5])
    assert ckpt.save(5, dmp).kind == "delta"
    emb = _kernel(dmp).emb_module
    parts = emb.split_optimizer_states()[0]
    weights = emb.read_rows(0, 0, ROWS)[0].clone()
    old = str(tmp_path / "old")
    dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=old)
    exported = str(tmp_path / "exported")
    export_full_checkpoint(ckpt.latest(), exported, block_rows=16)  # several blocks per table

    got = _table_items(read_dcp(exported)[0])
    family = optimizer.value in ("adam", "partial_row_wise_lamb")
    keys = ["momentum1", "exp_avg_sq"][: len(parts)]
    want_keys = {f"model.{PARAM}"} | {f"optim.state.{PARAM}.t.{k}" for k in keys}
    if family:
        want_keys.add(f"optim.state.{PARAM}.t.step")
    assert set(got) == want_keys
    assert torch.equal(got[f"model.{PARAM}"], weights)
    for key, part in zip(keys, parts):
        value = got[f"optim.state.{PARAM}.t.{key}"]
        assert value.dtype == torch.float32 and value.shape == part.shape, key
        assert torch.equal(value, part), key
    if optimizer == EmbOptimType.PARTIAL_ROWWISE_LAMB:
        assert got[f"optim.state.{PARAM}.t.exp_avg_sq"].shape == (ROWS,)
        assert got[f"optim.state.{PARAM}.t.momentum1"].shape == (ROWS, DIM)
    if family:
        step = got[f"optim.state.{PARAM}.t.step"]
        assert step.dim() == 0 and step.dtype == torch.int64 and int(step) == 5
    # What a plain DCP save of the trained model (TorchRec's keys) holds, item for item.
    want = _table_items(read_dcp(old)[0])
    assert set(got) == set(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)

    # The export restores into a tiered model (another tier), which trains on as the trained one.
    fresh = _dmp(tmp_path / "fresh", fused, tier=Tier.DRAM)
    DifferentialCheckpointer(str(tmp_path / "ck_fresh")).restore(fresh, path=exported)
    if family:
        assert _kernel(fresh).emb_module.optimizer_step == 5
    train_dmp(dmp, batches[5:])
    train_dmp(fresh, batches[5:])
    a, b = _rows(emb), _rows(_kernel(fresh).emb_module)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
