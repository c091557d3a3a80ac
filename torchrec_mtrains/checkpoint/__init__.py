"""Differential checkpoints of models with tiered tables, through torch.distributed.checkpoint.

A save writes the dense state and only the rows (tiered, or of TorchRec's FUSED tables)
trained since the previous save (or, every ``full_every`` saves, every row that differs from
its initial value), stopped or in the background (``async_save``); a restore
reads the chain's full step, then its deltas, into any world size, sharding or tier.
``export_full_checkpoint`` turns a chain into one plain DCP checkpoint.
"""

from torchrec_mtrains.checkpoint.chain import latest_checkpoint, read_chain, remove_leftovers
from torchrec_mtrains.checkpoint.checkpointer import DifferentialCheckpointer, PendingSave
from torchrec_mtrains.checkpoint.export import export_full_checkpoint
from torchrec_mtrains.checkpoint.tiered_parts import exclude_tiered_state, flush_tiers
from torchrec_mtrains.checkpoint.types import ChainError, CheckpointRecord

# What a user imports from here (pinned by tests/package/test_package.py). The chain and
# state helpers stay importable from here and from their modules.
__all__ = [
    "ChainError",
    "CheckpointRecord",
    "DifferentialCheckpointer",
    "PendingSave",
    "export_full_checkpoint",
    "flush_tiers",
    "latest_checkpoint",
]
