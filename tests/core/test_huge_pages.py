"""huge_page_zeros: zeroed tensors of any shape and dtype, on huge pages where they span them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchrec_mtrains.huge_pages import huge_page_zeros


@pytest.mark.parametrize("shape,dtype", [((3, 5), torch.float32), ((0,), torch.int32), ((1 << 20, 3), torch.float16),
                                         ((600_000, 2), torch.int64)])
def test_zeroed_contiguous_writable(shape, dtype) -> None:
    t = huge_page_zeros(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    assert not t.any()
    t.fill_(3)
    assert bool((t == 3).all())


def _anon_huge_kib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
                    or "[never]" in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text(),
                    reason="the kernel has no transparent huge pages")
def test_large_tensors_get_huge_pages() -> None:
    """64 MiB advised before its first touch comes back (mostly) on 2 MiB pages; the kernel may
    fall back to small pages when it has no free huge ones, so half is asked, not all."""
    before = _anon_huge_kib()
    t = huge_page_zeros((16 << 20,), torch.float32)
    assert _anon_huge_kib() - before >= 32 << 10
    del t


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="numel must be >= 0"):
        torch.ops.mtrains.huge_page_zeros(-1, torch.float32)
    with pytest.raises(RuntimeError, match="cannot allocate"):
        torch.ops.mtrains.huge_page_zeros(1 << 60, torch.uint8)
