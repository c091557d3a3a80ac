"""Value types shared by every subpackage of torchrec_mtrains."""

from __future__ import annotations

import enum

__all__ = ["Tier"]


class Tier(enum.Enum):
    """A memory or storage tier an embedding table (or its backing store) can live on.

    Members are listed from fastest to slowest. Capacities, bandwidths and other
    per-tier figures are maps keyed by this enum, never one field per tier.
    """

    HBM = "hbm"
    """GPU high-bandwidth memory."""
    DRAM = "dram"
    """Host DRAM."""
    SCM = "scm"
    """Byte-addressable storage-class memory: PMem, CXL memory, a DAX file or an mmap."""
    SSD = "ssd"
    """Block-addressable storage (NVMe SSD, block SCM), served by the C++ block store."""
