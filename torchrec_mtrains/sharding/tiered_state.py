"""The state of tiered tables in a sharded TorchRec collection (bags or sequences).

TorchRec leaves the state of CUSTOMIZED_KERNEL tables to the subclass: ``TieredTablesState``
registers an empty placeholder ``weight`` for each tiered table on every rank (TorchRec
expects one), adds their ShardedTensors to ``state_dict()`` (rows streamed from the tiers)
and writes them back on ``load_state_dict()``. The collection's tables live in its
``TABLES_ATTR`` module dict: ``embedding_bags`` (EmbeddingBagCollection) or ``embeddings``
(EmbeddingCollection).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Dict, List, Mapping, Tuple

from torchrec.distributed.embedding_sharding import EmbeddingShardingInfo

import torch
from torch import nn
from torch.distributed._shard.sharded_tensor import TensorProperties
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.modules.embedding_configs import data_type_to_dtype
from torchrec.optim.fused import EmptyFusedOptimizer

from torchrec_mtrains.sharding.checkpoint import LocalShard, load_weights, weights_sharded_tensor
from torchrec_mtrains.sharding.kernel import TieredBatchedEmbeddingBag, draw_uniform, draws_as_fused, shard_offsets
from torchrec_mtrains.sharding.types import (
    CACHE_LOAD_FACTOR,
    FUSED_PARAM_KEYS,
    TieredParameterSharding,
    per_table_fused_params,
)

__all__ = ["TieredTablesState", "join_tier_params", "tiered_sharding_class"]

_CUSTOM = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value


def join_tier_params(sharding_infos: List[EmbeddingShardingInfo]) -> List[EmbeddingShardingInfo]:
    """The tiered tables among ``sharding_infos`` (one sharding type's), each with its tier
    settings joined to its fused_params."""
    tiered = [i for i in sharding_infos if i.param_sharding.compute_kernel == _CUSTOM]
    params = {
        info.embedding_config.name: info.param_sharding.tiered
        for info in tiered
        if isinstance(info.param_sharding, TieredParameterSharding) and info.param_sharding.tiered is not None
    }
    shared = per_table_fused_params(params)
    for info in tiered:
        p = params.get(info.embedding_config.name)
        if p is not None:
            # Tier settings join fused_params, so TorchRec groups tables by them, except
            # the per-table ones: the cache size goes under TorchRec's own
            # "cache_load_factor", which its grouping ignores, and the tier and rows
            # written into one map all tables share, so a rank's tables of every tier
            # and cache size that agree on the rest share one kernel.
            given = dict(info.fused_params or {})
            fused = {**given, **p.to_fused_params(), **shared}
            if p.cache_rows is not None or p.cache_load_factor is not None or given.get(CACHE_LOAD_FACTOR) is None:
                # The plan entry's cache size wins over the sharder's, as in TorchRec.
                fused[CACHE_LOAD_FACTOR] = p.load_factor(info.embedding_config.num_embeddings)
            else:
                _check_load_factor(info.embedding_config.name, given[CACHE_LOAD_FACTOR])
            fused[FUSED_PARAM_KEYS[1]] = fused[FUSED_PARAM_KEYS[2]] = None
            info.fused_params = fused
    return tiered


def _check_load_factor(table: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"table {table}: fused_params['cache_load_factor']={value!r} must be a number > 0 "
                         "(the table's row-cache size as a fraction of its rows)")


def tiered_sharding_class(shardings: Mapping[str, type], sharding_type: str,
                          tiered: List[EmbeddingShardingInfo]) -> type:
    """The sharding class of ``sharding_type`` among ``shardings`` (the tiered ones of a
    collection's kind); ValueError naming the ``tiered`` tables if there is none."""
    sharding_cls = shardings.get(sharding_type)
    if sharding_cls is None:
        names = ", ".join(i.embedding_config.name for i in tiered)
        raise ValueError(f"tables {names}: sharding type {sharding_type!r} is not supported for tiered tables "
                         f"(supported: {sorted(shardings)})")
    return sharding_cls


class _DrawAsFused:
    """A tiered table's ``init_fn`` while TorchRec's ``reset_parameters`` runs: takes from
    torch's global generator what the table's own ``init_fn`` takes from a FUSED table's
    local weight of ``shape`` (TorchRec's default, ``uniform_``, drawn in blocks of rows;
    another on a tensor of that shape), and drops it. The tiered rows keep their seeded
    initial values."""

    def __init__(self, init_fn: Callable[[torch.Tensor], Any], shape: Tuple[int, int], dtype: torch.dtype) -> None:
        self.init_fn, self.shape, self.dtype = init_fn, shape, dtype

    def __call__(self, placeholder: torch.Tensor) -> torch.Tensor:
        fn = self.init_fn
        if (isinstance(fn, functools.partial) and fn.func is torch.nn.init.uniform_ and not fn.args
                and set(fn.keywords) <= {"a", "b"}):
            draw_uniform(*self.shape, self.dtype, fn.keywords.get("a", 0.0), fn.keywords.get("b", 1.0))
        else:
            with torch.no_grad():
                fn(torch.empty(self.shape, dtype=self.dtype))
        return placeholder


class TieredTablesState:
    """Mixed into a TorchRec sharded collection before it; call ``_init_tiered_state()``
    at the end of ``__init__``."""

    TABLES_ATTR = "embedding_bags"
    CONFIGS_ATTR = "_embedding_bag_configs"  # the table configs TorchRec's reset_parameters reads

    def _init_tiered_state(self) -> None:
        # While set, state_dict() holds each tiered table's empty placeholder and
        # load_state_dict() leaves the tiers alone (torchrec_mtrains.checkpoint saves them).
        self.tiered_state_excluded = False
        self._register_state_dict_hook(type(self)._tiered_state_dict_hook)
        self._register_load_state_dict_pre_hook(self._tiered_load_hook, with_module=True)

    def tiered_kernels(self) -> List[TieredBatchedEmbeddingBag]:
        out = []
        for lookup in self._lookups:
            lookup = getattr(lookup, "module", lookup)  # DDP-wrapped (data parallel) lookups
            tiered = getattr(lookup, "tiered_kernels", None)
            if tiered is not None:
                out.extend(tiered())
        return out

    def tiered_table_names(self) -> List[str]:
        """The tables of this collection that the plan puts on the tiered kernel."""
        return self._tiered_tables()

    def _tiered_tables(self) -> List[str]:
        return [name for name, ps in self.module_sharding_plan.items() if ps.compute_kernel == _CUSTOM]

    def _tables_dict(self) -> nn.ModuleDict:
        return getattr(self, self.TABLES_ATTR)

    def _local_shards(self) -> Dict[str, List[LocalShard]]:
        out: Dict[str, List[LocalShard]] = {name: [] for name in self._tiered_tables()}
        for kernel in self.tiered_kernels():
            for t, table in kernel.shards():
                out[table.name].append((kernel, t, shard_offsets(table)))
        return out

    def reset_parameters(self) -> None:
        # TorchRec initialises every table's ``weight`` here, in the tables' order, with its
        # init_fn; a tiered table has only an empty placeholder (its rows live on the tier,
        # initialised there), but takes the numbers a FUSED table's init_fn would take, in
        # its place: torch's generator then gives the tables after it, and the dense layers
        # after sharding, what it gives them when every table is FUSED.
        self._register_placeholders()
        shapes = self._fused_weight_shapes()
        configs = getattr(self, self.CONFIGS_ATTR)
        setattr(self, self.CONFIGS_ATTR, [
            dataclasses.replace(c, init_fn=_DrawAsFused(c.init_fn, shapes[c.name], data_type_to_dtype(c.data_type)))
            if c.name in shapes else c for c in configs])
        try:
            super().reset_parameters()
        finally:
            setattr(self, self.CONFIGS_ATTR, configs)

    def _fused_weight_shapes(self) -> Dict[str, Tuple[int, int]]:
        """Per tiered table that draws as FUSED (``draws_as_fused``) and has a shard on this
        rank: the shape of the ``weight`` TorchRec would give it as a FUSED table, its last
        local shard (TorchRec registers each shard's slice as ``weight`` in turn)."""
        shapes: Dict[str, Tuple[int, int]] = {}
        for kernel in self.tiered_kernels():
            for _, table in kernel.shards():
                if draws_as_fused(table):
                    shapes[table.name] = (table.local_rows, table.local_cols)
        return shapes

    def _register_placeholders(self) -> None:
        """An empty ``weight`` for each tiered table (its rows live on the tier)."""
        for name in self._tiered_tables():
            holder = self._tables_dict()[name]
            if "weight" not in holder._parameters:
                weight = nn.Parameter(torch.empty(0), requires_grad=False)
                weight._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
                holder.register_parameter("weight", weight)

    @staticmethod
    def _tiered_state_dict_hook(module: "TieredTablesState", destination: Dict[str, Any], prefix: str,
                                _meta: Any) -> None:
        if module.tiered_state_excluded:
            return  # a differential checkpoint saves the tiered rows itself
        local = module._local_shards()
        for name in module._tiered_tables():
            config = module._table_name_to_config[name]
            metadata = module.module_sharding_plan[name].sharding_spec.build_metadata(
                tensor_sizes=torch.Size([config.num_embeddings, config.embedding_dim]),
                tensor_properties=TensorProperties(dtype=data_type_to_dtype(config.data_type)),
            )
            destination[f"{prefix}{module.TABLES_ATTR}.{name}.weight"] = weights_sharded_tensor(
                metadata, local[name], module._env.process_group
            )

    @staticmethod
    def _tiered_load_hook(module: "TieredTablesState", state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        local = module._local_shards()
        for name in module._tiered_tables():
            key = f"{prefix}{module.TABLES_ATTR}.{name}.weight"
            if key not in state_dict:
                continue  # reported as a missing key by load_state_dict
            if not module.tiered_state_excluded:
                load_weights(name, state_dict[key], local[name])
            state_dict[key] = module._tables_dict()[name].weight  # the placeholder loads as is
