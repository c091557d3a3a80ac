"""TorchRec's ``fused_params`` on tiered tables: each key honoured or refused, FBGEMM's defaults
where they are silent.

A tiered table's group of shards gets the ``fused_params`` a FUSED table in the same model
gets (the sharder's, a table's ``apply_optimizer_in_backward`` optimizer, TorchRec's keys from
its plan entry) plus this package's ``mtrains_*`` keys. ``kernel_settings`` turns them into
the tiered kernel's settings so that a tiered table trains as the FUSED one would:

- the optimizer, learning rate and eps become the kernel's own (``TieredConfig``), each at
  ``SplitTableBatchedEmbeddingBagsCodegen``'s default when not given (EXACT_SGD, as FBGEMM);
- every other FBGEMM TBE keyword goes to the kernel's TBE settings, where
  ``kernels/tbe_settings.py`` passes it on to FBGEMM's TBE or refuses it with the reason;
- ``torch.optim.Adam``'s ``betas`` (which ``apply_optimizer_in_backward`` hands on as a
  fused_params key, and FBGEMM's TBE has no keyword for) becomes FBGEMM's ``beta1`` and
  ``beta2``; its other keywords are accepted at their defaults, which ask for nothing;
- FBGEMM keywords TorchRec sets from the tables themselves, TorchRec's keys for other
  kernels, a KeyValueParams field, and any key no one reads are refused, naming the key.

docs/sharding.md lists every key's fate.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, FrozenSet, Mapping

from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec.distributed.batched_embedding_kernel import RES_ENABLED_TABLES_STR, RES_STORE_SHARDS_STR
from torchrec.distributed.embedding_sharding import USE_ONE_TBE_PER_TABLE
from torchrec.distributed.fused_params import (
    FUSED_PARAM_BOUNDS_CHECK_MODE,
    FUSED_PARAM_IS_SSD_TABLE,
    FUSED_PARAM_LENGTHS_TO_OFFSETS_LOOKUP,
    FUSED_PARAM_QUANT_STATE_DICT_SPLIT_SCALE_BIAS,
    FUSED_PARAM_REGISTER_TBE_BOOL,
    FUSED_PARAM_SSD_TABLE_LIST,
    FUSED_PARAM_TBE_ROW_ALIGNMENT,
)
from torchrec.distributed.types import KeyValueParams

from torchrec_mtrains.kernels.tbe_settings import PASSED, REFUSED, TBE_DEFAULTS, tbe_keywords
from torchrec_mtrains.sharding.key_value import CACHE_ALGORITHMS
from torchrec_mtrains.sharding.types import CACHE_LOAD_FACTOR, FUSED_PARAM_KEYS, SEED_KEY, TABLE_TIERS_KEY

__all__ = ["HONOURED_TBE_KEYWORDS", "REFUSED_TBE_KEYWORDS", "kernel_settings"]

# fused_params keys -> the kernel setting they give (TorchRec's "lr" is its learning_rate).
_KERNEL_SETTINGS: Mapping[str, str] = {"optimizer": "optimizer", "learning_rate": "learning_rate", "eps": "eps"}
# FBGEMM keywords TorchRec fills from the tables (as it does for a FUSED table, where a
# second value in fused_params collides with its own).
_FROM_TABLES: Mapping[str, str] = {
    "embedding_specs": "the tables' shards",
    "feature_table_map": "the tables' features",
    "pooling_mode": "the tables' pooling",
    "weights_precision": "the tables' data_type",
    "table_names": "the tables' names",
    "device": "the sharder's device",
}
# FBGEMM keywords whose job the tiered kernel does itself, accepted at any value.
_DONE_BY_THE_KERNEL: Mapping[str, str] = {
    CACHE_LOAD_FACTOR: "each table's row-cache size (TorchRec keeps it per table)",
    "prefetch_pipeline": ("TorchRec's prefetch flag: the row cache keeps every prefetched batch's rows until its "
                          "step, as FBGEMM's prefetch_pipeline=True asks of its cache"),
}
# torch.optim.Adam's keywords with no FBGEMM counterpart, at the values that ask for
# nothing (apply_optimizer_in_backward(torch.optim.Adam, ...) hands them on as given).
_TORCH_ADAM_DEFAULTS: Mapping[str, Any] = {"amsgrad": False, "maximize": False, "foreach": None,
                                           "capturable": False, "differentiable": False, "fused": None}
# TorchRec's keys (not FBGEMM keywords) for its table grouping, which it consumes itself.
_TORCHREC_GROUPING: FrozenSet[str] = frozenset({USE_ONE_TBE_PER_TABLE, "_batch_key", FUSED_PARAM_SSD_TABLE_LIST})
# TorchRec's keys for other kernels.
_INFERENCE = "a setting of TorchRec's quantised inference TBE; these tables train"
_TORCHREC_REFUSED: Mapping[str, str] = {
    FUSED_PARAM_REGISTER_TBE_BOOL: _INFERENCE,
    FUSED_PARAM_QUANT_STATE_DICT_SPLIT_SCALE_BIAS: _INFERENCE,
    FUSED_PARAM_TBE_ROW_ALIGNMENT: _INFERENCE,
    FUSED_PARAM_BOUNDS_CHECK_MODE: _INFERENCE,
    FUSED_PARAM_LENGTHS_TO_OFFSETS_LOOKUP: _INFERENCE,
    FUSED_PARAM_IS_SSD_TABLE: _INFERENCE,
    RES_STORE_SHARDS_STR: "raw embedding streaming uses FBGEMM's GPU caches",
    RES_ENABLED_TABLES_STR: "raw embedding streaming uses FBGEMM's GPU caches",
    "embedding_cache_mode": "a setting of TorchRec's zero-collision key-value TBE",
}
_OURS: FrozenSet[str] = frozenset(FUSED_PARAM_KEYS) | {TABLE_TIERS_KEY, SEED_KEY}
_KEY_VALUE_FIELDS: FrozenSet[str] = frozenset(f.name for f in dataclasses.fields(KeyValueParams))
# Keys taken above or by TorchRec itself, with nothing more to check here.
_ACCEPTED: FrozenSet[str] = (frozenset(_KERNEL_SETTINGS) | _OURS | _TORCHREC_GROUPING | frozenset(_DONE_BY_THE_KERNEL)
                             | {"lr"})

HONOURED_TBE_KEYWORDS: FrozenSet[str] = frozenset(_KERNEL_SETTINGS) | frozenset(_DONE_BY_THE_KERNEL) | frozenset(PASSED)
"""FBGEMM TBE keywords a tiered table honours given in ``fused_params``: the kernel's own
settings, the row cache's, and those passed to the kernel's TBE (at the values FBGEMM's CPU
TBE acts on)."""
REFUSED_TBE_KEYWORDS: FrozenSet[str] = frozenset(REFUSED) | frozenset(_FROM_TABLES) | {"cache_algorithm"}
"""FBGEMM TBE keywords refused in ``fused_params`` (except at a value asking for nothing;
``cache_algorithm`` is accepted when it names the table's row-cache policy)."""


def _refused(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"fused_params[{key!r}]={value!r} is not supported on tiered tables: {why}")


def _learning_rate(fused_params: Mapping[str, Any]) -> Any:
    if "lr" in fused_params and "learning_rate" in fused_params and fused_params["lr"] != fused_params["learning_rate"]:
        raise ValueError(f"fused_params gives lr={fused_params['lr']!r} and learning_rate="
                         f"{fused_params['learning_rate']!r}: give one")
    return fused_params.get("learning_rate", fused_params.get("lr", TBE_DEFAULTS["learning_rate"]))


def _betas(fused_params: Mapping[str, Any]) -> Dict[str, float]:
    """FBGEMM's beta1 and beta2 from torch.optim.Adam's ``betas`` (a pair), checked against
    beta1 / beta2 given beside it."""
    value = fused_params["betas"]
    if (not isinstance(value, (tuple, list)) or len(value) != 2
            or any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in value)):
        raise ValueError(f"fused_params['betas']={value!r} must be a pair of numbers (beta1, beta2)")
    out = {"beta1": float(value[0]), "beta2": float(value[1])}
    for key, beta in out.items():
        if key in fused_params and fused_params[key] != beta:
            raise ValueError(f"fused_params gives betas={value!r} and {key}={fused_params[key]!r}: give one")
    return out


def _check_torch_adam_keyword(key: str, value: Any) -> None:
    default = _TORCH_ADAM_DEFAULTS[key]
    if value is not default and value != default:
        raise _refused(key, value, f"a keyword of torch.optim.Adam that FBGEMM's Adam has no counterpart for; "
                                   f"only {default!r} (torch's default) is accepted")


def _check_cache_algorithm(value: Any, policy: str) -> None:
    if not isinstance(value, CacheAlgorithm) or CACHE_ALGORITHMS.get(value) != policy:
        raise _refused("cache_algorithm", value, f"the tables' row cache runs policy {policy!r} (their "
                       "TieredParams.cache_algorithm, or a key_value table's CacheParams.algorithm); set it there")


def kernel_settings(fused_params: Mapping[str, Any], cache_algorithm: str) -> Dict[str, Any]:
    """The tiered kernel's settings from a group's ``fused_params``: ``optimizer``,
    ``learning_rate``, ``eps`` (FBGEMM's defaults when absent), ``seed`` when given, and
    ``tbe_settings`` (the FBGEMM keywords the kernel's config then checks).

    Args:
        fused_params: the group's fused_params, as TorchRec hands them to the kernel.
        cache_algorithm: the tables' row-cache policy ("lru", "lfu", "tinylfu").

    Raises:
        ValueError: naming a refused key and why (see the module docstring).
    """
    keywords = set(tbe_keywords())
    settings: Dict[str, Any] = {name: fused_params.get(key, TBE_DEFAULTS[key])
                                for key, name in _KERNEL_SETTINGS.items()}
    settings["learning_rate"] = _learning_rate(fused_params)
    tbe: Dict[str, Any] = {}
    for key, value in fused_params.items():
        if key in _ACCEPTED:
            continue
        if key == "betas":
            tbe.update(_betas(fused_params))
            continue
        if key in _TORCH_ADAM_DEFAULTS:
            _check_torch_adam_keyword(key, value)
            continue
        if key in _FROM_TABLES:
            raise _refused(key, value, f"TorchRec sets it from {_FROM_TABLES[key]}")
        if key == "cache_algorithm":
            _check_cache_algorithm(value, cache_algorithm)
        elif key in keywords:
            tbe[key] = value  # passed on or refused by the kernel's config (kernels/tbe_settings.py)
        elif key in _TORCHREC_REFUSED:
            raise _refused(key, value, _TORCHREC_REFUSED[key])
        elif key in _KEY_VALUE_FIELDS:
            raise _refused(key, value, "a KeyValueParams field: give it in the table's plan entry "
                                       "(ParameterConstraints / ParameterSharding key_value_params)")
        else:
            raise _refused(key, value, "no such setting of FBGEMM's TBE, TorchRec's sharders or the tiered kernel")
    if SEED_KEY in fused_params:
        settings["seed"] = int(fused_params[SEED_KEY])
    settings["tbe_settings"] = tbe
    return settings

