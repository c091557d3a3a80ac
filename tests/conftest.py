"""Fixtures shared by the tests (CPU only)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests.support.block_store_helpers import uring_unavailable_reason
from tests.support.ports import master_store
from torchrec_mtrains.testing import enable_device_faults


@pytest.fixture(scope="session", autouse=True)
def device_faults_armable() -> None:
    """Stores the tests open in this process can be given device faults
    (torchrec_mtrains.testing.inject_device_fault); production stores run on plain devices."""
    enable_device_faults()


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
