"""What a failed save reports: the errno behind DCP's exceptions, and one line that names
each rank's failure."""

from __future__ import annotations

import errno

from torch.distributed.checkpoint.api import CheckpointException

__all__ = ["errno_of", "first_line"]


def errno_of(e: BaseException) -> int:
    if isinstance(e, OSError) and e.errno:
        return e.errno
    if isinstance(e, CheckpointException):
        for exc, _ in e.failures.values():
            if isinstance(exc, OSError) and exc.errno:
                return exc.errno
    return errno.EIO


def first_line(e: BaseException) -> str:
    if isinstance(e, CheckpointException):
        return "; ".join(f"rank {r}: {type(exc).__name__}: {exc}" for r, (exc, _) in sorted(e.failures.items()))
    return f"{type(e).__name__}: {e}"
