"""The C++ step mover against the row moves it replaced: the same training, with every
step's rows moved instead by the stores' own read() and write() and the slots' gather and
scatter (what the kernel did before the mover), gives bit-identical outputs, weights and
optimizer state, on every tier, in fp32 and fp16, with overflow slots past the TBE."""

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


def _python_moves(ker: TieredEmbeddingBags) -> None:
    """Replaces the kernel's move stage by the Python row moves it made before the mover."""
    cache = ker._cache

    def move(job) -> None:
        for m in job.moves:
            t = m.table
            if m.evict_rows.numel():
                cache.run.unflushed = True
                cache.stores[t].write(m.evict_rows, cache.slots.gather(t, m.evict_slots))
            rows = cache.stores[t].read(m.load_rows)
            ready = cache.slots.in_tbe(t, m.load_slots)
            cache.slots.scatter(t, m.load_slots[ready], rows[ready])
            m.overflow_at, m.overflow_rows = (~ready).nonzero().view(-1), rows[~ready]

    ker._steps._move = move


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
def test_mover_is_bit_identical_to_the_python_row_moves(tmp_path: Path, tier: Tier, precision: SparseType) -> None:
    model = Model(precision=precision)
    steps = make_steps(model.specs, Workload(steps=60, data_seed=13))
    # A cache of 8 slots in sets of 4: rows are evicted and reloaded every step, and the
    # two steps in flight overflow the sets (loads into slots past the TBE, which grows).
    mover = make_kernel(model, tier, tmp_path / "mover", cache_rows=8, cache_ways=4, cache_algorithm="lru")
    python = make_kernel(model, tier, tmp_path / "python", cache_rows=8, cache_ways=4, cache_algorithm="lru")
    _python_moves(python)
    got = _train(mover, steps)
    want = _train(python, steps)
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
