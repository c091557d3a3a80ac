"""Fixtures shared by the tests (CPU only)."""

from __future__ import annotations

import pytest

from _block_store_helpers import uring_unavailable_reason


@pytest.fixture(params=["uring", "threads"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Each I/O engine of the block store; io_uring is skipped (with the kernel's reason)
    where the kernel or a seccomp policy refuses it."""
    if request.param == "uring":
        reason = uring_unavailable_reason(tmp_path_factory.getbasetemp())
        if reason:
            pytest.skip(f"io_uring unavailable: {reason}")
    return request.param
