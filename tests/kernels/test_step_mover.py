"""The C++ step engine moving a step's rows on its own threads against the same steps run inline:
bit-identical outputs, weights and optimizer state, on every tier, in fp32 and fp16, with
overflow slots past the TBE."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import SparseType

from tests.support.tiered_helpers import (
    Model,
    Workload,
    drive,
    make_kernel,
    make_steps,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
)
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags

TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]


def _train(ker: TieredEmbeddingBags, steps) -> List[torch.Tensor]:
    outputs: List[torch.Tensor] = []
    try:
        drive(ker, steps, "ahead2", lambda s, out: outputs.append(out.detach().clone()))
        outputs += ker.split_embedding_weights()
        outputs += [s for states in ker.split_optimizer_states() for s in states]
        return outputs
    finally:
        ker.close()


@pytest.mark.parametrize("precision", [SparseType.FP32, SparseType.FP16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
def test_engine_threads_are_bit_identical_to_inline_steps(tmp_path: Path, tier: Tier, precision: SparseType) -> None:
    """The step engine's threads (plans two steps ahead of the compute, moves in between)
    give what the same steps run inline in the caller give, bit for bit."""
    model = Model(precision=precision)
    steps = make_steps(model.specs, Workload(steps=60, data_seed=13))
    # A cache of 8 slots in sets of 4: rows are evicted and reloaded every step, and the
    # two steps in flight overflow the sets (loads into slots past the TBE, which grows).
    threads = make_kernel(model, tier, tmp_path / "threads", cache_rows=8, cache_ways=4, cache_algorithm="lru")
    inline = make_kernel(model, tier, tmp_path / "inline", cache_rows=8, cache_ways=4, cache_algorithm="lru",
                         prefetch_pipeline=False)
    got = _train(threads, steps)
    want = _train(inline, steps)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, k
        assert torch.equal(g, w), f"tensor {k} differs (max abs diff {(g.float() - w.float()).abs().max():.3g})"


def test_the_workload_moves_rows_both_ways_and_overflows(tmp_path: Path) -> None:
    """What the equality test relies on: evictions written back, loads, overflow slots."""
    model = Model()
    ker = make_kernel(model, Tier.SSD, tmp_path, cache_rows=8, cache_ways=4, cache_algorithm="lru")
    try:
        drive(ker, make_steps(model.specs, Workload(steps=60, data_seed=13)), "ahead2", lambda s, out: None)
        for st in ker.cache_stats().values():
            assert st["rows_written_back"] > 0 and st["rows_loaded"] > 0 and st["overflow_assignments"] > 0
    finally:
        ker.close()
