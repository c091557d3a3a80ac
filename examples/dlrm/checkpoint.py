"""Checkpoints of the example: differential ones, through torchrec_mtrains.checkpoint (DCP).

Layout of ``--checkpoint-dir`` (see torchrec_mtrains/checkpoint/chain.py and
docs/checkpoints.md)::

    step_00000100/   a full step: dense state, every tiered row that left its initial value
    step_00000200/   a delta: dense state, the tiered rows written since step 100
                     (SSD tables, in every step: a link to the block-store file + its map)
    latest           name of the newest complete step (replaced atomically last)

``--full-every K`` starts a new chain with a full step every K saves; ``--keep-chains N``
keeps the N newest chains. Each step's ``trainer.json`` holds the step (= data position),
losses so far, AUC curve and seed. A save that fails (a full disk) removes its partial
directory and raises an OSError naming it, leaving ``latest`` as it was.

The save's fault points (``checkpoint.*``, for crash tests) are the checkpointer's: see
``torchrec_mtrains.testing.faults``.
"""

from __future__ import annotations

from torchrec_mtrains.checkpoint import DifferentialCheckpointer, flush_tiers, latest_checkpoint

__all__ = ["checkpointer_of", "flush_tiers", "latest_checkpoint"]


def checkpointer_of(args) -> DifferentialCheckpointer:
    """The run's checkpointer, from --checkpoint-dir, --full-every, --keep-chains,
    --max-chain-fraction, --copy-ssd-tables and --checkpoint-quantize."""
    return DifferentialCheckpointer(args.checkpoint_dir, full_every=args.full_every, keep_chains=args.keep_chains,
                                    link_ssd_tables=not args.copy_ssd_tables, quantize=args.checkpoint_quantize,
                                    max_chain_fraction=args.max_chain_fraction)
