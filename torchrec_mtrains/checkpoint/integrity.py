"""The CRC-32 of a checkpoint step's own files, and their check before a restore loads them."""

from __future__ import annotations

import os
import zlib
from typing import List

from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.types import ChainError

__all__ = ["check_files", "file_crc"]


def file_crc(path: str) -> int:
    """The zlib CRC-32 of the file at ``path``, read in 16 MiB blocks."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            crc = zlib.crc32(block, crc)
    return crc


def check_files(chain: List[ChainStep]) -> None:
    """Checks the CRC-32 of each step's ``.metadata`` and of the last step's dense-state
    files (what a restore loads besides the row chunks).

    Raises:
        ChainError: a file is missing or damaged.
    """
    for s in chain:
        for m in s.manifests:
            for name, crc in m.files.items():
                if name != ".metadata" and s is not chain[-1]:
                    continue  # only the last step's dense state is loaded
                where = os.path.join(s.reader.path, name)
                try:
                    ok = file_crc(where) == crc
                except OSError as e:
                    message = f"checkpoint file {where} (step {s.step}) cannot be read: {e.strerror}"
                    raise ChainError(message, where, s.step) from None
                if not ok:
                    raise ChainError(f"checkpoint file {where} (step {s.step}) fails its checksum", where, s.step)
