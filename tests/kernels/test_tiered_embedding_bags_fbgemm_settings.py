"""FBGEMM's TBE settings on TieredEmbeddingBags (kernels/tbe_settings.py), against FBGEMM's CPU
TBE with the whole table in DRAM, bit for bit.

Every optimizer FBGEMM's CPU TBE trains that the tiered kernel takes, on every tier; each
TBE setting the kernel passes to its TBE (gradient clipping, weight decay, output dtype,
rounding, index types), on every tier, through cache overflow and the TBE's regrowth. Then
the facts the refusals rest on, checked on the installed FBGEMM: which optimizers its CPU TBE
trains, where its CPU kernels apply weight decay, which settings they never read.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from fbgemm_gpu.tbe.config.optimizer_config import UserEnabledConfigDefinition

import torchrec_mtrains.kernels.slots as slots_module
from tests.support.tiered_helpers import (
    Model,
    Workload,
    initial_weights,
    make_kernel,
    make_steps,
    single_intra_op_thread,  # noqa: F401  (autouse fixture)
)
from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredConfig
from torchrec_mtrains.kernels.tbe_settings import ADAM_FAMILY, REFUSED_OPTIMIZERS, TbeContext
from torchrec_mtrains.layout import OPTIMIZERS

TIERS = [Tier.DRAM, Tier.SCM, Tier.SSD]
# FBGEMM's CPU TBE trains these itself (the Adam family's update is the kernel's own:
# tests/kernels/test_adam_family.py checks it against FBGEMM's definitions).
OPTIMIZER_TYPES = [EmbOptimType(o) for o in OPTIMIZERS if o not in ADAM_FAMILY]


def _reference(model: Model, settings: Dict[str, Any]) -> SplitTableBatchedEmbeddingBagsCodegen:
    ref = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in model.specs],
        optimizer=model.optimizer, learning_rate=model.learning_rate, eps=model.eps, pooling_mode=model.pooling,
        weights_precision=model.precision, **settings)
    with torch.no_grad():
        for t, w in enumerate(ref.split_embedding_weights()):
            w.copy_(initial_weights(model, t))
    return ref


def _tables(module) -> Tuple[List[torch.Tensor], List[List[torch.Tensor]]]:
    return ([w.detach().clone() for w in module.split_embedding_weights()],
            [[s.detach().clone() for s in table] for table in module.split_optimizer_states()])


def _train_both(tmp_path: Path, model: Model, workload: Workload, tier: Tier, settings: Dict[str, Any],
                **cache) -> None:
    """Trains the reference and a tiered kernel (prefetching one batch ahead) on the same
    batches; every output and the final weights and optimizer state must be equal."""
    steps = make_steps(model.specs, workload)
    ref = _reference(model, settings)
    ker = make_kernel(model, tier, tmp_path, tbe_settings=settings, **cache)
    try:
        ker.prefetch(steps[0].indices, steps[0].offsets)
        for s, step in enumerate(steps):
            if s + 1 < len(steps):
                ker.prefetch(steps[s + 1].indices, steps[s + 1].offsets)
            got = ker(step.indices, step.offsets, step.per_sample_weights)
            want = ref(step.indices, step.offsets, step.per_sample_weights)
            assert got.dtype == want.dtype and torch.equal(got, want), f"output of step {s}"
            got.backward(step.grad.to(got.dtype))
            want.backward(step.grad.to(want.dtype))
        (gw, gs), (rw, rs) = _tables(ker), _tables(ref)
        for t in range(len(model.specs)):
            assert torch.equal(gw[t], rw[t]), f"weights of table {t}"
        assert len(gs) == len(rs)  # no tables of state without any (SGD)
        for t, (got_state, want_state) in enumerate(zip(gs, rs)):
            assert len(got_state) == len(want_state) and all(
                torch.equal(a, b) for a, b in zip(got_state, want_state)), f"optimizer state of table {t}"
    finally:
        ker.close()


# ------------------------------------------------------------------ optimizers ----
@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
@pytest.mark.parametrize("optimizer", OPTIMIZER_TYPES, ids=lambda o: o.name)
def test_each_optimizer_trains_bit_identically(tmp_path: Path, optimizer: EmbOptimType, tier: Tier) -> None:
    model = Model(optimizer=optimizer, learning_rate=0.1)
    _train_both(tmp_path, model, Workload(steps=60, data_seed=11), tier, {}, cache_rows=24, cache_ways=4)


def test_the_cpu_tbe_trains_exactly_the_optimizers_the_kernel_takes_or_refuses_by_design() -> None:
    """Each EmbOptimType on FBGEMM's CPU TBE: those it trains are the tiered kernel's, or
    refused for the tiered design (REFUSED_OPTIMIZERS); of the others it refuses itself, the
    kernel trains only the Adam family (with its own update)."""
    for optimizer in EmbOptimType:
        try:
            tbe = SplitTableBatchedEmbeddingBagsCodegen([(20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                        optimizer=optimizer)
            tbe(torch.tensor([1, 2]), torch.tensor([0, 2])).sum().backward()
            trains = True
        except (AssertionError, RuntimeError, NotImplementedError):
            trains = False
        if trains:
            assert optimizer.value in OPTIMIZERS or optimizer.value in REFUSED_OPTIMIZERS, optimizer
        else:
            assert optimizer.value not in OPTIMIZERS or optimizer.value in ADAM_FAMILY, optimizer
        if optimizer.value not in OPTIMIZERS:
            with pytest.raises(ValueError, match="is not supported on tiered tables"):
                TieredConfig(optimizer=optimizer)


def test_emainplace_rowwise_adagrad_rewrites_rows_outside_the_batch() -> None:
    """Why the tiered kernel refuses it: its EMA pass changes rows no batch looked up."""
    tbe = SplitTableBatchedEmbeddingBagsCodegen([(20, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                optimizer=EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD)
    with torch.no_grad():
        tbe.split_embedding_weights()[0].copy_(torch.linspace(-1, 1, 80).view(20, 4))
    before = tbe.split_embedding_weights()[0].clone()
    for _ in range(10):  # the default EmainplaceModeDefinition: an EMA pass every 10 steps
        tbe(torch.tensor([1, 2]), torch.tensor([0, 2])).sum().backward()
    assert not torch.equal(tbe.split_embedding_weights()[0][5:], before[5:])


# ----------------------------------------------------------- passed TBE settings ----
SETTINGS = {
    "gradient_clipping": (Model(optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.1),
                          {"gradient_clipping": True, "max_gradient": 0.05}),
    "clipping_sgd": (Model(optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1),
                     {"gradient_clipping": True, "max_gradient": 0.05}),
    "l2_fp16": (Model(precision=SparseType.FP16, learning_rate=0.1),
                {"weight_decay": 0.5, "weight_decay_mode": WeightDecayMode.L2}),
    "decouple_sequences": (Model(specs=((1500, 8), (600, 8)), pooling=PoolingMode.NONE, learning_rate=0.1),
                           {"weight_decay": 0.5, "weight_decay_mode": WeightDecayMode.DECOUPLE}),
    "l2_fp16_output": (Model(learning_rate=0.1), {"weight_decay": 0.5, "weight_decay_mode": WeightDecayMode.L2,
                                                  "output_dtype": SparseType.FP16}),
    "fp16_output": (Model(optimizer=EmbOptimType.EXACT_SGD, learning_rate=0.1), {"output_dtype": SparseType.FP16}),
    "no_stochastic_rounding": (Model(precision=SparseType.FP16, learning_rate=0.1), {"stochastic_rounding": False}),
    "int32_indices": (Model(), {"embedding_table_index_type": torch.int32, "embedding_table_offset_type": torch.int32,
                                "bounds_check_mode": BoundsCheckMode.FATAL}),
}


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: t.name)
@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_a_tbe_setting_trains_bit_identically(tmp_path: Path, case: str, tier: Tier) -> None:
    model, settings = SETTINGS[case]
    workload = Workload(steps=40, data_seed=12, per_sample_weights=case == "gradient_clipping",
                        sequence=model.pooling == PoolingMode.NONE)
    _train_both(tmp_path, model, workload, tier, settings, cache_rows=16, cache_ways=4)


def test_settings_survive_the_tbe_regrowing(tmp_path: Path, monkeypatch) -> None:
    """One cache slot: the overflow pool outgrows the TBE, which is rebuilt larger with the
    same settings."""
    built: List[Dict[str, Any]] = []
    real = slots_module.SplitTableBatchedEmbeddingBagsCodegen

    def spy(*args, **kwargs):
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(slots_module, "SplitTableBatchedEmbeddingBagsCodegen", spy)
    model, settings = SETTINGS["gradient_clipping"]
    _train_both(tmp_path, model, Workload(steps=30, data_seed=13), Tier.SSD, settings, cache_rows=1)
    assert len(built) > 1 and all(b["gradient_clipping"] and b["max_gradient"] == 0.05 for b in built)


# --------------------------------------------------------------- refusals ----
@pytest.mark.parametrize("config,match", [
    (dict(tbe_settings={"weight_decay": 0.1}), r"weight_decay=0.1 .*no effect with weight_decay_mode NONE"),
    (dict(tbe_settings={"weight_decay": 0.1, "weight_decay_mode": WeightDecayMode.NONE}), r"weight_decay=0.1"),
    (dict(tbe_settings={"weight_decay": 0.1, "weight_decay_mode": WeightDecayMode.L2}),
     r"weight_decay_mode=.*L2.* does not apply it to these tables"),
    (dict(optimizer=EmbOptimType.EXACT_SGD, weights_precision=SparseType.FP16,
          tbe_settings={"weight_decay": 0.1, "weight_decay_mode": WeightDecayMode.DECOUPLE}), r"EXACT_SGD, FP16"),
    (dict(tbe_settings={"weight_decay_mode": WeightDecayMode.COUNTER}), r"COUNTER.*row layout does not carry"),
    (dict(tbe_settings={"weight_decay_mode": WeightDecayMode.COWCLIP}), r"COWCLIP.*row layout does not carry"),
    (dict(tbe_settings={"weight_decay_mode": WeightDecayMode.DECOUPLE_GLOBAL}), r"DECOUPLE_GLOBAL.*no kernel"),
    (dict(tbe_settings={"max_gradient": 0.5}), r"max_gradient=0.5 .*without gradient_clipping"),
    (dict(tbe_settings={"gradient_clipping": 1}), r"gradient_clipping=1 must be a bool"),
    (dict(weights_precision=SparseType.FP16, tbe_settings={"stochastic_rounding": True}),
     r"stochastic_rounding=True .*round fp16 weight updates to nearest"),
    (dict(tbe_settings={"output_dtype": SparseType.BF16}), r"output_dtype=.*no bf16 output"),
    (dict(tbe_settings={"output_dtype": SparseType.INT8}), r"output_dtype=.*CUDA only"),
    (dict(tbe_settings={"embedding_table_index_type": torch.int16}), r"embedding_table_index_type"),
    (dict(tbe_settings={"optimizer": EmbOptimType.EXACT_SGD}), r"optimizer is not a TBE setting.*TieredConfig"),
    (dict(tbe_settings={"not_a_keyword": 1}), r"'not_a_keyword' is not a keyword"),
    (dict(tbe_settings=[("max_norm", 1.0), ("max_norm", 2.0)]), r"gives a keyword twice"),
    (dict(tbe_settings={"cache_precision": SparseType.FP16}), r"cache_precision=.*table's precision"),
])
def test_settings_the_cpu_tbe_would_not_act_on_are_refused(config, match) -> None:
    with pytest.raises(ValueError, match=match):
        TieredConfig(**config)


def test_values_asking_for_nothing_are_accepted_and_not_passed() -> None:
    config = TieredConfig(weights_precision=SparseType.FP16, tbe_settings={
        "enforce_hbm": False, "cache_precision": SparseType.FP16, "bounds_check_mode": BoundsCheckMode.FATAL,
        "max_norm": 0.0, "momentum": 0.9, "gradient_clipping": True, "weight_decay_mode": 2, "weight_decay": 0.0})
    assert config.tbe_settings == (("gradient_clipping", True), ("weight_decay", 0.0),
                                   ("weight_decay_mode", WeightDecayMode.DECOUPLE))
    assert hash(config)  # frozen and hashable, settings included


# ------------------------------------------- the facts the refusals rest on ----
def _fbgemm_weights(tables: int, shared: bool, **kwargs) -> torch.Tensor:
    """FBGEMM's CPU TBE after three steps on two features (one table both look up when
    ``shared``), from fixed weights."""
    ftm = [0, 0] if shared else [0, 1]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(50, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables, feature_table_map=ftm, learning_rate=0.1,
        **kwargs)
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            w.copy_(torch.linspace(-1, 1, 400).view(50, 8))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        out = tbe(torch.tensor([1, 2, 3, 1, 4, 5, 1, 7]), torch.tensor([0, 2, 4, 6, 8]))
        out.backward(torch.randn(out.shape, generator=g).to(out.dtype))
    return torch.cat([w.float().flatten() for w in tbe.split_embedding_weights()])


_WEIGHT_DECAY_CASES = list(itertools.product(OPTIMIZER_TYPES, [SparseType.FP32, SparseType.FP16],
                                             [SparseType.FP32, SparseType.FP16], [PoolingMode.SUM, PoolingMode.NONE],
                                             [False, True]))


@pytest.mark.parametrize("mode", [WeightDecayMode.L2, WeightDecayMode.DECOUPLE], ids=lambda m: m.name)
def test_weight_decay_is_honoured_exactly_where_fbgemms_cpu_kernels_apply_it(mode: WeightDecayMode) -> None:
    for optimizer, precision, output, pooling, shared in _WEIGHT_DECAY_CASES:
        tables = 1 if shared else 2
        common = dict(optimizer=optimizer, weights_precision=precision, output_dtype=output, pooling_mode=pooling)
        applied = not torch.equal(_fbgemm_weights(tables, shared, **common),
                                  _fbgemm_weights(tables, shared, weight_decay=0.5, weight_decay_mode=mode, **common))
        context = TbeContext(optimizer, precision, pooling, (shared,) * tables)
        assert context.weight_decay_applied(output) == applied, (optimizer, precision, output, pooling, shared)


def test_settings_refused_as_unread_change_nothing_on_fbgemms_cpu_tbe() -> None:
    for optimizer in OPTIMIZER_TYPES:
        base = _fbgemm_weights(2, False, optimizer=optimizer)
        assert torch.equal(base, _fbgemm_weights(2, False, optimizer=optimizer, max_norm=0.1))
        assert torch.equal(base, _fbgemm_weights(2, False, optimizer=optimizer, momentum=0.1, eta=0.5, beta1=0.1,
                                                 beta2=0.1))
        fp16 = dict(optimizer=optimizer, weights_precision=SparseType.FP16)
        assert torch.equal(_fbgemm_weights(2, False, stochastic_rounding=True, **fp16),
                           _fbgemm_weights(2, False, stochastic_rounding=False, **fp16))


def test_settings_refused_as_failing_do_fail_on_fbgemms_cpu_tbe() -> None:
    with pytest.raises(NotImplementedError):
        _fbgemm_weights(2, False, output_dtype=SparseType.BF16)
    with pytest.raises(RuntimeError):
        _fbgemm_weights(2, False, extra_optimizer_config=UserEnabledConfigDefinition(use_writeback_bwd_prehook=True))
    with pytest.raises(RuntimeError):  # DECOUPLE_GLOBAL: no CPU kernel
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import GlobalWeightDecayDefinition

        _fbgemm_weights(2, False, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, weight_decay=0.1,
                        weight_decay_mode=WeightDecayMode.DECOUPLE_GLOBAL,
                        global_weight_decay=GlobalWeightDecayDefinition())
