"""The optimizer a plan sizes rows for: FBGEMM's EmbOptimType names in model files, and the
StorageAwarePlanner following the optimizer the sharder will train with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from tests.support.planner_nodes import CPU_NODE
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.model.model_spec import parse_model_spec
from torchrec_mtrains.planner.planner import StorageAwarePlanner
from torchrec_mtrains.sharding import TieredEmbeddingBagCollectionSharder

DIM = 16


def _row_bytes(optimizer: str, dtype: str = "fp32") -> int:
    doc = {"batch_size": 64, "target_qps": 100, "dtype": dtype, "optimizer": optimizer,
           "tables": [{"name": "t", "num_embeddings": 1000, "embedding_dim": DIM, "pooling_factor": 1,
                       "zipf_alpha": 1.0}]}
    return parse_model_spec(doc).tables[0].row_bytes


@pytest.mark.parametrize(
    "fbgemm,short",
    [("exact_row_wise_adagrad", "rowwise_adagrad"), ("row_wise_adagrad", "rowwise_adagrad"),
     ("exact_adagrad", "adagrad"), ("exact_sgd", "sgd")],
)
def test_model_files_take_fbgemm_names_for_the_same_layouts(fbgemm: str, short: str) -> None:
    assert _row_bytes(fbgemm) == _row_bytes(short)
    assert _row_bytes(fbgemm, "fp16") == _row_bytes(short, "fp16")


def test_model_files_size_fbgemm_only_optimizers() -> None:
    assert _row_bytes("exact_sgd") == DIM * 4
    assert _row_bytes("rowwise_adagrad") == DIM * 4 + 4
    assert _row_bytes("adam") == DIM * 4 + 2 * DIM * 4  # momentum1 and momentum2 per weight
    assert _row_bytes("partial_row_wise_adam") == DIM * 4 + (DIM + 1) * 4
    assert _row_bytes("adam", "fp16") == DIM * 2 + 2 * DIM * 4  # state stays fp32


def test_an_unknown_optimizer_lists_the_accepted_names() -> None:
    with pytest.raises(ValueError, match=r"optimizer='adamw' must be one of .*rowwise_adagrad.*exact_row_wise_adagrad"):
        _row_bytes("adamw")


def _ebc() -> EmbeddingBagCollection:
    configs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=n, embedding_dim=DIM, feature_names=[f"f{i}"])
               for i, n in enumerate((200_000, 500))]
    return EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))


def _plan(ebc, sharder, tmp_path: Path, **kwargs) -> StorageAwarePlanner:
    planner = StorageAwarePlanner(CPU_NODE, batch_size=64, world_size=1, storage_dir=str(tmp_path),
                                  budget_bytes={Tier.DRAM: 3_000_000}, **kwargs)
    planner.plan(ebc, [sharder])
    return planner


def test_planner_row_bytes_follow_the_sharders_fused_params(tmp_path: Path) -> None:
    sgd = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1})
    planner = _plan(_ebc(), sgd, tmp_path)
    assert planner.row_optimizer() == "exact_sgd"
    assert {t.row_bytes for t in planner.last_model.tables} == {DIM * 4}
    # No optimizer anywhere: the sharders train FBGEMM's default, EXACT_SGD (no state).
    planner = _plan(_ebc(), TieredEmbeddingBagCollectionSharder(), tmp_path)
    assert planner.row_optimizer() == "exact_sgd"
    assert {t.row_bytes for t in planner.last_model.tables} == {DIM * 4}
    # Row-wise Adagrad given to the sharder: its state value per row is sized.
    adagrad = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD})
    assert {t.row_bytes for t in _plan(_ebc(), adagrad, tmp_path).last_model.tables} == {DIM * 4 + 4}
    # The same optimizer given to the planner too, by its short name: fine.
    assert _plan(_ebc(), sgd, tmp_path, optimizer="sgd").row_optimizer() == "sgd"


def test_a_tables_own_optimizer_wins_over_fused_params(tmp_path: Path) -> None:
    ebc = _ebc()
    apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    sgd = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})
    planner = _plan(ebc, sgd, tmp_path)
    assert {t.row_bytes for t in planner.last_model.tables} == {DIM * 4 + 4}


def test_planner_and_sharder_disagreeing_on_the_optimizer_is_an_error(tmp_path: Path) -> None:
    sgd = TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})
    with pytest.raises(ValueError, match=r"optimizer='adagrad' sizes the rows, but the tables will train with 'exact_sgd'"):
        _plan(_ebc(), sgd, tmp_path, optimizer="adagrad")
    with pytest.raises(ValueError, match="optimizer='adamw' must be one of"):
        StorageAwarePlanner(CPU_NODE, batch_size=64, optimizer="adamw")


def test_adam_tables_are_sized_with_both_momenta(tmp_path: Path) -> None:
    """The tiered kernel trains the Adam family: its rows carry momentum1 and momentum2."""
    planner = _plan(_ebc(), TieredEmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.ADAM}),
                    tmp_path, optimizer="adam")
    assert {t.row_bytes for t in planner.last_model.tables} == {DIM * 4 * 3}
