"""TableLayout: a row's bytes for every supported optimizer and precision, checked against
what FBGEMM's CPU TBE allocates, and the one normaliser of optimizer and precision names."""

from __future__ import annotations

import itertools

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from torchrec_mtrains.layout import (
    OPTIMIZERS,
    PRECISIONS,
    SHORT_OPTIMIZER_NAMES,
    TableLayout,
    optimizer_name,
    precision_name,
)

FBGEMM_OPTIMIZERS = [EmbOptimType.EXACT_ROWWISE_ADAGRAD, EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_SGD]
FBGEMM_PRECISIONS = [SparseType.FP32, SparseType.FP16]


ADAM_FAMILY = [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.LAMB,
               EmbOptimType.PARTIAL_ROWWISE_LAMB]


def test_supported_names_are_fbgemm_values() -> None:
    assert OPTIMIZERS == tuple(o.value for o in FBGEMM_OPTIMIZERS + ADAM_FAMILY)
    assert PRECISIONS == tuple(p.value for p in FBGEMM_PRECISIONS)


@pytest.mark.parametrize(
    "optimizer,precision", list(itertools.product(FBGEMM_OPTIMIZERS, FBGEMM_PRECISIONS)),
    ids=lambda v: v.value,
)
def test_layout_matches_what_fbgemm_allocates(optimizer: EmbOptimType, precision: SparseType) -> None:
    rows, dims = 10, (4, 12)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for d in dims],
        optimizer=optimizer, weights_precision=precision, output_dtype=SparseType.FP32,
    )
    weights = tbe.split_embedding_weights()
    states = tbe.split_optimizer_states()
    for t, dim in enumerate(dims):
        layout = TableLayout(dim, precision, optimizer)
        w = weights[t]
        assert tuple(w.shape) == (rows, dim)
        assert layout.weight_bytes == dim * w.element_size()
        assert layout.element_bytes == w.element_size()
        assert getattr(torch, layout.torch_dtype_name) == w.dtype
        state = states[t] if states else []
        assert layout.state_bytes * rows == sum(s.numel() * s.element_size() for s in state)
        assert all(s.dtype == torch.float32 for s in state)
        assert layout.state_values * rows == sum(s.numel() for s in state)
        assert layout.state_shape(rows) == (tuple(state[0].shape) if state else None)
        assert layout.row_bytes == layout.weight_bytes + layout.state_bytes
        assert layout.row_width * layout.element_bytes == layout.row_bytes
        assert layout.state_slots == layout.row_width - dim


@pytest.mark.parametrize("precision,slot_bytes", [("fp32", 4), ("fp16", 2)])
def test_fp32_state_occupies_whole_slots(precision: str, slot_bytes: int) -> None:
    layout = TableLayout(8, precision, "exact_adagrad")
    assert layout.state_values == 8
    assert layout.state_slots == 8 * 4 // slot_bytes


def test_every_spelling_of_a_setting_gives_one_layout() -> None:
    spellings = {
        "exact_row_wise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, "exact_row_wise_adagrad", "rowwise_adagrad"),
        "exact_adagrad": (EmbOptimType.EXACT_ADAGRAD, "exact_adagrad", "adagrad"),
        "exact_sgd": (EmbOptimType.EXACT_SGD, "exact_sgd", "sgd"),
        "adam": (EmbOptimType.ADAM, "adam"),
        "lamb": (EmbOptimType.LAMB, "lamb"),
        "partial_row_wise_adam": (EmbOptimType.PARTIAL_ROWWISE_ADAM, "partial_row_wise_adam", "partial_rowwise_adam"),
        "partial_row_wise_lamb": (EmbOptimType.PARTIAL_ROWWISE_LAMB, "partial_row_wise_lamb", "partial_rowwise_lamb"),
    }
    short = {"rowwise_adagrad", "adagrad", "sgd", "partial_rowwise_adam", "partial_rowwise_lamb"}
    assert short == set(SHORT_OPTIMIZER_NAMES)
    for value, names in spellings.items():
        for name in names:
            assert optimizer_name(name) == value
            for precision in (SparseType.FP16, "fp16"):
                layout = TableLayout(16, precision, name)
                assert (layout.precision, layout.optimizer) == ("fp16", value)
                assert layout == TableLayout(16, "fp16", value)
    assert precision_name(SparseType.FP32) == "fp32"


@pytest.mark.parametrize("dim,precision,optimizer,row_bytes", [
    (64, "fp32", "rowwise_adagrad", 64 * 4 + 4),
    (64, "fp16", "rowwise_adagrad", 64 * 2 + 4),
    (64, "fp32", "adagrad", 64 * 4 + 64 * 4),
    (64, "fp16", "adagrad", 64 * 2 + 64 * 4),
    (64, "fp32", "sgd", 64 * 4),
    (64, "fp16", "sgd", 64 * 2),
])
def test_row_bytes(dim: int, precision: str, optimizer: str, row_bytes: int) -> None:
    assert TableLayout(dim, precision, optimizer).row_bytes == row_bytes


@pytest.mark.parametrize("optimizer", [EmbOptimType.LARS_SGD, EmbOptimType.SHAMPOO, "madgrad", "EXACT_SGD", None, 3])
def test_unsupported_optimizer_is_named_with_the_choices(optimizer: object) -> None:
    with pytest.raises(ValueError, match=r"optimizer=.* must be one of \['exact_row_wise_adagrad'") as e:
        TableLayout(8, "fp32", optimizer)
    assert repr(optimizer) in str(e.value) and "'rowwise_adagrad'" in str(e.value)


def test_adam_family_state_parts_are_fbgemms() -> None:
    """momentum1 per weight, then momentum2 per weight (or one per row, partial row-wise)."""
    assert TableLayout(8, "fp32", EmbOptimType.ADAM).state_parts == (8, 8)
    assert TableLayout(8, "fp32", EmbOptimType.LAMB).state_parts == (8, 8)
    assert TableLayout(8, "fp16", EmbOptimType.PARTIAL_ROWWISE_ADAM).state_parts == (8, 1)
    layout = TableLayout(8, "fp32", EmbOptimType.PARTIAL_ROWWISE_LAMB)
    assert layout.state_values == 9 and layout.state_shape(3) == (3, 9)
    m1, m2 = layout.split_state(torch.arange(27.0).view(3, 9))
    assert m1.shape == (3, 8) and m2.tolist() == [8.0, 17.0, 26.0]


@pytest.mark.parametrize("precision", [SparseType.INT8, SparseType.BF16, "int8", "FP32", torch.float32])
def test_unsupported_precision_is_named_with_the_choices(precision: object) -> None:
    with pytest.raises(ValueError, match=r"precision=.* must be one of \['fp32', 'fp16'\]") as e:
        TableLayout(8, precision, "sgd")
    assert repr(precision) in str(e.value)
    with pytest.raises(ValueError, match=r"^weights_precision="):
        precision_name(precision, "weights_precision")


@pytest.mark.parametrize("dim", [0, -4, 2.5, True, "8"])
def test_bad_dim(dim: object) -> None:
    with pytest.raises(ValueError, match=r"dim=.* must be a positive integer"):
        TableLayout(dim, "fp32", "sgd")


def test_layout_is_frozen() -> None:
    layout = TableLayout(8, "fp32", "sgd")
    with pytest.raises(AttributeError):
        layout.dim = 16  # type: ignore[misc]
