"""Fixtures shared by the tests (CPU only)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from _block_store_helpers import uring_unavailable_reason
from _ports import master_store


@pytest.fixture(params=["uring", "threads"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Each I/O engine of the block store; io_uring is skipped (with the kernel's reason)
    where the kernel or a seccomp policy refuses it."""
    if request.param == "uring":
        reason = uring_unavailable_reason(tmp_path_factory.getbasetemp())
        if reason:
            pytest.skip(f"io_uring unavailable: {reason}")
    return request.param


@pytest.fixture(scope="module")
def process_group():
    """A gloo process group of one rank in this process (for DMP built in-process)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=master_store(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
