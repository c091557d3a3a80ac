"""Host tensors on transparent huge pages, for arrays whose rows are read and written at
random (the cache's slots, the DRAM tier): on 4 KiB pages nearly every such row costs a TLB
miss per tensor, a page walk that a VM's nested paging makes dearer still.

The pages are advised (``madvise(MADV_HUGEPAGE)``) before their first touch; a kernel without
transparent huge pages, or with them set to ``never``, keeps 4 KiB pages. Tensors under 2 MiB
are ordinary ones (``csrc/bindings/huge_page_ops.cpp``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from torchrec_mtrains._ops import load_extension

__all__ = ["huge_page_zeros"]


def huge_page_zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed, contiguous CPU tensor of ``shape`` on transparent huge pages where it spans them."""
    load_extension()
    shape = [int(n) for n in shape]
    return torch.ops.mtrains.huge_page_zeros(math.prod(shape), dtype).view(shape)
