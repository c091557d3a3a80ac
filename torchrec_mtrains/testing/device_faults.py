"""Device faults for tests: fail (or corrupt) a block store's upcoming device operations.

Stores opened after :func:`enable_device_faults` live on the extension's fault-injecting
environment (csrc/testing/): their devices forward every operation until a test arms a
fault with :func:`inject_device_fault`. Production never enables it, so its stores run on
plain devices.
"""

from __future__ import annotations

import torch

from torchrec_mtrains._ops import load_extension

KINDS = ("read_error", "write_error", "sync_error", "corrupt_read")


def enable_device_faults(enabled: bool = True) -> None:
    """Opens every block store from now on (in this process) on the fault-injecting
    environment, or, with ``enabled=False``, on the default one again. Stores keep the
    environment they were opened on."""
    load_extension()
    torch.ops.mtrains.use_fault_injecting_env(enabled)


def inject_device_fault(
    store, kind: str, after: int = 0, count: int = 1, errno_code: int = 5, on_map: bool = False
) -> None:
    """Fails (or, with "corrupt_read", corrupts) upcoming device operations of ``store``.

    Args:
        store: an open :class:`~torchrec_mtrains.storage.BlockStore`, opened after
            :func:`enable_device_faults`.
        kind: "read_error", "write_error", "sync_error" or "corrupt_read".
        after: operations of that kind to let through first.
        count: operations to fail; 0 disarms.
        errno_code: errno of the injected failure (e.g. errno.ENOSPC).
        on_map: target the location-map device (the main file's header, map and journal)
            instead of the log.
    """
    if store.closed:
        raise ValueError(f"{store.path} is closed")
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind '{kind}': one of {', '.join(KINDS)}")
    load_extension()
    code, err, message = torch.ops.mtrains.arm_device_fault(store.path, kind, after, count, errno_code, on_map)
    if code != 0:
        raise ValueError(f"{message} (call enable_device_faults() before opening the store)")
