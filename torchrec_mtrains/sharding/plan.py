"""tiered_sharding_plan: a hand-made plan for an EmbeddingBagCollection or an
EmbeddingCollection with some tables on tiers."""

from __future__ import annotations

import dataclasses
from typing import List, Mapping, Optional

from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding

from torchrec.modules.embedding_modules import EmbeddingCollection

from torchrec_mtrains.sharding.sharder import TieredEmbeddingBagCollectionSharder, TieredEmbeddingCollectionSharder
from torchrec_mtrains.sharding.types import TieredParameterSharding, TieredParams

__all__ = ["tiered_sharding_plan"]

_SHARDING_TYPES = ("table_wise", "row_wise", "column_wise")


def _column_ranks(dim: int, world_size: int) -> List[int]:
    """The most ranks (<= world_size) that split ``dim`` into equal multiples of 4."""
    for n in range(world_size, 0, -1):
        if dim % n == 0 and (dim // n) % 4 == 0:
            return list(range(n))
    return [0]


def tiered_sharding_plan(
    module: nn.Module,
    tables: Mapping[str, Optional[TieredParams]],
    world_size: int,
    sharding_type: str = "table_wise",
    device_type: str = "cpu",
) -> EmbeddingModuleShardingPlan:
    """The plan of an EmbeddingBagCollection or an EmbeddingCollection (``module``), as
    TorchRec's ``construct_module_sharding_plan``
    builds it: tables in ``tables`` mapped to TieredParams run on their tier behind a row
    cache (the tiered kernel), those mapped to None (and any not named) are plain FUSED.
    Table-wise plans spread tables over ranks, largest first onto the least loaded rank.
    """
    if sharding_type not in _SHARDING_TYPES:
        raise ValueError(f"sharding_type={sharding_type!r} must be one of {_SHARDING_TYPES}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be a positive int")
    sequences = isinstance(module, EmbeddingCollection)
    configs = {c.name: c for c in (module.embedding_configs() if sequences else module.embedding_bag_configs())}
    unknown = sorted(set(tables) - set(configs))
    if unknown:
        raise ValueError(f"tables {unknown} are not tables of the module (it has {sorted(configs)})")
    for name, params in tables.items():
        if params is not None and not isinstance(params, TieredParams):
            raise ValueError(f"tables[{name!r}] must be TieredParams or None, got {type(params).__name__}")

    load = [0] * world_size
    generators = {}
    for name in sorted(configs, key=lambda n: -configs[n].num_embeddings * configs[n].embedding_dim):
        config = configs[name]
        kernel = (
            EmbeddingComputeKernel.CUSTOMIZED_KERNEL if tables.get(name) is not None else EmbeddingComputeKernel.FUSED
        ).value
        if sharding_type == "table_wise":
            rank = load.index(min(load))
            load[rank] += config.num_embeddings * config.embedding_dim
            generators[name] = table_wise(rank=rank, compute_kernel=kernel)
        elif sharding_type == "row_wise":
            generators[name] = row_wise(compute_kernel=kernel)
        else:
            generators[name] = column_wise(ranks=_column_ranks(config.embedding_dim, world_size), compute_kernel=kernel)

    plan = construct_module_sharding_plan(
        module,
        generators,
        sharder=TieredEmbeddingCollectionSharder() if sequences else TieredEmbeddingBagCollectionSharder(),
        local_size=world_size,
        world_size=world_size,
        device_type=device_type,
    )
    return EmbeddingModuleShardingPlan(
        {name: _with_tier(ps, tables.get(name)) for name, ps in plan.items()}
    )


def _with_tier(ps: ParameterSharding, params: Optional[TieredParams]) -> ParameterSharding:
    if params is None:
        return ps
    fields = {f.name: getattr(ps, f.name) for f in dataclasses.fields(ParameterSharding)}
    return TieredParameterSharding(**fields, tiered=params)
