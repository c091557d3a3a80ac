"""``fsync_path``: makes a closed file's bytes, or a directory's entries, durable."""

from __future__ import annotations

import os

__all__ = ["fsync_path"]


def fsync_path(path: str) -> None:
    """fsyncs the file or directory ``path`` (for a directory: the entries created, renamed
    or removed in it, which an fsync of the files themselves does not cover)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
