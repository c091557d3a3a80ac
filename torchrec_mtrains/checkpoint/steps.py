"""A checkpoint step on disk: its directory name and, once read, its reader and manifests.

A leaf of the checkpoint package: the chain (chain.py), the linked SSD shards
(store_links.py) and the restore path (restore.py) all name steps, and none of them needs the
others for it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Dict, Iterator, List, Optional

from torchrec_mtrains.checkpoint.row_io import StepReader
from torchrec_mtrains.checkpoint.types import PieceRecord, StepManifest
from torchrec_mtrains.storage import BlockStore

__all__ = ["ChainStep", "step_name", "step_of"]

_PREFIX = "step_"


def step_name(step: int) -> str:
    """The directory name of step ``step`` ("step_00000100")."""
    return f"{_PREFIX}{step:08d}"


def step_of(name: str) -> Optional[int]:
    """The step a directory name names, or None if it names none."""
    digits = name[len(_PREFIX):]
    if not name.startswith(_PREFIX) or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


@dataclasses.dataclass
class ChainStep:
    """One step of a chain on disk: its reader and every rank's manifest (and readers of
    the block-store files its linked pieces name, opened as needed)."""

    step: int
    reader: StepReader
    manifests: List[StepManifest]
    links: Dict[str, BlockStore] = dataclasses.field(default_factory=dict)

    @property
    def directory(self) -> str:
        """The checkpoint directory holding this step."""
        return os.path.dirname(self.reader.path)

    def pieces(self) -> Iterator[PieceRecord]:
        for m in self.manifests:
            yield from m.pieces
