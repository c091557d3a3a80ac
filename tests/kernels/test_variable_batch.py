"""Variable batch per feature (FBGEMM's VBE, ``batch_size_per_feature_per_rank``): the tiered
kernel's outputs, weights and optimizer state equal FBGEMM's CPU TBE with every row in DRAM
given the same VBE batches, on each tier, with and without prefetch; bad batch sizes are
refused naming what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from tests.support.tiered_helpers import (  # noqa: F401  (fixture)
    Model,
    Trajectory,
    assert_same,
    assert_tables_match,
    final_tables,
    initial_weights,
    make_kernel,
    single_intra_op_thread,
)
from torchrec_mtrains import Tier

# Three features on two tables (table 0 has two), two ranks.
SPECS = ((900, 8), (400, 12))
FEATURE_TABLE_MAP = [0, 0, 1]
STEPS = 12


def _vbe_steps(seed: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor, List[List[int]], torch.Tensor]]:
    """(indices, offsets, batch_size_per_feature_per_rank, output gradient) per step."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(STEPS):
        sizes = [[int(torch.randint(0, 5, (1,), generator=g)) for _ in range(2)] for _ in FEATURE_TABLE_MAP]
        ids, lengths = [], []
        for f, per_rank in enumerate(sizes):
            rows = SPECS[FEATURE_TABLE_MAP[f]][0]
            n = torch.randint(0, 4, (sum(per_rank),), generator=g)
            ids.append(torch.randint(0, rows, (int(n.sum()),), generator=g))
            lengths.append(n)
        lengths_all = torch.cat(lengths)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths_all.cumsum(0)])
        out_numel = sum(b * SPECS[FEATURE_TABLE_MAP[f]][1] for f, per_rank in enumerate(sizes) for b in per_rank)
        out.append((torch.cat(ids), offsets, sizes, torch.randn(out_numel, generator=g)))
    return out


def _model(pooling: PoolingMode) -> Model:
    return Model(specs=SPECS, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, pooling=pooling)


@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SCM, Tier.SSD])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("pooling", [PoolingMode.SUM, PoolingMode.MEAN])
def test_vbe_matches_fbgemm(tmp_path: Path, tier: Tier, prefetch: bool, pooling: PoolingMode) -> None:
    model = _model(pooling)
    ref = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in SPECS], optimizer=model.optimizer,
        learning_rate=model.learning_rate, eps=model.eps, pooling_mode=pooling, feature_table_map=FEATURE_TABLE_MAP)
    with torch.no_grad():
        for t, w in enumerate(ref.split_embedding_weights()):
            w.copy_(initial_weights(model, t))
    ker = make_kernel(model, tier, tmp_path, cache_rows=[60, 40], feature_table_map=FEATURE_TABLE_MAP)
    steps = _vbe_steps()
    if prefetch:
        ker.prefetch(*steps[0][:3])
    for s, (indices, offsets, sizes, grad) in enumerate(steps):
        if prefetch and s + 1 < STEPS:
            ker.prefetch(*steps[s + 1][:3])
        want = ref(indices, offsets, batch_size_per_feature_per_rank=sizes)
        got = ker(indices, offsets, batch_size_per_feature_per_rank=sizes)
        assert_same(got, want.detach(), model, f"VBE output of step {s}")
        want.backward(grad)
        got.backward(grad)
    assert_tables_match(ker, Trajectory([], *final_tables(ref)), model)


def test_vbe_batch_sizes_are_checked(tmp_path: Path) -> None:
    ker = make_kernel(_model(PoolingMode.SUM), Tier.DRAM, None, feature_table_map=FEATURE_TABLE_MAP)
    indices, offsets, sizes, _ = _vbe_steps()[0]
    with pytest.raises(ValueError, match="for each of the 3 features"):
        ker(indices, offsets, batch_size_per_feature_per_rank=sizes[:2])
    with pytest.raises(ValueError, match="for each of the 3 features"):
        ker(indices, offsets, batch_size_per_feature_per_rank=[[1, 2], [1], [0, 0]])
    grown = [list(per_rank) for per_rank in sizes]
    grown[0][0] += 1
    with pytest.raises(ValueError, match="one per bag of batch_size_per_feature_per_rank"):
        ker(indices, offsets, batch_size_per_feature_per_rank=grown)
    ker.prefetch(indices, offsets, sizes)
    with pytest.raises(ValueError, match="different from the one prefetch"):
        ker(indices, offsets)  # the same ids without their batch sizes are another batch
    ker(indices, offsets, batch_size_per_feature_per_rank=sizes)


def test_vbe_is_refused_for_sequences(tmp_path: Path) -> None:
    ker = make_kernel(Model(specs=((100, 8),), pooling=PoolingMode.NONE), Tier.DRAM, None)
    with pytest.raises(ValueError, match="for pooled bags"):
        ker(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), batch_size_per_feature_per_rank=[[1, 1]])
