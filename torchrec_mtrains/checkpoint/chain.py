"""DifferentialCheckpointer: checkpoints whose size follows the rows that changed.

Layout of a checkpoint directory (every ``step_*`` is a torch.distributed.checkpoint
directory)::

    step_00000100/   full: dense state + every tiered row that differs from its initial value
    step_00000200/   delta: dense state + the tiered rows written since step 100
    step_00000300/   delta on step 200
      .metadata, __*_*.distcp      DCP files (dense state_dict, row chunks and their ids)
      tiered.rank<r>.json          rank r's manifest: shards, chunks, CRC-32 of each
      <shard>.map, links/<shard>.blk   an SSD shard saved by linking its block-store file
                                   and writing its location map (store_links.py)
      trainer.json                 the caller's state + kind, base, parent, bytes, rows
    latest           the newest complete step ("step_00000300")

A chain is a full step and the deltas after it, each naming its parent. A save is complete
once ``latest`` names it; ``latest`` is replaced atomically, last. On the first save or
restore, steps newer than ``latest``, steps without ``trainer.json`` and chains beyond the
``keep_chains`` newest are removed; older chains go only once a newer one is complete.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional

from torchrec_mtrains.checkpoint.manifest_schema import check_trainer
from torchrec_mtrains.checkpoint.row_io import StepReader
from torchrec_mtrains.checkpoint.steps import ChainStep, step_name, step_of
from torchrec_mtrains.storage.fsync import fsync_path
from torchrec_mtrains.checkpoint.types import FULL, ChainError, StepManifest

__all__ = [
    "dir_bytes", "fsync_dir", "latest_checkpoint", "read_chain", "read_trainer", "remove_leftovers", "step_name",
    "step_of", "write_atomic",
]

def write_atomic(path: str, text: str) -> None:
    """Writes ``path`` whole or not at all, durably: a temporary file, fsync, fsync of the
    directory, rename, fsync of the directory. The first directory fsync makes what was
    created there before (the step directory ``latest`` is about to name) durable before
    the rename can be: a power cut never leaves a ``latest`` naming a step it lost."""
    tmp = path + ".tmp"
    directory = os.path.dirname(path) or "."
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(directory)
    os.replace(tmp, path)
    fsync_dir(directory)  # the rename itself survives a power loss


fsync_dir = fsync_path  # the entries of a directory (created, renamed files) made durable


def read_trainer(path: str, step: Optional[int]) -> Dict[str, Any]:
    where = os.path.join(path, "trainer.json")
    try:
        with open(where) as f:
            return dict(check_trainer(json.load(f)))
    except FileNotFoundError:
        raise ChainError(f"checkpoint step {step} is missing: {path} has no trainer.json", path, step) from None
    except (OSError, ValueError, RecursionError) as e:
        raise ChainError(f"checkpoint {where} (step {step}) cannot be read: {e}", where, step) from None


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest complete checkpoint step in ``directory``, or None.

    Raises:
        ChainError: ``latest`` does not name a step (a step directory's name, nothing else).
    """
    where = os.path.join(directory, "latest")
    try:
        with open(where, "rb") as f:
            raw = f.read(256)
    except FileNotFoundError:
        return None
    name = raw.decode("ascii", errors="replace").strip()
    if step_of(name) is None:
        raise ChainError(f"checkpoint pointer {where} is damaged: {name[:64]!r} is not a step's name", where, None)
    path = os.path.join(directory, name)
    return path if os.path.exists(os.path.join(path, "trainer.json")) else None


def dir_bytes(path: str) -> int:
    """Bytes of the step's own files (not of the store files it links)."""
    files = (os.path.join(path, f) for f in os.listdir(path))
    return sum(os.path.getsize(f) for f in files if os.path.isfile(f))


def read_chain(path: str) -> List[ChainStep]:
    """The chain ending at checkpoint step ``path``: its full step first, then each delta.

    Raises:
        ChainError: a step of the chain (the full one included) is missing or damaged.
    """
    directory = os.path.dirname(os.path.abspath(path))
    steps: List[ChainStep] = []
    here: Optional[str] = os.path.abspath(path)
    step = step_of(os.path.basename(here))
    child: Optional[int] = None
    base: Optional[int] = None
    while here is not None:
        if not os.path.isdir(here):
            what = "full checkpoint" if step == base else "delta checkpoint"
            raise ChainError(
                f"the chain is broken: {what} {here} (step {step}), which step {child} applies on, is missing",
                here, step,
            )
        read_trainer(here, step)  # the mark of a complete step; the manifests are what counts
        first = _read_manifest(here, 0, step)
        manifests = [first] + [_read_manifest(here, r, step) for r in range(1, first.world_size)]
        for m in manifests:
            if (m.step, m.base, m.parent) != (step, first.base, first.parent):
                where = os.path.join(here, f"tiered.rank{m.rank}.json")
                raise ChainError(f"checkpoint manifest {where} (step {step}) belongs to step {m.step} of the chain "
                                 f"based on step {m.base}, not to this one", where, step)
        base = first.base if base is None else base
        steps.append(ChainStep(step, StepReader(here, step), manifests))
        parent = first.parent
        child, step = step, parent
        here = None if parent is None else os.path.join(directory, step_name(parent))
    steps.reverse()
    if steps[0].manifests and steps[0].manifests[0].kind != FULL:
        first = steps[0]
        raise ChainError(f"checkpoint {first.reader.path} is not a full checkpoint", first.reader.path, first.step)
    _hoist_links(steps)
    return steps


def _hoist_links(steps: List[ChainStep]) -> None:
    """A linked piece is whole in every step that saved it: only the last step's record
    counts. It moves to the full step's manifests (where a restore starts a shard from
    initial values and the saved rows); the earlier ones are dropped."""
    for s in steps[:-1]:
        for m in s.manifests:
            m.pieces = [p for p in m.pieces if p.snapshot is None]
    if len(steps) > 1:
        for n, m in enumerate(steps[-1].manifests):
            linked = [p for p in m.pieces if p.snapshot is not None]
            m.pieces = [p for p in m.pieces if p.snapshot is None]
            steps[0].manifests[n % len(steps[0].manifests)].pieces += linked


def _read_manifest(path: str, rank: int, step: Optional[int]) -> StepManifest:
    where = os.path.join(path, f"tiered.rank{rank}.json")
    try:
        with open(where) as f:
            text = f.read()
    except OSError as e:
        message = f"checkpoint manifest {where} (step {step}) cannot be read: {e.strerror}"
        raise ChainError(message, where, step) from None
    return StepManifest.from_json(text, where, step)


def remove_leftovers(directory: str, keep_chains: int, restoring: Optional[int] = None) -> List[str]:
    """Removes what no restore can use: steps newer than ``latest`` (saves killed half-way:
    ``latest`` only moves forward, so every such save is newer), everything when there is no
    ``latest``, and chains older than the ``keep_chains`` newest. The chain of ``latest``
    stays even if damaged, for its restore to say what is wrong; so does a step whose chain
    cannot be told, and the chain of step ``restoring`` (a restore of an older step).
    Returns the names removed. Call on one rank, while no save runs."""
    latest = latest_checkpoint(directory)
    latest_step = None if latest is None else step_of(os.path.basename(latest))
    steps = {s: os.path.join(directory, n) for n in os.listdir(directory) if (s := step_of(n)) is not None}
    gone = {s for s in steps if latest_step is None or s > latest_step}
    base_of = {s: _base_of(steps[s], s) for s in steps if s not in gone}
    current = base_of.get(latest_step)
    if current is not None:
        older = sorted({b for b in base_of.values() if b is not None and b < current}, reverse=True)
        keep = {current, *older[: max(0, keep_chains - 1)], base_of.get(restoring)}
        gone |= {s for s, b in base_of.items() if b is not None and b < current and b not in keep}
    removed = []
    for step in sorted(gone):
        shutil.rmtree(steps[step], ignore_errors=True)
        removed.append(os.path.basename(steps[step]))
    return removed


def _base_of(path: str, step: int) -> Optional[int]:
    """The full step of the chain of step ``path``, or None if its trainer.json is unreadable."""
    try:
        with open(os.path.join(path, "trainer.json")) as f:
            return int(json.load(f).get("base", step))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
