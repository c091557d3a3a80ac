"""TorchRec's fused_params on tiered tables (sharding/fused_params.py): FBGEMM's defaults where
they are silent, the learning rate held as FBGEMM holds it through schedulers, and every
keyword of FBGEMM's TBE constructor honoured -- reaching the kernel's TBE, training a tiered
table bit for bit as a FUSED table beside it in the same model -- or refused naming it.

World size 1, in this process. The "twin" model has two tables of one shape fed the same ids:
``tiered`` on the tiered kernel, ``fused`` on FBGEMM's FUSED kernel, both started from the
same weights, so after training their weights must be equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, CacheAlgorithm, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    CounterBasedRegularizationDefinition,
    CowClipDefinition,
    EmainplaceModeDefinition,
    EnsembleModeDefinition,
    GlobalWeightDecayDefinition,
    RecordCacheMetrics,
    WeightDecayMode,
)
from fbgemm_gpu.tbe.config.optimizer_config import UserEnabledConfigDefinition
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import DataType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import torchrec_mtrains.kernels.slots as slots_module
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels.tbe_settings import KERNEL_KEYWORDS, PASSED, REFUSED, TBE_DEFAULTS, tbe_keywords
from torchrec_mtrains.sharding import ShardedTieredEmbeddingBagCollection, TieredEmbeddingBagCollectionSharder
from torchrec_mtrains.sharding import TieredParams, tiered_sharding_plan
from torchrec_mtrains.sharding.fused_params import HONOURED_TBE_KEYWORDS, REFUSED_TBE_KEYWORDS

ROWS, DIM, BATCH = 60, 8, 6
TABLES = ("tiered", "fused")


def _ebc(names=TABLES, data_type: DataType = DataType.FP32) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=n, num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f_{n}"],
                           data_type=data_type) for n in names], device=torch.device("cpu"))


def _dmp(fused_params: Dict[str, Any], tmp_path: Path, tier: Tier = Tier.DRAM, names=TABLES,
         data_type: DataType = DataType.FP32, params: Optional[TieredParams] = None) -> DistributedModelParallel:
    ebc = _ebc(names, data_type)
    params = params or TieredParams(tier, cache_rows=8, storage_dir=str(tmp_path))
    plan = tiered_sharding_plan(ebc, {n: params if n == "tiered" else None for n in names}, 1)
    return DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}),
                                    sharders=[TieredEmbeddingBagCollectionSharder(fused_params=dict(fused_params))],
                                    device=torch.device("cpu"))


def _kernel(dmp):
    sharded = next(m for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection))
    (kernel,) = sharded.tiered_kernels()
    return kernel


def _fused_tbe(dmp):
    """The FUSED table's FBGEMM TBE."""
    from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbeddingBag

    sharded = next(m for m in dmp.modules() if isinstance(m, ShardedTieredEmbeddingBagCollection))
    (kernel,) = [k for lookup in sharded._lookups for k in lookup._emb_modules
                 if isinstance(k, BatchedFusedEmbeddingBag)]
    return kernel.emb_module


def _weights(dmp) -> Dict[str, torch.Tensor]:
    sd = dmp.state_dict()
    return {n: sd[f"embedding_bags.{n}.weight"].local_shards()[0].tensor.clone() for n in TABLES}


def _start_equal(dmp) -> None:
    """Both tables start from the same weights (the FUSED table's state_dict aliases it)."""
    init = torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(1)) - 0.5
    sd = dmp.state_dict()
    for n in TABLES:
        sd[f"embedding_bags.{n}.weight"].local_shards()[0].tensor.copy_(init)
    dmp.load_state_dict(sd)


def _train(dmp, steps: int, scheduler=None, lrs: Optional[List] = None) -> None:
    g = torch.Generator().manual_seed(0)
    opt = dmp.fused_optimizer
    for _ in range(steps):
        lengths = torch.randint(0, 4, (BATCH,), generator=g)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n in TABLES], values=torch.cat([ids, ids]),
                                                  lengths=torch.cat([lengths, lengths]))
        out = dmp(kjt)
        grad = torch.randn(BATCH, DIM, generator=g)
        loss = sum((out[f"f_{n}"].float() * grad).sum() for n in TABLES)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if lrs is not None:  # the param groups' (one per kernel), then each kernel's TBE's
            lrs.append(([g["lr"] for g in opt.param_groups],
                        (_kernel(dmp).emb_module.get_learning_rate(), _fused_tbe(dmp).get_learning_rate())))
        if scheduler is not None:
            scheduler.step()


def _assert_twins_equal(dmp) -> None:
    w = _weights(dmp)
    diff = (w["tiered"].float() - w["fused"].float()).abs().max().item()
    assert torch.equal(w["tiered"], w["fused"]), f"tiered and FUSED weights differ (max abs diff {diff:.3g})"


class _TbeSpy:
    """Records the keywords of every FBGEMM TBE the tiered kernel builds."""

    def __init__(self, monkeypatch) -> None:
        self.calls: List[Dict[str, Any]] = []
        real = slots_module.SplitTableBatchedEmbeddingBagsCodegen

        def build(*args, **kwargs):
            self.calls.append(kwargs)
            return real(*args, **kwargs)

        monkeypatch.setattr(slots_module, "SplitTableBatchedEmbeddingBagsCodegen", build)


# ---------------------------------------------------------------- FBGEMM's defaults ----
def test_silent_fused_params_take_fbgemms_defaults(process_group, tmp_path: Path, monkeypatch) -> None:
    spy = _TbeSpy(monkeypatch)
    dmp = _dmp({}, tmp_path)
    config = _kernel(dmp).emb_module.config
    fused = _fused_tbe(dmp)
    assert config.optimizer == TBE_DEFAULTS["optimizer"] == EmbOptimType.EXACT_SGD == fused.optimizer
    assert (config.learning_rate, config.eps) == (TBE_DEFAULTS["learning_rate"], TBE_DEFAULTS["eps"])
    assert _kernel(dmp).emb_module.get_learning_rate() == fused.get_learning_rate()
    assert not _kernel(dmp).has_optimizer_state()  # SGD keeps none
    # Nothing else is set on the kernel's TBE: every other setting is FBGEMM's default. (The
    # weights' memory is the kernel's own, on huge pages: where they live, not how they train.)
    (kwargs,) = spy.calls
    assert set(kwargs) == {"optimizer", "learning_rate", "eps", "pooling_mode", "weights_precision",
                           "feature_table_map", "preallocated_host_buffers"}
    assert set(kwargs["preallocated_host_buffers"]) == {"weights"}
    _start_equal(dmp)
    _train(dmp, 6)
    _assert_twins_equal(dmp)


def test_a_key_value_table_takes_fbgemms_defaults(process_group, tmp_path: Path) -> None:
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import KeyValueParams

    ebc = _ebc()
    sharder = TieredEmbeddingBagCollectionSharder()
    plan = construct_module_sharding_plan(
        ebc, {"tiered": table_wise(rank=0, compute_kernel="key_value"),
              "fused": table_wise(rank=0, compute_kernel="fused")},
        sharder=sharder, local_size=1, world_size=1, device_type="cpu")
    plan["tiered"].key_value_params = KeyValueParams(ssd_storage_directory=str(tmp_path / "kv@local_rank"))
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), sharders=[sharder], device=torch.device("cpu"))
    assert _kernel(dmp).emb_module.config.optimizer == EmbOptimType.EXACT_SGD == _fused_tbe(dmp).optimizer
    _start_equal(dmp)
    _train(dmp, 6)
    _assert_twins_equal(dmp)


# ------------------------------------------------------------------ learning rate ----
def test_learning_rate_is_held_as_fbgemm_holds_it_through_a_scheduler(process_group, tmp_path: Path) -> None:
    """StepLR(gamma=0.1) decays the float32 FBGEMM holds (0.009999999776482582), on the
    tiered kernel's param group as on the FUSED one's, and hands both TBEs the same value."""
    dmp = _dmp({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}, tmp_path, Tier.SSD)
    _start_equal(dmp)
    scheduler = torch.optim.lr_scheduler.StepLR(dmp.fused_optimizer, step_size=2, gamma=0.1)
    lrs: List = []
    _train(dmp, 9, scheduler, lrs)
    assert lrs[0][0] == [0.009999999776482582] * 2
    for step, (groups, tbes) in enumerate(lrs):
        assert len(groups) == 2 and groups[0] == groups[1], f"step {step}: param group lrs {groups}"
        assert tbes[0] == tbes[1], f"step {step}: the TBEs hold {tbes}"
    assert len({tbes for _, tbes in lrs}) == 5  # four decays
    _assert_twins_equal(dmp)


# -------------------------------------------------------- every keyword decided ----
def test_every_tbe_keyword_is_honoured_or_refused() -> None:
    """A keyword a new FBGEMM adds fails here until it is decided (kernels/tbe_settings.py,
    sharding/fused_params.py)."""
    keywords = set(tbe_keywords())
    assert not HONOURED_TBE_KEYWORDS & REFUSED_TBE_KEYWORDS
    assert keywords - HONOURED_TBE_KEYWORDS - REFUSED_TBE_KEYWORDS == set(), "undecided"
    assert HONOURED_TBE_KEYWORDS | REFUSED_TBE_KEYWORDS == keywords, "decided but no longer FBGEMM's"
    # The kernel's own view: set by the kernel, passed on, or refused.
    fates = [set(KERNEL_KEYWORDS), set(PASSED), set(REFUSED)]
    assert sum(map(len, fates)) == len(keywords) and set().union(*fates) == keywords


# A value of each refused keyword that asks for something the tiered kernel cannot do
# (hashable, as TorchRec groups tables by their fused_params).
REFUSED_VALUES: Dict[str, Any] = {
    "embedding_specs": ((ROWS, DIM),),
    "feature_table_map": (0,),
    "pooling_mode": PoolingMode.SUM,
    "weights_precision": SparseType.FP32,
    "table_names": ("tiered",),
    "device": "cpu",
    "cache_algorithm": CacheAlgorithm.LFU,  # the table's row cache runs LRU
    "cache_sets": 16,
    "cache_reserved_memory": 1.0,
    "cache_precision": SparseType.FP16,  # an FP32 table
    "enforce_hbm": True,
    "record_cache_metrics": RecordCacheMetrics(True, False),
    "gather_uvm_cache_stats": True,
    "max_norm": 1.0,
    "momentum": 0.5,
    "eta": 0.01,
    "beta1": 0.5,
    "beta2": 0.5,
    "ensemble_mode": EnsembleModeDefinition(),
    "emainplace_mode": EmainplaceModeDefinition(),
    "counter_based_regularization": CounterBasedRegularizationDefinition(),
    "cowclip_regularization": CowClipDefinition(),
    "global_weight_decay": GlobalWeightDecayDefinition(),
    "bounds_check_mode": BoundsCheckMode.WARNING,
    "uvm_non_rowwise_momentum": True,
    "use_experimental_tbe": True,
    "stats_reporter_config": "a stats reporter",
    "optimizer_state_dtypes": (("momentum1", SparseType.FP16),),
    "multipass_prefetch_config": "a multipass prefetch config",
    "uvm_host_mapped": True,
    "extra_optimizer_config": UserEnabledConfigDefinition(use_writeback_bwd_prehook=True),
    "tbe_input_multiplexer_config": "an input multiplexer",
    "embedding_shard_info": ((ROWS, DIM, 0, 0),),
    "enable_raw_embedding_streaming": True,
    "res_params": "raw embedding streaming parameters",
    "is_qr_tbe": True,
    "preallocated_host_buffers": "host buffers",
}


def test_refused_values_cover_the_refused_keywords() -> None:
    assert set(REFUSED_VALUES) == REFUSED_TBE_KEYWORDS


@pytest.mark.parametrize("key", sorted(REFUSED_VALUES))
def test_a_refused_keyword_raises_naming_it(process_group, tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match=rf"tables tiered on tier DRAM: .*\b{key}\b"):
        _dmp({key: REFUSED_VALUES[key]}, tmp_path, names=("tiered",))


# Each honoured keyword with the fused_params that set it (with what it needs).
_ROWWISE_DECAY = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "weight_decay": 0.1,
                  "weight_decay_mode": WeightDecayMode.L2, "output_dtype": SparseType.FP16}
HONOURED_VALUES: Dict[str, Dict[str, Any]] = {
    "optimizer": {"optimizer": EmbOptimType.EXACT_ADAGRAD},
    "learning_rate": {"learning_rate": 0.3},
    "eps": {"eps": 0.5},
    "gradient_clipping": {"gradient_clipping": True, "max_gradient": 0.25},
    "max_gradient": {"gradient_clipping": True, "max_gradient": 0.25},
    "weight_decay": _ROWWISE_DECAY,
    "weight_decay_mode": _ROWWISE_DECAY,
    "stochastic_rounding": {"stochastic_rounding": False},
    "output_dtype": {"output_dtype": SparseType.FP16},
    "embedding_table_index_type": {"embedding_table_index_type": torch.int32},
    "embedding_table_offset_type": {"embedding_table_offset_type": torch.int32},
    "cache_load_factor": {"cache_load_factor": 0.5},
    "prefetch_pipeline": {"prefetch_pipeline": True},
}


def test_honoured_values_cover_the_honoured_keywords() -> None:
    assert set(HONOURED_VALUES) == HONOURED_TBE_KEYWORDS


@pytest.mark.parametrize("key", sorted(HONOURED_VALUES))
def test_an_honoured_keyword_reaches_the_kernels_tbe(process_group, tmp_path: Path, monkeypatch, key: str) -> None:
    spy = _TbeSpy(monkeypatch)
    fused_params = HONOURED_VALUES[key]
    # No cache size in the plan entry: the sharder's cache_load_factor sizes the cache.
    dmp = _dmp(fused_params, tmp_path, names=("tiered",), params=TieredParams(Tier.DRAM))
    (kwargs,) = spy.calls
    kernel = _kernel(dmp).emb_module
    if key == "cache_load_factor":  # the row cache's size, not a TBE setting
        assert kernel.cache_rows == [ROWS // 2] and key not in kwargs
    elif key == "prefetch_pipeline":  # the row cache's own guarantee, not a TBE setting
        assert key not in kwargs
    else:
        assert kwargs[key] == fused_params[key]


# ---------------------------------------------- training as a FUSED table trains ----
@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SCM, Tier.SSD], ids=lambda t: t.name)
@pytest.mark.parametrize("optimizer", [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD,
                                       EmbOptimType.EXACT_ROWWISE_ADAGRAD], ids=lambda o: o.name)
def test_each_optimizer_trains_as_on_a_fused_table(process_group, tmp_path: Path, tier: Tier,
                                                   optimizer: EmbOptimType) -> None:
    dmp = _dmp({"optimizer": optimizer, "learning_rate": 0.1}, tmp_path, tier)
    _start_equal(dmp)
    _train(dmp, 8)
    _assert_twins_equal(dmp)
    sd = dmp.fused_optimizer.state_dict()["state"]
    tiered = {k: v for k, v in sd["embedding_bags.tiered.weight"].items() if k != "step"}
    fused = {k.replace("fused", "tiered"): v for k, v in sd["embedding_bags.fused.weight"].items() if k != "step"}
    assert tiered.keys() == fused.keys()
    for name in tiered:
        assert torch.equal(tiered[name].local_shards()[0].tensor, fused[name].local_shards()[0].tensor), name


SETTINGS = {
    "gradient_clipping": ({"optimizer": EmbOptimType.EXACT_ADAGRAD, "gradient_clipping": True, "max_gradient": 0.05},
                          DataType.FP32, Tier.SSD),
    "l2_fp16_tables": ({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "weight_decay": 0.5,
                        "weight_decay_mode": WeightDecayMode.L2}, DataType.FP16, Tier.SCM),
    "decouple_fp16_output": ({"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "weight_decay": 0.5,
                              "weight_decay_mode": WeightDecayMode.DECOUPLE, "output_dtype": SparseType.FP16},
                             DataType.FP32, Tier.DRAM),
    "fp16_output": ({"output_dtype": SparseType.FP16}, DataType.FP32, Tier.SSD),
    "no_stochastic_rounding": ({"stochastic_rounding": False}, DataType.FP16, Tier.DRAM),
    "int32_indices": ({"embedding_table_index_type": torch.int32, "embedding_table_offset_type": torch.int32},
                      DataType.FP32, Tier.SCM),
}
# The keys each case is about (the rest of its fused_params is context).
_UNDER_TEST = {"gradient_clipping": ("gradient_clipping", "max_gradient"), "l2_fp16_tables": ("weight_decay",),
               "decouple_fp16_output": ("weight_decay",), "fp16_output": ("output_dtype",)}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_a_tbe_setting_trains_as_on_a_fused_table(process_group, tmp_path: Path, case: str) -> None:
    fused_params, data_type, tier = SETTINGS[case]
    dmp = _dmp({"learning_rate": 0.1, **fused_params}, tmp_path / "with", tier, data_type=data_type)
    _start_equal(dmp)
    _train(dmp, 8)
    _assert_twins_equal(dmp)
    if case in _UNDER_TEST:  # and the setting changed the training
        without = {k: v for k, v in fused_params.items() if k not in _UNDER_TEST[case]}
        base = _dmp({"learning_rate": 0.1, **without}, tmp_path / "without", tier, data_type=data_type)
        _start_equal(base)
        _train(base, 8)
        assert not torch.equal(_weights(dmp)["tiered"], _weights(base)["tiered"])


# ------------------------------------------------------ TorchRec's and other keys ----
@pytest.mark.parametrize("fused_params,match", [
    ({"__register_tbes_in_named_modules": True}, r"__register_tbes_in_named_modules.*quantised inference"),
    ({"res_store_shards": 2}, r"res_store_shards.*raw embedding streaming"),
    ({"ssd_storage_directory": "/x"}, r"ssd_storage_directory.*KeyValueParams field"),
    ({"not_a_setting": 1}, r"not_a_setting.*no such setting"),
    ({"lr": 0.1, "learning_rate": 0.2}, r"lr=0.1 and learning_rate=0.2"),
    ({"optimizer": EmbOptimType.LARS_SGD}, r"optimizer=.*lars_sgd.*FBGEMM's CPU TBE does not train it"),
    ({"optimizer": EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD}, r"EMA pass rewrites every row"),
    ({"weight_decay": 0.1, "weight_decay_mode": WeightDecayMode.L2, "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD},
     r"weight_decay_mode=.*L2.*does not apply it to these tables"),
    ({"weight_decay_mode": WeightDecayMode.COUNTER}, r"weight_decay_mode=.*COUNTER.*row layout"),
])
def test_other_keys_are_refused_naming_them(process_group, tmp_path: Path, fused_params, match) -> None:
    with pytest.raises(ValueError, match=match):
        _dmp(fused_params, tmp_path, names=("tiered",))


def test_torchrecs_grouping_keys_and_lr_are_accepted(process_group, tmp_path: Path) -> None:
    dmp = _dmp({"use_one_tbe_per_table": True, "lr": 0.2, "cache_algorithm": CacheAlgorithm.LRU}, tmp_path,
               names=("tiered",))
    assert _kernel(dmp).emb_module.config.learning_rate == 0.2


def test_the_plan_entrys_cache_size_wins_over_the_sharders(process_group, tmp_path: Path) -> None:
    dmp = _dmp({"cache_load_factor": 0.5}, tmp_path, names=("tiered",),
               params=TieredParams(Tier.DRAM, cache_load_factor=0.1))
    assert _kernel(dmp).emb_module.cache_rows == [6]
    with pytest.raises(ValueError, match=r"table tiered: fused_params\['cache_load_factor'\]=-1"):
        _dmp({"cache_load_factor": -1}, tmp_path, names=("tiered",), params=TieredParams(Tier.DRAM))


def test_a_sequence_table_trains_as_on_a_fused_table(process_group, tmp_path: Path) -> None:
    """TorchRec's EmbeddingCollection (a row per id) through the sequence sharder, with
    fused_params silent (EXACT_SGD) but for a setting passed on: gradient clipping."""
    from torchrec import EmbeddingCollection, EmbeddingConfig

    from torchrec_mtrains.sharding import TieredEmbeddingCollectionSharder

    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=n, num_embeddings=ROWS, embedding_dim=DIM,
                                                     feature_names=[f"f_{n}"]) for n in TABLES],
                             device=torch.device("cpu"))
    plan = tiered_sharding_plan(ec, {"tiered": TieredParams(Tier.SSD, cache_rows=8, storage_dir=str(tmp_path)),
                                     "fused": None}, 1)
    sharder = TieredEmbeddingCollectionSharder(fused_params={"gradient_clipping": True, "max_gradient": 0.02})
    dmp = DistributedModelParallel(ec, plan=ShardingPlan({"": plan}), sharders=[sharder], device=torch.device("cpu"))
    init = torch.rand(ROWS, DIM, generator=torch.Generator().manual_seed(1)) - 0.5
    sd = dmp.state_dict()
    for n in TABLES:
        sd[f"embeddings.{n}.weight"].local_shards()[0].tensor.copy_(init)
    dmp.load_state_dict(sd)
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        lengths = torch.randint(0, 4, (BATCH,), generator=g)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        out = dmp(KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{n}" for n in TABLES], values=torch.cat([ids, ids]),
                                                      lengths=torch.cat([lengths, lengths])))
        grad = torch.randn(ids.numel(), DIM, generator=g)
        sum((out[f"f_{n}"].values() * grad).sum() for n in TABLES).backward()
    sd = dmp.state_dict()
    tiered, fused = (sd[f"embeddings.{n}.weight"].local_shards()[0].tensor for n in TABLES)
    assert torch.equal(tiered, fused)
    assert not torch.equal(tiered, init)
