"""Reading a torch.distributed.checkpoint directory whole, in one process (tests compare
exports and saves key by key)."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

__all__ = ["read_dcp"]


def read_dcp(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """(every tensor of the checkpoint at ``path``, full-size, by key; its metadata by key)."""
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    tensors = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.items()
               if isinstance(m, TensorStorageMetadata)}
    dcp.load(tensors, checkpoint_id=path, no_dist=True)
    return tensors, md
