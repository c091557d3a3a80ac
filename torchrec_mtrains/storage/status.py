"""The status tuples the C++ data path returns, turned into Python exceptions."""

from __future__ import annotations

from typing import Tuple

from torchrec_mtrains.storage.types import CorruptionError

__all__ = ["raise_for_status"]

# Status codes of csrc/common/status.h.
_OK, _INVALID, _OUT_OF_RANGE, _IO, _CORRUPTION, _CLOSED, _FORMAT = range(7)


def raise_for_status(status: Tuple[int, int, str]) -> None:
    """Raises what a ``(code, errno, message)`` status says went wrong: ValueError (bad
    input, a closed store, a file of another format), IndexError (a row id out of range),
    CorruptionError (a failed checksum), OSError with its errno (the OS refused an I/O);
    nothing when it is ok."""
    code, err, message = status
    if code == _OK:
        return
    if code in (_INVALID, _CLOSED, _FORMAT):
        raise ValueError(message)
    if code == _OUT_OF_RANGE:
        raise IndexError(message)
    if code == _CORRUPTION:
        raise CorruptionError(err, message)
    raise OSError(err, message)
