"""StagingArea: where a state_dict's local shards of tiered tables are materialised.

A shard under the RAM limit is an ordinary tensor; a larger one is backed by a memory-mapped
file (created and at once unlinked in the given directory), so a table larger than RAM
passes through the page cache to a checkpoint instead of being held in memory.
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Optional, Sequence

import torch

__all__ = ["StagingArea"]


class StagingArea:
    def __init__(self, ram_limit_bytes: float, directory: Optional[str]) -> None:
        self.ram_limit_bytes = ram_limit_bytes
        self.directory = directory or tempfile.gettempdir()
        self.files_used = 0  # tensors placed in files, for tests and logs

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if nbytes <= self.ram_limit_bytes or numel == 0:
            return torch.empty(tuple(shape), dtype=dtype)
        os.makedirs(self.directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="state_dict.", suffix=".stage", dir=self.directory)
        try:
            os.ftruncate(fd, nbytes)
            tensor = torch.from_file(path, shared=True, size=numel, dtype=dtype)
        except OSError as e:
            raise OSError(e.errno, f"cannot stage {nbytes / 2**20:,.1f} MiB for a state_dict in {path}: {e.strerror}") from None
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping keeps the pages; the name is not needed
        self.files_used += 1
        return tensor.view(tuple(shape))
