"""TieredConfig: the kernel's settings in one frozen object (CPU only).

The old keyword form of TieredEmbeddingBags and the config form build the same kernel and
train like FBGEMM; every setting is checked where the config is made; TieredParams makes
the kernel's config; the default load factor is one constant; a learning rate set between
steps survives the TBE being rebuilt larger.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from tests.support.tiered_helpers import (
    Model,
    Workload,
    assert_tables_match,
    drive,
    make_steps,
    output_checker,
    reference_run,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
)
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import DEFAULT_CACHE_LOAD_FACTOR, TieredConfig, TieredEmbeddingBags
from torchrec_mtrains.kernels.config import DEFAULTS
from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.sharding import TieredParams

SPECS = [(1500, 8), (600, 16)]
# The old form's positional parameters, in order; every other setting is keyword-only.
POSITIONAL = ["self", "embedding_specs", "tier", "cache_rows", "cache_load_factor", "storage_dir", "optimizer",
              "learning_rate", "eps", "pooling_mode", "cache_algorithm", "prefetch_pipeline"]


def _config(model: Model, tier: Tier, storage_dir: Path, **settings) -> TieredConfig:
    return TieredConfig(tier=tier, storage_dir=str(storage_dir), optimizer=model.optimizer,
                        learning_rate=model.learning_rate, eps=model.eps, pooling_mode=model.pooling,
                        weights_precision=model.precision, seed=model.seed, **settings)


# The two forms ---------------------------------------------------------------------------------
def test_constructor_settings_are_the_config_fields_with_its_defaults() -> None:
    params = inspect.signature(TieredEmbeddingBags.__init__).parameters
    settings = {name: p for name, p in params.items() if name not in ("self", "embedding_specs", "config")}
    fields = {f.name: f for f in dataclasses.fields(TieredConfig)}
    assert sorted(settings) == sorted(fields)
    for name, p in settings.items():
        assert p.default is fields[name].default, name
        assert getattr(DEFAULTS, name) == fields[name].default, name
    assert [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == POSITIONAL
    assert params["config"].kind is inspect.Parameter.KEYWORD_ONLY and params["config"].default is None


def test_old_form_and_config_form_build_the_same_kernel() -> None:
    old = TieredEmbeddingBags(
        SPECS, Tier.DRAM, [10, 20], None, None, EmbOptimType.EXACT_ADAGRAD, 0.1, 1e-6, PoolingMode.MEAN, "lfu",
        False, weights_precision=SparseType.FP16, cache_ways=4, init_range=(-0.1, 0.1), seed=3,
        table_names=["a", "b"], ssd_dram_cache_mb=1.0, feature_table_map=[0, 0, 1],
    )
    config = TieredConfig(
        tier=Tier.DRAM, cache_rows=(10, 20), optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.1, eps=1e-6,
        pooling_mode=PoolingMode.MEAN, cache_algorithm="lfu", prefetch_pipeline=False,
        weights_precision=SparseType.FP16, cache_ways=4, init_range=(-0.1, 0.1), seed=3, table_names=("a", "b"),
        ssd_dram_cache_mb=1.0, feature_table_map=(0, 0, 1),
    )
    new = TieredEmbeddingBags(SPECS, config=config)
    try:
        assert old.config == new.config == config
        for attr in ("tier", "embedding_specs", "table_names", "feature_table_map", "optimizer", "pooling_mode",
                     "weights_precision", "learning_rate", "eps", "cache_algorithm", "cache_ways", "cache_rows"):
            assert getattr(old, attr) == getattr(new, attr), attr
        assert new.cache_rows == [10, 20] and new.table_names == ["a", "b"] and new.feature_table_map == [0, 0, 1]
        assert new.layouts == [TableLayout(8, "fp16", "exact_adagrad"), TableLayout(16, "fp16", "exact_adagrad")]
        assert new.weights_dtype == torch.float16
        for w_old, w_new in zip(old.split_embedding_weights(), new.split_embedding_weights()):
            assert torch.equal(w_old, w_new)
    finally:
        old.close()
        new.close()


@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SSD], ids=lambda t: t.name)
def test_config_form_trains_like_fbgemm(tmp_path: Path, tier: Tier) -> None:
    model, workload = Model(optimizer=EmbOptimType.EXACT_ADAGRAD), Workload(steps=100, data_seed=11)
    traj = reference_run(model, workload)
    ker = TieredEmbeddingBags(list(model.specs), config=_config(model, tier, tmp_path, cache_rows=32, cache_ways=8,
                                                                cache_algorithm="lfu"))
    try:
        drive(ker, make_steps(model.specs, workload), "ahead", output_checker(traj, model))
        assert_tables_match(ker, traj, model)
    finally:
        ker.close()


def test_config_with_a_changed_setting_is_refused(tmp_path: Path) -> None:
    config = TieredConfig(tier=Tier.SSD, storage_dir=str(tmp_path / "store"))
    with pytest.raises(ValueError, match=r"config or the settings \['cache_rows', 'learning_rate'\], not both"):
        TieredEmbeddingBags(SPECS, cache_rows=8, learning_rate=0.5, config=config)
    with pytest.raises(ValueError, match=r"config or the settings \['table_names'\]"):
        TieredEmbeddingBags(SPECS, table_names=["a", "b"], config=config)
    with pytest.raises(ValueError, match="config must be a TieredConfig, got dict"):
        TieredEmbeddingBags(SPECS, config={"tier": Tier.DRAM})
    assert not (tmp_path / "store").exists()
    # Arguments at their defaults go with a config, which gives every setting.
    ker = TieredEmbeddingBags(SPECS, tier=DEFAULTS.tier, learning_rate=0.01,
                              config=TieredConfig(tier=Tier.DRAM, learning_rate=0.5))
    try:
        assert ker.tier is Tier.DRAM and ker.learning_rate == 0.5
    finally:
        ker.close()


# Checks and normalisation --------------------------------------------------------------------
CONFIG_ERRORS = {
    "optimizer_lars": (dict(optimizer=EmbOptimType.LARS_SGD), r"optimizer=.*must be one of"),
    "optimizer_string": (dict(optimizer="adamw"), r"optimizer='adamw' must be one of"),
    "precision_int8": (dict(weights_precision=SparseType.INT8), r"weights_precision=.*must be one of"),
    "pooling_string": (dict(pooling_mode="sum"), "pooling_mode"),
    "cache_algorithm": (dict(cache_algorithm="fifo"), "cache_algorithm='fifo'"),
    "tier_string": (dict(tier="ssd"), "tier='ssd' must be a torchrec_mtrains.Tier"),
    "learning_rate_nan": (dict(learning_rate=math.nan), "learning_rate=nan"),
    "eps_negative": (dict(eps=-1.0), "eps=-1.0"),
    "ssd_dram_cache_mb_negative": (dict(ssd_dram_cache_mb=-1), "ssd_dram_cache_mb=-1"),
    "cache_ways_zero": (dict(cache_ways=0), r"cache_ways=0 must be an integer in \[1, 1024\]"),
    "cache_ways_past_limit": (dict(cache_ways=2048), "cache_ways=2048"),
    "seed_negative": (dict(seed=-1), "seed=-1"),
    "seed_float": (dict(seed=1.5), "seed=1.5"),
    "cache_rows_zero": (dict(cache_rows=0), "cache_rows=0"),
    "cache_rows_one_zero": (dict(cache_rows=[4, 0]), r"cache_rows=\[4, 0\]"),
    "cache_rows_string": (dict(cache_rows="8"), "cache_rows='8'"),
    "cache_rows_and_load_factor": (dict(cache_rows=8, cache_load_factor=0.1), "not both"),
    "cache_load_factor_zero": (dict(cache_load_factor=0.0), "cache_load_factor=0.0"),
    "init_range_reversed": (dict(init_range=(1.0, -1.0)), "init_range"),
    "init_range_not_pairs": (dict(init_range=[(0.0, 1.0), (0.0,)]), "init_range"),
    "init_range_nan": (dict(init_range=(math.nan, 1.0)), "init_range"),
    "table_names_duplicate": (dict(table_names=["a", "a"]), "table_names"),
    "table_names_slash": (dict(table_names=["a/b"]), "table_names"),
    "table_names_empty": (dict(table_names=[""]), "table_names"),
    "storage_dir_not_a_path": (dict(storage_dir=3), "storage_dir=3"),
    "feature_table_map_not_a_sequence": (dict(feature_table_map=3), "feature_table_map=3"),
    "dense_slot_map_int": (dict(dense_slot_map=1), r"dense_slot_map=1 must be None \(the rule picks the tables\), "
                                                   "True or False"),
    "dense_slot_map_string": (dict(dense_slot_map="auto"), "dense_slot_map='auto'"),
}


@pytest.mark.parametrize("name", list(CONFIG_ERRORS))
def test_config_rejects(name: str) -> None:
    settings, match = CONFIG_ERRORS[name]
    with pytest.raises(ValueError, match=match):
        TieredConfig(**settings)


def test_config_keeps_normalised_values() -> None:
    c = TieredConfig(optimizer="exact_sgd", weights_precision="fp16", cache_rows=[3, 4],
                     init_range=[(-1, 1), (0, 2)], table_names=["a", "b"], feature_table_map=[0, 1, 1],
                     learning_rate=1, prefetch_pipeline=0)
    assert c.optimizer is EmbOptimType.EXACT_SGD and c.weights_precision is SparseType.FP16
    assert c.cache_rows == (3, 4) and c.init_range == ((-1.0, 1.0), (0.0, 2.0))
    assert c.table_names == ("a", "b") and c.feature_table_map == (0, 1, 1)
    assert TieredConfig(storage_dir=Path("/x")).storage_dir == "/x"
    assert c.learning_rate == 1.0 and isinstance(c.learning_rate, float) and c.prefetch_pipeline is False
    assert hash(c) == hash(dataclasses.replace(c))
    assert c.layout(8) == TableLayout(8, "fp16", "exact_sgd")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.tier = Tier.DRAM  # type: ignore[misc]


def test_per_table_settings_resolve_against_the_tables() -> None:
    default = TieredConfig()
    assert default.cache_sizes([100, 7]) == [math.ceil(100 * DEFAULT_CACHE_LOAD_FACTOR),
                                             math.ceil(7 * DEFAULT_CACHE_LOAD_FACTOR)]
    assert TieredConfig(cache_load_factor=0.5).cache_sizes([10, 1]) == [5, 1]
    assert TieredConfig(cache_rows=4).cache_sizes([10, 20]) == [4, 4]
    with pytest.raises(ValueError, match="cache_rows"):
        TieredConfig(cache_rows=(1, 2, 3)).cache_sizes([10, 20])
    assert default.init_ranges([100]) == [(-0.1, 0.1)]
    assert TieredConfig(init_range=(-1, 1)).init_ranges([5, 6]) == [(-1.0, 1.0)] * 2
    with pytest.raises(ValueError, match="init_range"):
        TieredConfig(init_range=[(-1, 1)] * 3).init_ranges([5, 6])
    assert default.names(2) == ["table_0", "table_1"]
    with pytest.raises(ValueError, match="table_names"):
        TieredConfig(table_names=["a"]).names(2)


@pytest.mark.parametrize("settings,match", [
    (dict(cache_rows=[10]), "cache_rows"),
    (dict(init_range=[(-1.0, 1.0)]), "init_range"),
    (dict(table_names=["a"]), "table_names"),
    (dict(feature_table_map=[0, 0]), "feature_table_map"),
])
def test_config_for_other_tables_is_refused_before_any_file(tmp_path: Path, settings, match: str) -> None:
    config = TieredConfig(tier=Tier.SSD, storage_dir=str(tmp_path / "store"), **settings)
    with pytest.raises(ValueError, match=match):
        TieredEmbeddingBags(SPECS, config=config)
    assert not (tmp_path / "store").exists()


# The dense row-to-slot map ------------------------------------------------------------------------
def test_dense_slot_map_rule_and_forced_settings() -> None:
    """None follows the rule (the map's 4 bytes a table row at most an eighth of the cache
    slots' row bytes), True and False force it; the kernel builds what the config says."""
    # fp32, row-wise Adagrad: dim 64 -> 260-byte rows, dim 8 -> 36-byte rows.
    specs, cache = [(1000, 64), (1000, 8)], [200, 200]
    row_bytes = [TableLayout(dim, "fp32", "exact_row_wise_adagrad").row_bytes for _, dim in specs]
    assert row_bytes == [260, 36]
    rows = [r for r, _ in specs]
    # 4,000 map bytes against 200 x 260 / 8 = 6,500 (kept) and 200 x 36 / 8 = 900 (not).
    assert TieredConfig().dense_maps(rows, cache, row_bytes) == [True, False]
    assert TieredConfig(dense_slot_map=True).dense_maps(rows, cache, row_bytes) == [True, True]
    assert TieredConfig(dense_slot_map=False).dense_maps(rows, cache, row_bytes) == [False, False]
    for setting, want in ((None, [True, False]), (True, [True, True]), (False, [False, False])):
        ker = TieredEmbeddingBags(specs, tier=Tier.DRAM, cache_rows=cache, dense_slot_map=setting)
        try:
            assert ker.dense_slot_maps == want and ker.config.dense_slot_map is setting
        finally:
            ker.close()


def test_dense_slot_map_forced_on_a_cache_past_32_bit_slots_is_refused() -> None:
    with pytest.raises(ValueError, match=r"dense_slot_map=True: table big's cache of 4294967295 slots"):
        TieredConfig(dense_slot_map=True, table_names=["big"]).dense_maps([2**33], [2**32 - 1], [64])
    assert TieredConfig().dense_maps([2**33], [2**32 - 1], [4096]) == [False]  # the rule never picks it


# One default load factor; TieredParams makes the kernel's config ------------------------------------
def test_default_load_factor_is_one_constant() -> None:
    params = TieredParams(Tier.DRAM)
    assert params.load_factor(100) == DEFAULT_CACHE_LOAD_FACTOR
    assert params.shard_cache_rows(50, 100) == math.ceil(50 * DEFAULT_CACHE_LOAD_FACTOR)
    ker = TieredEmbeddingBags([(100, 8)], tier=Tier.DRAM)
    try:
        assert ker.cache_rows == [math.ceil(100 * DEFAULT_CACHE_LOAD_FACTOR)]
    finally:
        ker.close()


def test_tiered_params_make_the_kernel_config() -> None:
    params = TieredParams(Tier.SSD, cache_rows=10, cache_algorithm="lfu", storage_dir="/data")
    config = params.kernel_config(cache_rows=[5], storage_dir="/data/rank_0", learning_rate=0.1)
    assert config == TieredConfig(tier=Tier.SSD, cache_algorithm="lfu", cache_rows=(5,),
                                  storage_dir="/data/rank_0", learning_rate=0.1)
    with pytest.raises(ValueError, match="learning_rate"):
        params.kernel_config(learning_rate=-1.0)
    assert TieredParams(Tier.DRAM).cache_algorithm == DEFAULTS.cache_algorithm


# The learning rate ------------------------------------------------------------------------------
def test_set_learning_rate_survives_the_tbe_growing(tmp_path: Path) -> None:
    """Built with a tenth of the reference's rate and set to it before training; a cache of
    8 slots and prefetches two batches ahead overflow the cache, so the TBE is rebuilt larger
    during the run and must keep the rate set, not the one the kernel was built with."""
    model, workload = Model(), Workload(steps=150, data_seed=2)
    traj = reference_run(model, workload)
    config = _config(model, Tier.DRAM, tmp_path, cache_rows=8, cache_ways=4)
    ker = TieredEmbeddingBags(list(model.specs), config=dataclasses.replace(
        config, learning_rate=model.learning_rate / 10))
    try:
        tbe_rows = list(ker._cache.slots.rows)  # internal: the TBE's rows per table
        ker.set_learning_rate(model.learning_rate)
        assert ker.learning_rate == ker.config.learning_rate == model.learning_rate
        drive(ker, make_steps(model.specs, workload), "ahead2", output_checker(traj, model))
        assert_tables_match(ker, traj, model)
        assert all(now > before for now, before in zip(ker._cache.slots.rows, tbe_rows)), "the TBE did not grow"
        with pytest.raises(ValueError, match="learning_rate=nan"):
            ker.set_learning_rate(math.nan)
        assert ker.learning_rate == model.learning_rate
    finally:
        ker.close()


@pytest.mark.parametrize("tiers, threads, cpus, want", [
    ((Tier.DRAM,), 2, 2, False),  # torch's threads fill the rank's CPUs: inline
    ((Tier.DRAM, Tier.SCM), 1, 4, True),  # CPUs to spare
    ((Tier.DRAM, Tier.SSD), 2, 2, True),  # an SSD table's moves wait on the device
])
def test_stage_threads_where_they_pay(monkeypatch, tmp_path: Path, tiers, threads, cpus, want) -> None:
    """prefetch_pipeline=None (sharded tables' setting) picks stage threads by the rule of
    kernels/stage_threads.py; True (TieredEmbeddingBags' default) and False force it."""
    from torchrec_mtrains.kernels import stage_threads

    monkeypatch.setattr(stage_threads, "cpus_per_rank", lambda: cpus)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    assert DEFAULTS.prefetch_pipeline is True and TieredConfig(prefetch_pipeline=None).prefetch_pipeline is None
    specs = [(100, 8)] * len(tiers)
    for setting, expected in ((None, want), (True, True), (False, False)):
        ker = TieredEmbeddingBags(specs, tier=tiers, cache_rows=16, storage_dir=str(tmp_path / str(setting)),
                                  prefetch_pipeline=setting)
        assert ker.stage_threads is expected, setting
        ker(torch.arange(8) % 100, torch.arange(0, 9, 4 if len(tiers) == 2 else 8)).sum().backward()
        ker.close()


def test_cpus_per_rank_shares_the_node(monkeypatch) -> None:
    from torchrec_mtrains.kernels.stage_threads import cpus_per_rank

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    alone = cpus_per_rank()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(alone * 2))
    assert cpus_per_rank() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert cpus_per_rank() == alone
