"""FBGEMM's TBE keywords: which the kernel passes to its inner TBE, which it refuses, and why.

The kernel's cache slots are the rows of one FBGEMM ``SplitTableBatchedEmbeddingBagsCodegen``
on the CPU (``slots.py``), so every keyword of that constructor has one of three fates, each
found by training FBGEMM's CPU TBE (fbgemm-gpu-cpu 1.8) with and without it:

- ``KERNEL_KEYWORDS``: the kernel sets it itself, from its own setting of the same role
  (``TieredConfig``): the optimizer and its learning rate and eps, the pooling, precision,
  feature map and table names, the TBE's tables (the cache slots), its device (the CPU), and
  FBGEMM's cache settings, whose job the row cache does.
- ``PASSED``: given in ``TieredConfig.tbe_settings``, it reaches the inner TBE as given, so a
  tiered table trains exactly as FBGEMM's TBE does with it -- on the values where FBGEMM's CPU
  kernels act on it (``check_tbe_settings`` refuses the others, naming why).
- ``REFUSED``: accepted only at a value that asks for nothing (FBGEMM's default, or what the
  kernel does anyway); any other value raises ValueError with the reason: a CUDA feature, a
  setting FBGEMM's CPU kernels never read (a FUSED table on the CPU would drop it silently), a
  per-row or whole-table optimizer state the tiered row layout does not carry, or a view of
  the TBE's rows that would be the cache slots rather than the table.

Defaults are FBGEMM's: ``TBE_DEFAULTS`` is read from the installed constructor's signature.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)

__all__ = ["ADAM_FAMILY", "ADAM_TERMS", "KERNEL_KEYWORDS", "PASSED", "REFUSED", "REFUSED_OPTIMIZERS", "TBE_DEFAULTS",
           "TbeContext", "as_settings", "check_optimizer_supported", "check_tbe_settings", "shared_tables",
           "tbe_keywords"]

TbeSettings = Tuple[Tuple[str, Any], ...]


_PARAMETERS = {name: p
               for name, p in inspect.signature(SplitTableBatchedEmbeddingBagsCodegen.__init__).parameters.items()
               if name != "self"}


def tbe_keywords() -> Tuple[str, ...]:
    """Every keyword of the installed ``SplitTableBatchedEmbeddingBagsCodegen.__init__``."""
    return tuple(_PARAMETERS)


TBE_DEFAULTS: Mapping[str, Any] = {
    name: p.default for name, p in _PARAMETERS.items() if p.default is not inspect.Parameter.empty
}
"""The defaults of FBGEMM's TBE constructor, as installed (optimizer EXACT_SGD, learning
rate 0.01, eps 1e-8, ...)."""

# Keyword -> the kernel's setting that plays its role (its TieredConfig field, or what the
# kernel does instead). Given as a TBE setting, each is refused pointing there.
KERNEL_KEYWORDS: Mapping[str, str] = {
    "optimizer": "TieredConfig.optimizer",
    "learning_rate": "TieredConfig.learning_rate",
    "eps": "TieredConfig.eps",
    "pooling_mode": "TieredConfig.pooling_mode",
    "weights_precision": "TieredConfig.weights_precision",
    "feature_table_map": "TieredConfig.feature_table_map",
    "table_names": "TieredConfig.table_names",
    "embedding_specs": "the kernel's tables (its TBE's tables are their cache slots)",
    "device": "the CPU (the kernel's TBE is FBGEMM's CPU TBE)",
    "cache_algorithm": "TieredConfig.cache_algorithm (the row cache's policy)",
    "cache_load_factor": "TieredConfig.cache_load_factor / cache_rows (the row cache's size)",
    "prefetch_pipeline": ("the row cache, which keeps a prefetched batch's rows until its step (what FBGEMM's "
                          "prefetch_pipeline=True asks of its cache); TieredConfig.prefetch_pipeline runs "
                          "the kernel's prefetches on a background thread"),
}

PASSED: Mapping[str, str] = {
    "gradient_clipping": "clamps each gradient element to [-max_gradient, max_gradient]",
    "max_gradient": "the clamp of gradient_clipping",
    "weight_decay": "the decay of weight_decay_mode",
    "weight_decay_mode": "NONE, L2 or DECOUPLE (EXACT_ROWWISE_ADAGRAD where FBGEMM's CPU kernel applies it)",
    "stochastic_rounding": "False, or True on fp32 tables (FBGEMM's CPU kernels round fp16 updates to nearest)",
    "output_dtype": "FP32 or FP16 (the pooled output's dtype, and so the gradient's)",
    "embedding_table_index_type": "torch.int64 or torch.int32 (the TBE casts the slot indices to it)",
    "embedding_table_offset_type": "torch.int64 or torch.int32 (the TBE casts the offsets to it)",
}
"""Keywords passed to the inner TBE as given."""

_CUDA = "a CUDA feature of FBGEMM's TBE: the CPU TBE has no GPU memory to use"
_CPU_IGNORES = "FBGEMM's CPU kernels never read it (a FUSED table on the CPU would train without it)"
_NOT_ON_CPU = ("read only by LARS_SGD, which the tiered kernel does not train; EXACT_SGD, EXACT_ADAGRAD, "
               "EXACT_ROWWISE_ADAGRAD and the Adam family have no such term")
_ADAM_ONLY = ("read only by ADAM, PARTIAL_ROWWISE_ADAM, LAMB and PARTIAL_ROWWISE_LAMB; EXACT_SGD, EXACT_ADAGRAD and "
              "EXACT_ROWWISE_ADAGRAD have no such term")

ADAM_FAMILY: Tuple[str, ...] = ("adam", "partial_row_wise_adam", "lamb", "partial_row_wise_lamb")
"""The optimizers (EmbOptimType values) whose update the tiered kernel does itself
(``adam_family.py``): FBGEMM's CPU TBE does not train them."""
ADAM_TERMS: Tuple[str, ...] = ("beta1", "beta2", "weight_decay", "weight_decay_mode", "gradient_clipping",
                               "max_gradient")
"""Keywords that the Adam family's update applies itself (never passed to the kernel's TBE)."""
_SLOTS = "it would see the cache slots (the kernel's TBE rows and the indices remapped to them), not the tables"


@dataclasses.dataclass(frozen=True)
class TbeContext:
    """The kernel's settings a TBE setting is checked against."""

    optimizer: EmbOptimType
    weights_precision: SparseType
    pooling_mode: PoolingMode
    shared_tables: Tuple[bool, ...]  # per table: whether several features look it up

    @property
    def adam_family(self) -> bool:
        """Whether the kernel's own update trains these tables (``ADAM_FAMILY``)."""
        return self.optimizer.value in ADAM_FAMILY

    def weight_decay_applied(self, output_dtype: SparseType) -> bool:
        """Whether FBGEMM's CPU kernels apply L2 / decoupled weight decay to every table.

        Only EXACT_ROWWISE_ADAGRAD's CPU update reads weight decay, and its fast path --
        fp32 weights and gradients (FP32 output), pooled, a table one feature looks up --
        calls fbgemm's row-wise SparseAdaGrad with weight_decay=0. EXACT_SGD and
        EXACT_ADAGRAD have none on the CPU. The Adam family's update applies it."""
        if self.adam_family:
            return True
        if self.optimizer != EmbOptimType.EXACT_ROWWISE_ADAGRAD:
            return False
        fast_path = (self.weights_precision == SparseType.FP32 and output_dtype == SparseType.FP32
                     and self.pooling_mode != PoolingMode.NONE)
        return not fast_path or all(self.shared_tables)


@dataclasses.dataclass(frozen=True)
class _Refusal:
    """Why a keyword is refused, and the values accepted (asking for nothing): FBGEMM's
    default unless ``accepts`` says otherwise."""

    why: str
    accepts: Optional[Callable[[Any, TbeContext], bool]] = None


REFUSED: Mapping[str, _Refusal] = {
    "cache_sets": _Refusal("the row cache's sets follow from its size and TieredConfig.cache_ways"),
    "cache_reserved_memory": _Refusal(f"it reserves GPU memory for FBGEMM's cache: {_CUDA}"),
    "cache_precision": _Refusal("the row cache holds rows in the table's precision (TieredConfig.weights_precision)",
                                lambda v, c: v is None or v == c.weights_precision),
    "enforce_hbm": _Refusal(f"it keeps tables in HBM: {_CUDA}"),
    "record_cache_metrics": _Refusal("it counts FBGEMM's UVM cache, which the kernel's TBE has not; read the "
                                     "row cache's cache_stats()",
                                     lambda v, c: v is None or (not v.record_cache_miss_counter
                                                                and not v.record_tablewise_cache_miss)),
    "gather_uvm_cache_stats": _Refusal("it counts FBGEMM's UVM cache, which the kernel's TBE has not; read the "
                                       "row cache's cache_stats()", lambda v, c: not v),
    "max_norm": _Refusal(_CPU_IGNORES),
    "momentum": _Refusal(_NOT_ON_CPU),
    "eta": _Refusal(_NOT_ON_CPU),
    "beta1": _Refusal(_ADAM_ONLY, lambda v, c: v == TBE_DEFAULTS["beta1"] or c.adam_family),
    "beta2": _Refusal(_ADAM_ONLY, lambda v, c: v == TBE_DEFAULTS["beta2"] or c.adam_family),
    "ensemble_mode": _Refusal("read only by ENSEMBLE_ROWWISE_ADAGRAD, which FBGEMM's CPU TBE does not train"),
    "emainplace_mode": _Refusal("read only by EMAINPLACE_ROWWISE_ADAGRAD, which the tiered kernel refuses "
                                "(its EMA pass rewrites every row of every table)"),
    "counter_based_regularization": _Refusal(
        "weight_decay_mode=COUNTER keeps per-row counters (prev_iter, row_counter) and a table-wide maximum "
        "that the tiered row layout does not carry"),
    "cowclip_regularization": _Refusal(
        "weight_decay_mode=COWCLIP keeps per-row counters (prev_iter, row_counter) that the tiered row layout "
        "does not carry"),
    "global_weight_decay": _Refusal("weight_decay_mode=DECOUPLE_GLOBAL has no kernel in FBGEMM's CPU TBE"),
    "bounds_check_mode": _Refusal(
        "the kernel checks every id as it maps it to its cache slot and raises IndexError for one outside its "
        "table (FBGEMM's FATAL); it cannot skip the check (IGNORE, NONE) nor zero the id (WARNING)",
        lambda v, c: v == BoundsCheckMode.FATAL),
    "uvm_non_rowwise_momentum": _Refusal(f"it puts optimizer state in UVM: {_CUDA}"),
    "use_experimental_tbe": _Refusal(f"it selects FBGEMM's experimental GPU kernels: {_CUDA}"),
    "stats_reporter_config": _Refusal(f"{_SLOTS}; read the row cache's cache_stats()"),
    "optimizer_state_dtypes": _Refusal(
        "the tiered row layout keeps fp32 optimizer state, FBGEMM's default (its other state dtypes apply to "
        "PARTIAL_ROWWISE_ADAM's momenta and ENSEMBLE_ROWWISE_ADAGRAD only, on CUDA)"),
    "multipass_prefetch_config": _Refusal("it splits FBGEMM's GPU cache prefetch in passes; the row cache loads "
                                          "a batch in one pass"),
    "uvm_host_mapped": _Refusal(f"it maps UVM memory: {_CUDA}"),
    "extra_optimizer_config": _Refusal(
        "use_rowwise_bias_correction (ADAM's bias correction by a per-row step counter) needs a counter in every "
        "row that the tiered row layout does not carry, and use_writeback_bwd_prehook fails in FBGEMM's CPU TBE"),
    "tbe_input_multiplexer_config": _Refusal(_SLOTS),
    "embedding_shard_info": _Refusal("it describes the TBE's rows as the tables' shards, and the kernel's TBE rows "
                                     "are cache slots"),
    "enable_raw_embedding_streaming": _Refusal(f"raw embedding streaming uses FBGEMM's GPU caches: {_CUDA}"),
    "res_params": _Refusal(f"raw embedding streaming uses FBGEMM's GPU caches: {_CUDA}"),
    "is_qr_tbe": _Refusal("it marks FBGEMM's quotient-remainder TBE subclass, not a setting"),
    "preallocated_host_buffers": _Refusal("the kernel allocates its TBE's rows as cache slots and regrows "
                                          "them with the cache"),
}
"""Keywords refused except at a value asking for nothing (see ``_Refusal``)."""

# EmbOptimType values -> why the tiered kernel cannot train them. FBGEMM's CPU TBE trains
# EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD (the tiered kernel's) and
# EMAINPLACE_ROWWISE_ADAGRAD; it refuses the rest in CPU mode.
_NOT_CPU = "FBGEMM's CPU TBE does not train it (\"not supported in CPU mode\")"
REFUSED_OPTIMIZERS: Mapping[str, str] = {
    EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD.value: (
        "its EMA pass rewrites every row of every table each emainplace_mode.step_ema steps, and a tiered table "
        "keeps only its cached rows in FBGEMM's TBE"),
    EmbOptimType.SGD.value: "FBGEMM has deprecated it (use EXACT_SGD)",
    EmbOptimType.ROWWISE_ADAGRAD.value: "FBGEMM has deprecated it (use EXACT_ROWWISE_ADAGRAD)",
    EmbOptimType.NONE.value: "it trains nothing and needs CUDA",
}


def check_optimizer_supported(value: Any, supported: Sequence[str], what: str = "optimizer") -> None:
    """Raises ValueError with the reason when ``value`` names an FBGEMM optimizer the tiered
    kernel does not train (the caller checks the supported ones)."""
    name = getattr(value, "value", value)
    if not isinstance(name, str) or name in supported:
        return
    try:
        EmbOptimType(name)
    except ValueError:
        return  # not an FBGEMM optimizer: the caller's message lists the choices
    why = REFUSED_OPTIMIZERS.get(name, _NOT_CPU)
    raise ValueError(f"{what}={value!r} must be one of {list(supported)} (FBGEMM's EmbOptimType): {name} is not "
                     f"supported on tiered tables: {why}")


def _default_accepted(name: str, value: Any) -> bool:
    default = TBE_DEFAULTS.get(name, inspect.Parameter.empty)
    return value is default or bool(value == default)


def _refuse(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{name}={value!r} is not supported on tiered tables: {why}")


def _check_passed(name: str, value: Any, settings: Mapping[str, Any], ctx: TbeContext) -> None:
    """Raises for a passed keyword's value that FBGEMM's CPU TBE would not act on, or a bad one."""
    if name == "gradient_clipping" and not isinstance(value, bool):
        raise ValueError(f"gradient_clipping={value!r} must be a bool")
    if name in ("max_gradient", "weight_decay"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}={value!r} must be a finite number >= 0")
    if name == "max_gradient" and not settings.get("gradient_clipping", TBE_DEFAULTS["gradient_clipping"]):
        if value != TBE_DEFAULTS["max_gradient"]:
            raise _refuse(name, value, "it has no effect without gradient_clipping=True")
    if name == "stochastic_rounding":
        if not isinstance(value, bool):
            raise ValueError(f"stochastic_rounding={value!r} must be a bool")
        if value and ctx.weights_precision != SparseType.FP32:
            raise _refuse(name, value, "FBGEMM's CPU kernels round fp16 weight updates to nearest whatever it says "
                                       "(a FUSED table on the CPU does too); pass False or leave it unset")
    if name == "output_dtype" and not isinstance(value, SparseType):
        raise ValueError(f"output_dtype={value!r} must be FBGEMM's SparseType.FP32 or SparseType.FP16")
    if name == "output_dtype" and value not in (SparseType.FP32, SparseType.FP16):
        why = ("FBGEMM's CPU forward has no bf16 output" if value == SparseType.BF16
               else "FBGEMM quantises pooled outputs on CUDA only")
        raise _refuse(name, value, f"{why}; use SparseType.FP32 or SparseType.FP16")
    if name in ("embedding_table_index_type", "embedding_table_offset_type") and value not in (torch.int64,
                                                                                              torch.int32):
        raise ValueError(f"{name}={value!r} must be torch.int64 or torch.int32")
    if name == "weight_decay_mode":
        _check_weight_decay(value, settings, ctx)
    if name in ("beta1", "beta2"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{name}={value!r} must be a number in [0, 1)")
    if name == "weight_decay" and value and "weight_decay_mode" not in settings and not ctx.adam_family:
        raise _refuse(name, value, "it has no effect with weight_decay_mode NONE (FBGEMM's default); give "
                                   "weight_decay_mode too")


def _check_weight_decay(value: Any, settings: Mapping[str, Any], ctx: TbeContext) -> None:
    try:
        mode = WeightDecayMode(value)
    except ValueError:
        raise ValueError(f"weight_decay_mode={value!r} must be one of FBGEMM's WeightDecayMode") from None
    decay = settings.get("weight_decay", TBE_DEFAULTS["weight_decay"])
    if ctx.adam_family:
        # FBGEMM's Adam and LAMB read weight_decay alone, as a decoupled term of the update.
        if mode not in (WeightDecayMode.NONE, WeightDecayMode.DECOUPLE):
            raise _refuse("weight_decay_mode", mode, (
                f"{ctx.optimizer.name} applies weight_decay as a decoupled term of its update (FBGEMM's "
                "definition, whatever the mode): give weight_decay_mode NONE or DECOUPLE"))
        return
    if mode == WeightDecayMode.NONE:
        if decay:
            raise _refuse("weight_decay", decay, "it has no effect with weight_decay_mode NONE")
        return
    if mode in (WeightDecayMode.COUNTER, WeightDecayMode.COWCLIP):
        raise _refuse("weight_decay_mode", mode, REFUSED[
            "counter_based_regularization" if mode == WeightDecayMode.COUNTER else "cowclip_regularization"].why)
    if mode == WeightDecayMode.DECOUPLE_GLOBAL:
        raise _refuse("weight_decay_mode", mode, REFUSED["global_weight_decay"].why)
    output = settings.get("output_dtype", TBE_DEFAULTS["output_dtype"])
    if decay and not ctx.weight_decay_applied(output):
        raise _refuse("weight_decay_mode", mode, (
            f"FBGEMM's CPU TBE does not apply it to these tables (optimizer {ctx.optimizer.name}, "
            f"{ctx.weights_precision.name} weights, {SparseType(output).name} output, pooling "
            f"{ctx.pooling_mode.name}): only EXACT_ROWWISE_ADAGRAD's CPU update reads weight decay, and not on "
            "its fp32 fast path (fp32 weights and output, pooled, a table one feature looks up); a FUSED table "
            "on the CPU would train without it"))


def check_tbe_settings(settings: Mapping[str, Any], ctx: TbeContext) -> TbeSettings:
    """The entries of ``settings`` (FBGEMM TBE keyword -> value) to pass to the kernel's TBE,
    sorted by keyword: the ``PASSED`` ones; a ``REFUSED`` one at an accepted value is
    checked and left out (the TBE's default does the same).

    Raises:
        ValueError: naming the keyword and why: a kernel setting given here, a refused value,
            a value FBGEMM's CPU TBE would not act on, or a name that is no keyword of the
            installed TBE.
    """
    keywords = set(tbe_keywords())
    out: List[Tuple[str, Any]] = []
    for name in sorted(settings):
        value = settings[name]
        if name in KERNEL_KEYWORDS:
            raise ValueError(f"{name} is not a TBE setting of a tiered table: its role is {KERNEL_KEYWORDS[name]}")
        if name in REFUSED:
            refusal = REFUSED[name]
            accepted = refusal.accepts(value, ctx) if refusal.accepts is not None else _default_accepted(name, value)
            if not accepted:
                raise _refuse(name, value, refusal.why)
            if name in ADAM_TERMS and ctx.adam_family:
                _check_passed(name, value, settings, ctx)
                out.append((name, value))
            continue
        if name not in PASSED or name not in keywords:
            raise ValueError(f"{name!r} is not a keyword of FBGEMM's SplitTableBatchedEmbeddingBagsCodegen")
        _check_passed(name, value, settings, ctx)
        out.append((name, WeightDecayMode(value) if name == "weight_decay_mode" else value))
    return tuple(out)


def as_settings(value: Any) -> Dict[str, Any]:
    """``TieredConfig.tbe_settings`` as given (a mapping or (keyword, value) pairs) as a dict.

    Raises:
        ValueError: neither, or a keyword given twice.
    """
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    pairs = list(value) if isinstance(value, Iterable) and not isinstance(value, str) else None
    if pairs is None or not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
        raise ValueError(f"tbe_settings={value!r} must be a mapping or (keyword, value) pairs")
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError(f"tbe_settings={value!r} gives a keyword twice")
    return out


def shared_tables(feature_table_map: Optional[Sequence[int]], num_tables: Optional[int] = None) -> Tuple[bool, ...]:
    """Per table, whether several features look it up (FBGEMM's ``is_shared_table``)."""
    if feature_table_map is None:
        return (False,) * (num_tables or 1)
    counts: Dict[int, int] = {}
    for t in feature_table_map:
        counts[t] = counts.get(t, 0) + 1
    return tuple(counts[t] > 1 for t in sorted(counts))

