"""A process that trains a tiered table, flushes, queues prefetches and then ends one way.

Usage, in the repository root: ``python -m tests.support.clean_exit_worker TIER STORAGE_DIR END
REPORT_JSON``

TIER is SSD or SCM; END is how the process ends with the prefetches in flight:

- ``normal``: the script returns, the kernel never closed;
- ``exit``: ``sys.exit(EXIT_CODE)``;
- ``raise``: an uncaught RuntimeError;
- ``sigint``: SIGINT to itself (as Ctrl-C sends): an uncaught KeyboardInterrupt;
- ``sigterm``: SIGTERM to itself, whose Python handler raises ``SystemExit(SIGTERM_CODE)``;
- ``fork``: a forked child exits normally; the parent checks that its store is still locked
  and ends normally (see ``_fork_a_child_that_exits``).

Before it ends it writes REPORT_JSON: the table's store file and the sha256 of its rows as
flushed (weights then optimizer state, the store's row layout), which the store must hold
when reopened. The prefetched rows are all on the tier (written and flushed), so the
prefetches read from the device rather than computing lazy initial rows.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time

import torch

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels import TieredEmbeddingBags
from torchrec_mtrains.storage import BlockStore, ScmStore

# What tests run, in the repository root (crash_helpers.run's default cwd). As a module, not
# a script: a script's directory goes first on sys.path, where the support modules' names
# could shadow the modules it imports.
WORKER = [sys.executable, "-m", "tests.support.clean_exit_worker"]
EXIT_CODE = 7
SIGTERM_CODE = 128 + signal.SIGTERM
ROWS, DIM = 200_000, 64
TRAINED_IDS = 20_000  # the training steps look up ids below this; prefetches ids above
PREFETCHES, SAMPLES, POOLING = 6, 1000, 50
STORE_FILES = {"SSD": "t.blk", "SCM": "t.scm"}


def batch(rng: torch.Generator, low: int) -> tuple:
    indices = torch.randint(low, ROWS if low else TRAINED_IDS, (SAMPLES * POOLING,), generator=rng)
    return indices, torch.arange(0, SAMPLES * POOLING + 1, POOLING)


def main() -> None:
    tier, storage_dir, end, report, *rest = sys.argv[1:]
    lookahead = int(rest[0]) if rest else 0  # the window holds back the last prefetches' plans
    emb = TieredEmbeddingBags([(ROWS, DIM)], tier=Tier[tier], cache_rows=ROWS,
                              storage_dir=storage_dir, table_names=["t"], lookahead=lookahead)
    rng = torch.Generator().manual_seed(0)
    written = torch.rand((ROWS, DIM), generator=rng)
    emb.set_rows(0, torch.arange(ROWS), written)
    for _ in range(2):
        emb(*batch(rng, 0)).sum().backward()
    emb.flush(steps_done=True)
    weights, state = emb.read_rows(0, 0, ROWS)
    rows = torch.cat([weights, state.view(ROWS, 1)], dim=1).contiguous()
    with open(report, "w") as f:
        json.dump({"store": os.path.join(storage_dir, STORE_FILES[tier]),
                   "sha256": hashlib.sha256(rows.numpy().tobytes()).hexdigest()}, f)
    if end == "sigint":  # Python's own handler, even where the launcher left SIGINT ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if end == "sigterm":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(SIGTERM_CODE))
    started = time.perf_counter()
    for _ in range(PREFETCHES):
        emb.prefetch(*batch(rng, TRAINED_IDS))
    print(f"{PREFETCHES} prefetches queued in {time.perf_counter() - started:.4f} s", flush=True)
    if end == "fork":
        _fork_a_child_that_exits(emb, STORE_FILES[tier], storage_dir, report)
        return
    if end == "exit":
        sys.exit(EXIT_CODE)
    if end == "raise":
        raise RuntimeError("the training loop failed with prefetches in flight")
    if end in ("sigint", "sigterm"):
        # A real signal to this process; raise_signal runs its Python handler before returning.
        signal.raise_signal(signal.SIGINT if end == "sigint" else signal.SIGTERM)
        raise AssertionError(f"the {end} handler did not end the process")
    if end != "normal":
        raise ValueError(f"END={end!r} must be normal, exit, raise, sigint or sigterm")


def _fork_a_child_that_exits(emb: TieredEmbeddingBags, store_file: str, storage_dir: str, report: str) -> None:
    """A child forked with the kernel alive exits normally (its atexit hooks run); the kernel
    and its stores are the parent's, so the parent's store must still be open and locked
    after, untouched by the child, and train on. Adds ``"child_exit"``, ``"untouched"`` (the
    store file's mtime did not move) and ``"still_locked"`` to the report."""
    path = os.path.join(storage_dir, store_file)
    # Rows the store has accepted and not yet written (their flushed values, written again):
    # a child closing the store would write them.
    emb.set_rows(0, torch.arange(100), *emb.read_rows(0, 0, 100))
    before = os.stat(path).st_mtime_ns
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    untouched = os.stat(path).st_mtime_ns == before
    opener = {"t.blk": BlockStore.open, "t.scm": ScmStore.open}[store_file]
    try:
        opener(path).close()
        still_locked = False
    except BlockingIOError:
        still_locked = True
    with open(report) as f:
        result = json.load(f)
    result.update(child_exit=os.waitstatus_to_exitcode(status), still_locked=still_locked, untouched=untouched)
    with open(report, "w") as f:
        json.dump(result, f)
    # Trains on (a batch other than the prefetched ones): the kernel is intact. Not flushed,
    # so the store keeps the flushed rows.
    emb.cancel_prefetch()
    emb(*batch(torch.Generator().manual_seed(1), TRAINED_IDS)).sum().backward()


if __name__ == "__main__":
    main()
