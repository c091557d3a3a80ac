"""Sharding takes from torch's global generator what it takes when every table is FUSED.

TorchRec draws a FUSED table's numbers twice at sharding: FBGEMM's kernel fills its local
shards (``init_parameters``) and the sharded collection's ``reset_parameters`` fills its
``weight`` with the table's ``init_fn``, table after table. Tiered tables take the same
numbers and drop them (their rows keep the tier's seeded initial values), so the generator
after sharding -- the dense layers' dropout, a data loader seeded from it -- and the FUSED
tables' rows are those of an all-FUSED run. World size 1, in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

import torchrec_mtrains.sharding.kernel as kernel
from torchrec_mtrains import Tier
from torchrec_mtrains.sharding import (
    TieredEmbeddingBagCollectionSharder,
    TieredEmbeddingCollectionSharder,
    TieredParams,
    tiered_sharding_plan,
)

ROWS = {"a": 1000, "b": 300, "c": 50}
DIM = 8


def _configs(cls, init_fns: Optional[Dict[str, object]] = None):
    return [cls(name=n, num_embeddings=r, embedding_dim=DIM, feature_names=[f"f_{n}"],
                init_fn=(init_fns or {}).get(n)) for n, r in ROWS.items()]


def _shard(tiered: Dict[str, Tier], storage: Path, sharding_type: str = "table_wise", sequence: bool = False,
           init_fns: Optional[Dict[str, object]] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Shards a meta collection with the ``tiered`` tables on their tiers (the rest FUSED)
    from seed 0; (the generator's state after sharding, each FUSED table's weights)."""
    if sequence:
        module = EmbeddingCollection(tables=_configs(EmbeddingConfig, init_fns), device=torch.device("meta"))
        sharder, attr = TieredEmbeddingCollectionSharder(), "embeddings"
    else:
        module = EmbeddingBagCollection(tables=_configs(EmbeddingBagConfig, init_fns), device=torch.device("meta"))
        sharder, attr = TieredEmbeddingBagCollectionSharder(), "embedding_bags"
    tables = {n: (TieredParams(tiered[n], cache_load_factor=0.5, storage_dir=str(storage)) if n in tiered else None)
              for n in ROWS}
    plan = tiered_sharding_plan(module, tables, 1, sharding_type=sharding_type)
    torch.manual_seed(0)
    model = DistributedModelParallel(module, plan=ShardingPlan({"": plan}), sharders=[sharder],
                                     device=torch.device("cpu"))
    after = torch.get_rng_state()
    state = model.state_dict()
    fused = {n: state[f"{attr}.{n}.weight"].local_shards()[0].tensor.clone() for n in ROWS if n not in tiered}
    return after, fused


def _same_as_all_fused(tiered: Dict[str, Tier], tmp_path: Path, **kwargs) -> None:
    reference_state, reference = _shard({}, tmp_path / "fused", **kwargs)
    state, fused = _shard(tiered, tmp_path / "tiered", **kwargs)
    assert torch.equal(state, reference_state), "the generator after sharding differs from an all-FUSED run"
    assert fused.keys() == reference.keys() - tiered.keys()
    for name, weights in fused.items():
        assert torch.equal(weights, reference[name]), f"FUSED table {name} starts from other rows"


@pytest.mark.parametrize("tiered", [{"a": Tier.DRAM}, {"b": Tier.SSD}, {"a": Tier.SCM, "c": Tier.DRAM},
                                    {"a": Tier.SSD, "b": Tier.SCM, "c": Tier.DRAM}],
                         ids=["first", "middle", "first-and-last", "all"])
def test_bags_leave_the_generator_and_fused_rows_as_all_fused(process_group, tmp_path: Path, tiered) -> None:
    _same_as_all_fused(tiered, tmp_path)


@pytest.mark.parametrize("sharding_type", ["row_wise", "column_wise"])
def test_other_sharding_types_too(process_group, tmp_path: Path, sharding_type: str) -> None:
    _same_as_all_fused({"b": Tier.SSD}, tmp_path, sharding_type=sharding_type)


def test_sequences_too(process_group, tmp_path: Path) -> None:
    _same_as_all_fused({"b": Tier.SSD}, tmp_path, sequence=True)


def test_a_users_init_fn_takes_its_own_numbers(process_group, tmp_path: Path) -> None:
    # normal_ takes other numbers than uniform_: the tiered table runs the table's init_fn
    # on a tensor of its FUSED weight's shape.
    init_fns = {"a": lambda w: torch.nn.init.normal_(w, 0.0, 0.01), "b": torch.nn.init.xavier_uniform_}
    _same_as_all_fused({"a": Tier.DRAM, "b": Tier.SSD}, tmp_path, init_fns=init_fns)


def test_a_table_over_the_limit_draws_nothing(process_group, tmp_path: Path, monkeypatch) -> None:
    # a (8,000 weights) over a limit of 4,000: its tiered shard takes no numbers, b and c
    # (FUSED) take theirs twice, as always.
    monkeypatch.setattr(kernel, "FUSED_DRAWS_MAX_WEIGHTS", 4000)
    state, _ = _shard({"a": Tier.DRAM}, tmp_path)
    torch.manual_seed(0)
    torch.empty(2 * (ROWS["b"] + ROWS["c"]) * DIM).uniform_()
    assert torch.equal(state, torch.get_rng_state())


def test_tiered_rows_keep_their_seeded_initial_values(process_group, tmp_path: Path) -> None:
    # The numbers are dropped: a tiered table's rows do not depend on the generator.
    rows = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        module = EmbeddingBagCollection(tables=_configs(EmbeddingBagConfig), device=torch.device("meta"))
        plan = tiered_sharding_plan(module, {"a": TieredParams(Tier.DRAM, cache_load_factor=0.5), "b": None,
                                             "c": None}, 1)
        model = DistributedModelParallel(module, plan=ShardingPlan({"": plan}),
                                         sharders=[TieredEmbeddingBagCollectionSharder()], device=torch.device("cpu"))
        rows.append(model.state_dict()["embedding_bags.a.weight"].local_shards()[0].tensor.clone())
    assert torch.equal(rows[0], rows[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_drawing_in_blocks_takes_the_numbers_of_one_tensor(monkeypatch, dtype) -> None:
    monkeypatch.setattr(kernel, "_DRAW_BLOCK_WEIGHTS", 40)  # blocks of 5 rows of 8
    torch.manual_seed(3)
    kernel.draw_uniform(103, 8, dtype, -0.1, 0.1)
    blocks = torch.get_rng_state()
    torch.manual_seed(3)
    torch.empty(103, 8, dtype=dtype).uniform_(-0.1, 0.1)
    assert torch.equal(blocks, torch.get_rng_state())
