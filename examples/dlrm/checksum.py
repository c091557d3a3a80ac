"""A checksum of the trained weights, for metrics.json: two runs that trained the same
weights (one node of 2 ranks, or 2 nodes of one; a resumed run) have the same one.

SHA-256 over every entry of the model's ``state_dict()``, in key order: each shard of a
sharded table (tiered tables' rows read from their tiers) by its key and row/column offsets,
and the replicated dense parameters once. It depends on the plan's shards, not on which
rank or node holds them.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

__all__ = ["weights_sha256"]


def _digest(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype} {tuple(t.shape)}".encode())
    h.update(np.ascontiguousarray(t.detach().cpu().numpy()).data)
    return h.hexdigest()


def _local_digests(module: torch.nn.Module, rank: int) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for key, value in module.state_dict().items():
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                out[f"{key}@{tuple(shard.metadata.shard_offsets)}"] = _digest(shard.tensor)
        elif isinstance(value, torch.Tensor) and rank == 0:  # replicated: the same on every rank
            out[key] = _digest(value)
    return out


def weights_sha256(module: torch.nn.Module) -> str:
    """The hex SHA-256 of ``module``'s weights, on every rank (a collective: every rank
    hashes its own shards)."""
    gathered: List[Dict[str, str]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, _local_digests(module, dist.get_rank()))
    merged: Dict[str, str] = {}
    for digests in gathered:
        merged.update(digests)
    h = hashlib.sha256()
    for key in sorted(merged):
        h.update(f"{key}={merged[key]}\n".encode())
    return h.hexdigest()
