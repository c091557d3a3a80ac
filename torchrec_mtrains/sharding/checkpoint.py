"""State of tiered tables as TorchRec lays it out: ShardedTensors of weights and of optimizer
state, built from the tiers on demand and written back to them on load.

The layouts are TorchRec's FUSED kernel's (same keys, shapes and shard metadata), so a
checkpoint moves between tiered and in-memory tables and, through
torch.distributed.checkpoint, between world sizes.
"""

from __future__ import annotations

import copy
from typing import Dict, Iterable, List, Tuple

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import (
    Shard,
    ShardedTensor,
    ShardedTensorMetadata,
    TensorProperties,
)

from torchrec_mtrains.kernels.adam_family import is_adam_family
from torchrec_mtrains.sharding.staging import StagingArea
from torchrec_mtrains.sharding.types import TieredShardSource

__all__ = [
    "LocalShard",
    "STATE_KEYS",
    "STEP_KEY",
    "load_optimizer_state",
    "load_weights",
    "optimizer_state_of",
    "rowwise_metadata",
    "state_parts_of",
    "weights_sharded_tensor",
]

# (kernel, kernel table index, shard offsets [row, col])
LocalShard = Tuple[TieredShardSource, int, List[int]]


def _offsets(meta: ShardMetadata) -> Tuple[int, ...]:
    return tuple(meta.shard_offsets)


def _staging(kernel: TieredShardSource) -> StagingArea:
    return StagingArea(kernel.params.state_dict_ram_mb * 2**20, kernel.storage_dir)


def rowwise_metadata(weights: ShardedTensorMetadata) -> Tuple[Dict[Tuple[int, ...], ShardMetadata], ShardedTensorMetadata]:
    """Row-wise optimizer state metadata laid out as TorchRec's EmbeddingFusedOptimizer does:
    one value per row of each shard; column-wise shards each keep their own rows, stacked."""
    shards = weights.shards_metadata
    rows, cols = weights.size[0], weights.size[1]
    column_wise = any(s.shard_sizes[1] != cols for s in shards)
    if column_wise:
        shards = sorted(shards, key=lambda s: s.shard_offsets[1])
    mapping = {}
    for idx, s in enumerate(shards):
        offset = idx * s.shard_sizes[0] if column_wise else s.shard_offsets[0]
        mapping[_offsets(s)] = ShardMetadata(shard_offsets=[offset], shard_sizes=[s.shard_sizes[0]], placement=s.placement)
    size = rows * (len(shards) if column_wise else 1)
    meta = ShardedTensorMetadata(
        shards_metadata=list(mapping.values()),
        size=torch.Size([size]),
        tensor_properties=TensorProperties(dtype=torch.float32, requires_grad=False),
    )
    return mapping, meta


def _pointwise_metadata(weights: ShardedTensorMetadata) -> ShardedTensorMetadata:
    meta = copy.deepcopy(weights)
    meta.tensor_properties = TensorProperties(dtype=torch.float32, requires_grad=False)
    return meta


def _sharded(shards: List[Shard], meta: ShardedTensorMetadata, pg: dist.ProcessGroup) -> ShardedTensor:
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards=shards, sharded_tensor_metadata=meta, process_group=pg
    )


# ------------------------------------------------------------------------- weights ----
def weights_sharded_tensor(
    metadata: ShardedTensorMetadata, local: List[LocalShard], pg: dist.ProcessGroup
) -> ShardedTensor:
    """One table's weights: ``metadata`` (every shard, from the plan) with this rank's
    shards read through the tiers."""
    by_offsets = {_offsets(m): m for m in metadata.shards_metadata}
    shards = []
    for kernel, t, offsets in local:
        tensor = kernel.stage_shard(t, "weight", _staging(kernel))
        shards.append(Shard(tensor, copy.deepcopy(by_offsets[tuple(offsets)])))
    meta = copy.deepcopy(metadata)
    if shards:
        meta.tensor_properties.dtype = shards[0].tensor.dtype
    return _sharded(shards, meta, pg)


def load_weights(table: str, value: object, local: List[LocalShard]) -> None:
    """Writes one table's weights from a state_dict value (a ShardedTensor of the same
    layout, or the whole table as a plain tensor) to this rank's shards."""
    if isinstance(value, ShardedTensor):
        by_offsets = {_offsets(s.metadata): s.tensor for s in value.local_shards()}
        for kernel, t, offsets in local:
            if tuple(offsets) not in by_offsets:
                raise ValueError(
                    f"table {table}: the state_dict has no local shard at offsets {list(offsets)}; "
                    "load it through torch.distributed.checkpoint into this model's own state_dict()"
                )
            kernel.load_shard(t, "weight", by_offsets[tuple(offsets)])
        return
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"table {table}: expected a tensor or ShardedTensor, got {type(value).__name__}")
    for kernel, t, (row, col) in local:
        shard = kernel.shards()[t][1]
        want_rows, want_cols = row + shard.local_rows, col + shard.local_cols
        if value.dim() != 2 or value.shape[0] < want_rows or value.shape[1] < want_cols:
            raise ValueError(
                f"table {table}: weights of shape {tuple(value.shape)} do not cover shard "
                f"rows [{row}, {want_rows}) x cols [{col}, {want_cols})"
            )
        kernel.load_shard(t, "weight", value[row:want_rows, col:want_cols])


# ------------------------------------------------------------------ optimizer state ----
def _shards_by_table(kernel: TieredShardSource) -> Dict[str, List[Tuple[int, object]]]:
    out: Dict[str, List[Tuple[int, object]]] = {}
    for t, table in kernel.shards():
        out.setdefault(table.name, []).append((t, table))
    return out


STATE_KEYS: Tuple[str, ...] = ("momentum1", "exp_avg_sq")
"""The names TorchRec's FUSED kernel gives FBGEMM's parts of a table's optimizer state
(``<table>.<name>``): the first part is always ``momentum1`` (row-wise or per-element
Adagrad's sum of squares, Adam's and LAMB's exp_avg), the second FBGEMM's name of it
(Adam's and LAMB's ``exp_avg_sq``)."""
STEP_KEY = "step"
"""``<table>.step``: the step count of an Adam-family table's bias correction (FBGEMM keeps
it as its TBE's ``iter``), a 0-d int64 tensor, so that a state_dict round trip continues
training exactly."""


def state_parts_of(kernel: TieredShardSource, t: int) -> List[Tuple[str, str, int]]:
    """(state_dict key suffix, the kernel's part name, values per row) of each of FBGEMM's
    parts of kernel table ``t``'s optimizer state; one part is staged as one block ("state")."""
    widths = kernel.emb_module.layouts[t].state_parts
    if len(widths) > len(STATE_KEYS):
        raise ValueError(f"an optimizer state of {len(widths)} parts has no TorchRec names beyond {STATE_KEYS}")
    if len(widths) == 1:
        return [(STATE_KEYS[0], "state", widths[0])]
    return [(STATE_KEYS[k], f"state.{k}", w) for k, w in enumerate(widths)]


def _state_sharded_tensor(kernel: TieredShardSource, shards: List[Tuple[int, object]], part: str,
                          width: int) -> ShardedTensor:
    """One part of a table's optimizer state as TorchRec lays it out: row-wise (one value per
    row) or per element (the weights' shape)."""
    weights_meta = shards[0][1].global_metadata
    if width == 1:
        mapping, meta = rowwise_metadata(weights_meta)
    else:
        meta = _pointwise_metadata(weights_meta)
        mapping = {_offsets(m): m for m in meta.shards_metadata}
    local = [
        Shard(kernel.stage_shard(t, part, _staging(kernel)), copy.deepcopy(mapping[_offsets(table.local_metadata)]))
        for t, table in shards
    ]
    return _sharded(local, meta, kernel.process_group)


def _counts_steps(kernel: TieredShardSource) -> bool:
    """Whether the kernel's optimizer keeps a step count (the Adam family's bias correction)."""
    return is_adam_family(kernel.emb_module.optimizer)


def optimizer_state_of(
    kernel: TieredShardSource, table_of_param: Dict[int, str], params: Iterable[torch.Tensor]
) -> Dict[torch.Tensor, Dict[str, object]]:
    """``{param: {"<table>.momentum1": ShardedTensor, ...}}``: each of FBGEMM's parts of the
    state under TorchRec's name (``STATE_KEYS``), and for the Adam family ``<table>.step``;
    empty dicts for SGD."""
    by_table = _shards_by_table(kernel)
    out: Dict[torch.Tensor, Dict[str, object]] = {}
    for param in params:
        name = table_of_param[id(param)]
        out[param] = {}
        if not kernel.has_optimizer_state():
            continue
        shards = by_table[name]
        for key, part, width in state_parts_of(kernel, shards[0][0]):
            out[param][f"{name}.{key}"] = _state_sharded_tensor(kernel, shards, part, width)
        if _counts_steps(kernel):
            out[param][f"{name}.{STEP_KEY}"] = kernel.stage_step(shards[0][0])
    return out


def load_optimizer_state(
    kernel: TieredShardSource, table_of_param: Dict[int, str], state: Dict[torch.Tensor, Dict[str, object]]
) -> None:
    """Writes state built by ``optimizer_state_of`` (and since filled by a load) to the tiers.

    Raises:
        ValueError: a part is not a ShardedTensor, or the tables of this kernel (one step
            count) give different step counts.
    """
    by_table = _shards_by_table(kernel)
    steps: Dict[str, int] = {}
    for param, values in state.items():
        name = table_of_param[id(param)]
        shards = by_table[name]
        for key, part, _ in state_parts_of(kernel, shards[0][0]):
            value = values.get(f"{name}.{key}")
            if value is None:
                continue
            if not isinstance(value, ShardedTensor):
                raise ValueError(f"table {name}: optimizer state {key} must be a ShardedTensor, "
                                 f"got {type(value).__name__}")
            for (t, _), shard in zip(shards, value.local_shards()):
                kernel.load_shard(t, part, shard.tensor)
        step = values.get(f"{name}.{STEP_KEY}")
        if step is not None:
            steps[name] = int(torch.as_tensor(step).item())
    if len(set(steps.values())) > 1:
        raise ValueError(f"tables {', '.join(sorted(steps))} share one optimizer step count (one kernel), "
                         f"but the state gives {steps}")
    if steps:
        name, step = next(iter(steps.items()))
        kernel.load_shard(by_table[name][0][0], "step", torch.tensor(step, dtype=torch.int64))
