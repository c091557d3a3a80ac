"""A virtual table's chain saved by 2 ranks restores by bucket onto 1 or 2 ranks and onto
another tier: the live ids, rows and optimizer state are exactly the saved ones, and
training goes on as the uninterrupted run (tests/support/virtual_dmp.py, gloo ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest
import torch

from tests.support import virtual_dmp

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS = 12


def _run(tmp: Path, name: str, world: int, kernel: str = "dram_virtual_table", **kw) -> List[dict]:
    out = tmp / name
    out.mkdir()
    spec = virtual_dmp.VirtualRun(out_dir=str(out), world_size=world, kernel=kernel, steps=STEPS,
                                  storage_dir=str(tmp / f"storage_{name}"), plain_weight=0.0, **kw)
    assert virtual_dmp.launch(spec) == [0] * world
    return virtual_dmp.read(str(out), world)


def _state(tmp: Path, name: str, step: int, world: int) -> Dict[str, torch.Tensor]:
    """Every rank's virtual rows at ``step``, merged by id."""
    parts = [torch.load(tmp / name / f"state{step}.rank{r}.pt") for r in range(world)]
    ids = torch.cat([p["ids"] for p in parts])
    order = torch.argsort(ids)
    return {k: torch.cat([p[k] for p in parts])[order] for k in ("ids", "weights", "state")}


def _assert_same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("trigger", [100_000, 300], ids=["no_eviction", "evicting"])
def test_a_chain_restores_by_bucket_onto_other_world_sizes_and_tiers(tmp_path: Path, trigger: int) -> None:
    """TorchRec's gradient division is off here: with it, a run on 2 ranks takes half the
    gradients of one on 1 rank (row-wise Adagrad's state a quarter), so no run on another
    world size trains as the saved one would have."""
    ckpt = tmp_path / "ckpt"
    saved = _run(tmp_path, "saved", 2, ckpt_dir=str(ckpt), save_at=[4, 8], trigger=trigger, gradient_division=False)
    at8 = _state(tmp_path, "saved", 8, 2)
    assert at8["ids"].numel() > 0
    step8 = str(ckpt / "step_00000008")
    # The same world size on the SSD tier: the same rows, and bit-identical training after.
    ssd = _run(tmp_path, "ssd2", 2, "ssd_virtual_table", ckpt_dir=str(ckpt), restore=step8, start=8, trigger=trigger,
               gradient_division=False)
    _assert_same(_state(tmp_path, "ssd2", 8, 2), at8)
    assert ssd[0]["losses"] == saved[0]["losses"][8:]
    if trigger != 100_000:
        return  # a count policy's trigger is per rank: 1 rank evicts otherwise than 2
    # One rank takes every bucket: the same rows; the losses as the 2-rank run's, up to
    # the order in which the ranks' pooled sums are added (as without a checkpoint).
    one = _run(tmp_path, "one", 1, ckpt_dir=str(ckpt), restore=step8, start=8, trigger=trigger,
               gradient_division=False)
    _assert_same(_state(tmp_path, "one", 8, 1), at8)
    base = saved[0]["losses"][8:]
    assert max(abs(a - b) for a, b in zip(base, one[0]["losses"])) <= 1e-6 * max(abs(x) for x in base)
