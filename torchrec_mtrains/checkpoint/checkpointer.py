"""DifferentialCheckpointer: saves and restores a TorchRec model with tiered tables.

    ckpt = DifferentialCheckpointer("/ckpt", full_every=4)
    trainer = ckpt.restore(model, dense_optimizer) if ckpt.latest() else {}
    ...
    record = ckpt.save(step, model, dense_optimizer, {"losses": losses})

Each save writes the dense state (everything but the tiered tables' rows, through DCP as
usual) and, of the tiered tables, only the rows trained since the previous save (a delta)
or every row that may differ from its initial value (a full step). The chain rules and the
layout on disk are in ``chain.py``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple, Union

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn

from torchrec_mtrains.checkpoint import chain as chain_dir
from torchrec_mtrains.checkpoint.collectives import (
    all_gather,
    all_sum,
    barrier,
    current_group,
    gather_errors,
    on_group,
    rank,
    world_size,
)
from torchrec_mtrains.checkpoint.dense_state import load_dense, load_plain, load_state_dicts, state_of
from torchrec_mtrains.checkpoint.fused_parts import delta_tables, fused_save_pieces
from torchrec_mtrains.checkpoint.fused_tracking import FusedShardRows, clear_fused_dirty, track_fused_tables
from torchrec_mtrains.checkpoint.failures import errno_of, first_line
from torchrec_mtrains.checkpoint.integrity import check_files, file_crc
from torchrec_mtrains.checkpoint.kind_change import (
    changed_tables,
    check_dense_optimizers,
    check_fused_targets,
    dense_sources,
    fused_pieces,
    pop_tables,
    restore_from_dense,
    tiered_tables,
    table_of,
    weight_key,
)
from torchrec_mtrains.checkpoint.steps import ChainStep
from torchrec_mtrains.checkpoint.restore import apply_rows, chain_specs, check_rows, restore_optimizer_steps
from torchrec_mtrains.checkpoint.quantize import QUANTIZE_KINDS
from torchrec_mtrains.checkpoint.row_io import PlannedChunk, RowChunkPlanner, RowChunkWriter, plan_chunks
from torchrec_mtrains.checkpoint.save_snapshot import PieceSnapshot, snapshots_of, stage, taken_marks
from torchrec_mtrains.checkpoint.store_links import adopt, link_pieces, linked_store, plan_adoption, release_pins
from torchrec_mtrains.checkpoint.tiered_parts import (
    LocalPiece,
    clear_dirty,
    exclude_tiered_state,
    local_pieces,
)
from torchrec_mtrains.checkpoint.types import (
    DELTA,
    FULL,
    MAP_ENTRY_BYTES,
    ChainError,
    CheckpointRecord,
    PieceRecord,
    StepManifest,
    VirtualRecord,
)
from torchrec_mtrains.checkpoint.virtual_pieces import (
    apply_virtual,
    check_virtual,
    live_chunks,
    plan_virtual_chunks,
    virtual_snapshot,
)
from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.storage.file_lock import FileLock, lock_directory
from torchrec_mtrains.testing.faults import fault_point

__all__ = ["DifferentialCheckpointer"]

_FULL_BYTES = 1 << 20  # a failed save with less free space than this is reported as ENOSPC


@dataclasses.dataclass
class _Chain:
    """The chain this process continues: saved or restored last, with this layout; its
    full step's and deltas' bytes of tiered rows."""

    base: int
    last: int
    steps: int
    base_bytes: int
    delta_bytes: int
    layout: Tuple


class DifferentialCheckpointer:
    """Differential checkpoints of a model with tiered tables in ``directory``.

    Args:
        directory: where the steps and ``latest`` live (shared by every rank).
        full_every: a chain is one full step and up to ``full_every - 1`` deltas.
        max_chain_fraction: a full step is written instead of a delta once the chain's
            deltas would exceed this fraction of its full step's bytes.
        keep_chains: complete chains kept (the newest; older ones are removed once a
            newer one is complete).
        chunk_mb: tiered rows per DCP tensor, in MiB (what a save holds in memory).
        link_ssd_tables: save SSD tables (block stores of one file, on this directory's
            filesystem) by hard-linking the store's file and writing its location map, the
            store keeping the saved rows' log segments until the step is gone
            (``store_links.py``); False copies their rows like any other tier's.
        quantize: ``"fp16"`` or ``"int8"``: deltas store the weights of their rows in that
            lossy encoding (``quantize.py``; optimizer state and full steps stay exact);
            None (default): exact.

    One job owns ``directory``: the first save or restore (or ``claim_directory``) locks it
    for as long as this checkpointer lives, and a checkpointer of another job on it is
    refused there with an OSError (EWOULDBLOCK) naming the directory and the holder's pid.
    """

    def __init__(self, directory: str, full_every: int = 4, max_chain_fraction: float = 1.0,
                 keep_chains: int = 1, chunk_mb: float = 32.0, link_ssd_tables: bool = True,
                 quantize: Optional[str] = None) -> None:
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every={full_every!r} must be an integer >= 1")
        if not max_chain_fraction > 0:
            raise ValueError(f"max_chain_fraction={max_chain_fraction!r} must be > 0")
        if isinstance(keep_chains, bool) or not isinstance(keep_chains, int) or keep_chains < 1:
            raise ValueError(f"keep_chains={keep_chains!r} must be an integer >= 1")
        if not 0 < chunk_mb <= 1024:
            raise ValueError(f"chunk_mb={chunk_mb!r} must be in (0, 1024]")
        if quantize not in (None,) + QUANTIZE_KINDS:
            raise ValueError(f"quantize={quantize!r} must be None or one of {QUANTIZE_KINDS}")
        self.quantize = quantize or ""
        self.directory = directory
        self.full_every, self.max_chain_fraction, self.keep_chains = full_every, max_chain_fraction, keep_chains
        self.chunk_bytes = int(chunk_mb * 2**20)
        self.link_ssd_tables = bool(link_ssd_tables)
        self._chain: Optional[_Chain] = None
        self._started = False
        self._claimed = False
        self._dir_lock: Optional[FileLock] = None  # rank 0's: the job's ownership of directory
        self._pending: Optional[PendingSave] = None  # the save running in the background
        self._executor: Optional[ThreadPoolExecutor] = None  # its thread
        self._group: Optional[Any] = None  # its process group

    def latest(self) -> Optional[str]:
        """The newest complete step, or None."""
        return chain_dir.latest_checkpoint(self.directory)

    def claim_directory(self) -> None:
        """Claims ``directory`` for this job, once (collective; the first save or restore
        does it otherwise): rank 0 creates it and locks it until this checkpointer is gone.

        Only rank 0 locks: all ranks of one job write into the directory (their manifests),
        rank 0 alone writes ``latest`` and removes leftovers, and the ranks of another job
        are refused with their rank 0. The lock dies with the process, so a job torchrun
        restarts claims the directory again.

        Raises:
            OSError: on every rank, when rank 0 could not take the lock (EWOULDBLOCK: another
                job holds it; the message names the directory and the holder's pid).
        """
        if self._claimed:
            return
        failure: Optional[Tuple[int, str]] = None
        if rank() == 0:
            try:
                os.makedirs(self.directory, exist_ok=True)
                self._dir_lock = lock_directory(self.directory, "checkpoint directory")
            except OSError as e:
                failure = (e.errno or errno.EIO, f"rank 0: {e.strerror or e}")
        for f in all_gather(failure):
            if f is not None:
                raise OSError(f[0], f[1])
        self._claimed = True

    def _start(self, restoring: Optional[str] = None) -> None:
        """Once: claims the directory, then removes what killed saves left (rank 0) before
        anything else is written, but not the chain of step ``restoring``."""
        if self._started:
            return
        self.claim_directory()
        if rank() == 0:
            os.makedirs(self.directory, exist_ok=True)
            step = None
            if restoring is not None and os.path.dirname(os.path.abspath(restoring)) == os.path.abspath(self.directory):
                step = chain_dir.step_of(os.path.basename(os.path.abspath(restoring)))
            chain_dir.remove_leftovers(self.directory, self.keep_chains, step)
        barrier()
        self._started = True

    # ------------------------------------------------------------------- save ----
    def save(self, step: int, model: nn.Module, dense_optimizer: Any = None,
             trainer: Optional[Dict[str, Any]] = None) -> CheckpointRecord:
        """Saves on every rank (collective); rank 0 writes ``trainer.json`` (``trainer``
        plus the step's kind, chain and sizes) and switches ``latest``. Waits for a save
        still running in the background first (``wait``).

        Raises:
            OSError: the step could not be written (e.g. ENOSPC); its partial directory is
                removed, ``latest`` still names the previous step, and the rows it would
                have saved go into the next save. Or the background save before it failed.
        """
        self.wait()
        job = self._snapshot(step, model, dense_optimizer, trainer, staged=False)
        if isinstance(job, CheckpointRecord):
            return job
        return job.write()

    def async_save(self, step: int, model: nn.Module, dense_optimizer: Any = None,
                   trainer: Optional[Dict[str, Any]] = None) -> "PendingSave":
        """As ``save``, but only the snapshot of the step is taken now (collective; the
        dense state copied, the rows to save fixed, with copy-on-write for tiered rows
        training rewrites before the save read them: ``save_snapshot.py``), and the rows are
        written by a thread of this checkpointer, on a process group of its own, while
        training goes on. ``latest`` moves once the step is complete. The next ``save``,
        ``async_save`` or ``restore`` waits for it, as does ``wait()``.

        Returns:
            a ``PendingSave``: ``result()`` waits and gives the ``CheckpointRecord`` (its
            ``blocking_seconds``: the time training stopped), or raises the save's OSError.
        """
        self.wait()
        group = self._save_group()
        job = self._snapshot(step, model, dense_optimizer, trainer, staged=True)
        if isinstance(job, CheckpointRecord):
            future: Future = Future()
            future.set_result(job)
        else:
            job.background = True
            future = self._writer().submit(job.write_on, group)
        self._pending = PendingSave(future)
        return self._pending

    def wait(self) -> Optional[CheckpointRecord]:
        """Waits for the save running in the background, if any; returns its record.

        Raises:
            OSError: that save failed (``latest`` still names the step before it).
        """
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def _writer(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtrains-checkpoint")
        return self._executor

    def _save_group(self) -> Optional[Any]:
        """The process group of background saves (made once, on every rank: collective)."""
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _snapshot(self, step: int, model: nn.Module, dense_optimizer: Any, trainer: Optional[Dict[str, Any]],
                  staged: bool) -> Union["_SaveJob", CheckpointRecord]:
        """Takes what step ``step`` holds (``save_snapshot.py``), between training steps;
        the complete record when that step is already the latest."""
        t0 = time.perf_counter()
        trainer = json.loads(json.dumps(trainer or {}))  # as trainer.json will hold it, fixed now
        self._start()
        name = chain_dir.step_name(step)
        path = os.path.join(self.directory, name)
        previous = self.latest()
        if previous is not None and os.path.basename(previous) == name:
            return self._record_of(previous, 0.0)  # already complete: nothing trained since
        if rank() == 0 and os.path.exists(path):
            shutil.rmtree(path)
        barrier()
        pieces = local_pieces(model)
        linked = [p for p in pieces if self.link_ssd_tables and linked_store(p, self.directory) is not None]
        copied = [p for p in pieces if p not in linked]
        # A linked SSD table is saved as its store holds it: the cache's changes go there
        # first (its pin makes them durable). Copied rows need no flush: their snapshot
        # copies the cached ones and reads the others from the tier.
        for emb in {id(p.emb): p.emb for p in linked}.values():
            emb.flush(steps_done=True, durable=False, tables=sorted({p.t for p in linked if p.emb is emb}))
        fault_point("checkpoint.flush")
        shards = track_fused_tables(model)
        with exclude_tiered_state(model):
            state = state_of(model, dense_optimizer)
            tracked = delta_tables(state, shards)
            fused = fused_save_pieces(state, shards, tracked)
            layout = _layout(pieces + fused, shards)
            kind = self._kind(layout, copied + fused)
            if kind == DELTA:  # their changed rows are in the chunks
                pop_tables(state, tracked)
            if staged:
                state = stage(state)
        snapshots = snapshots_of(copied, fused, kind == FULL, virtual_snapshot)
        linked_marks = [(p.emb.dirty_rows(p.t), taken_marks(p.emb.dirty_rows(p.t))) for p in linked]
        links, link_error = self._link(linked, path, step)
        job = _SaveJob(self, model, step, path, previous, kind, layout, snapshots, linked, linked_marks, links,
                       link_error, state, trainer, t0)
        job.blocking_seconds = time.perf_counter() - t0
        return job

    def _finish(self, path: str, step: int, kind: str, base: int, parent: Optional[int], copied: List[LocalPiece],
                fused: List[LocalPiece], chunks: List[PlannedChunk], links: List[PieceRecord],
                error: Optional[str], writer: RowChunkWriter, trainer: Dict[str, Any],
                live: Dict[str, VirtualRecord]) -> Tuple[CheckpointRecord, int, int]:
        """Once DCP wrote the step's data: writes this rank's manifest (unless linking the
        SSD tables failed: ``error``) and (rank 0) trainer.json. Returns the step's record,
        its copied rows' bytes and the bytes of the FUSED shards it holds whole (every rank's)."""
        if error is None:
            error = self._write_manifest(path, step, kind, base, parent, copied, fused, chunks, links,
                                         writer.state_files, trainer, live)
        errors = gather_errors(error)
        if errors:
            raise OSError(errno.EIO, "; ".join(errors))
        fault_point("checkpoint.saved")
        fused_whole = 0 if kind == DELTA else sum(p.spec.rows * p.spec.row_bytes for p in fused)
        rows, tiered, row_bytes, dense, rows_linked, linked_bytes, map_bytes, fused_bytes = all_sum([
            sum(c.count for c in chunks), sum(c.nbytes for c in chunks),
            sum(c.count * c.piece.spec.row_bytes for c in chunks),
            sum(os.path.getsize(os.path.join(path, f)) for f in writer.state_files),
            sum(r.snapshot.entries for r in links), sum(r.snapshot.entries * r.spec.row_bytes for r in links),
            sum(r.snapshot.entries * MAP_ENTRY_BYTES for r in links), fused_whole,
        ])
        record = CheckpointRecord(step, kind, path, bytes=0, rows_written=rows, seconds=0.0, row_bytes=row_bytes,
                                  dense_bytes=dense, rows_linked=rows_linked, linked_row_bytes=linked_bytes,
                                  map_bytes=map_bytes)
        nbytes = 0
        if rank() == 0:
            nbytes = chain_dir.dir_bytes(path)
            chain_dir.write_atomic(os.path.join(path, "trainer.json"), json.dumps({
                **trainer, "step": step, "kind": kind, "base": base, "parent": parent,
                "world_size": world_size(), "tiered_bytes": tiered,
                **dataclasses.replace(record, bytes=nbytes).counts(),
            }))
        return dataclasses.replace(record, bytes=all_sum([nbytes])[0]), tiered, fused_bytes

    @staticmethod
    def _link(pieces: List[LocalPiece], path: str, step: int) -> Tuple[List[PieceRecord], Optional[str]]:
        """The records of the pieces saved by linking their store file, or the error."""
        try:
            return link_pieces(pieces, path, step), None
        except (OSError, ValueError) as e:
            return [], f"rank {rank()}: {e}"

    def _kind(self, layout: Tuple, pieces: List[LocalPiece]) -> str:
        """FULL without a chain of this layout, after ``full_every`` steps, or when the
        chain's rows would outgrow their fraction of the full step's (tiered rows and FUSED
        shards; the rest of the dense state, written whole by every step, does not count);
        the same answer on every rank."""
        c = self._chain
        if c is None or c.layout != layout or c.steps >= self.full_every:
            return FULL
        dirty = all_sum([sum(p.emb.dirty_rows(p.t).count() * p.spec.row_bytes for p in pieces)])[0]
        return FULL if c.delta_bytes + dirty > self.max_chain_fraction * c.base_bytes else DELTA

    def _plan(self, snapshots: List[PieceSnapshot], kind: str) -> List[PlannedChunk]:
        """The chunks of the rows each snapshot selected (none for a FUSED shard in a full step)."""
        chunks: List[PlannedChunk] = []
        for s in snapshots:
            p = s.piece
            select = (lambda lo, hi, s=s: s.selected.ids(lo, hi))
            quantize = self.quantize if kind == DELTA else ""  # full steps stay exact
            if p.spec.virtual:  # by id
                chunks += plan_virtual_chunks(p, s.selected, max(1, self.chunk_bytes // p.spec.row_bytes), kind[0],
                                              quantize)
                continue
            order = getattr(p.emb, "storage_order", None)  # the block store's: chunks in log order
            chunks += plan_chunks(p, select, max(1, self.chunk_bytes // p.spec.row_bytes), kind[0], quantize,
                                  order=order)
        return chunks

    def _write_manifest(self, path: str, step: int, kind: str, base: int, parent: Optional[int],
                        pieces: List[LocalPiece], fused: List[LocalPiece], chunks: List[PlannedChunk],
                        links: List[PieceRecord], state_files: List[str], trainer: Dict[str, Any],
                        live: Dict[str, VirtualRecord]) -> Optional[str]:
        """Writes this rank's manifest; returns the error that prevented it, if any."""
        records = list(links)
        for p in pieces:
            mine = [c for c in chunks if c.piece is p]
            complete = kind == FULL and (p.spec.virtual or sum(c.count for c in mine) == p.spec.rows)
            records.append(PieceRecord(p.spec, complete, [c.spec() for c in mine], virtual=live.get(p.spec.key),
                                       optimizer_step=p.optimizer_step))
        for p in fused:  # whole in the dense state (full) or its changed rows (delta)
            mine = [c for c in chunks if c.piece is p]
            records.append(PieceRecord(p.spec, kind == FULL, [c.spec() for c in mine], fused=True))
        records.sort(key=lambda r: r.spec.key)
        try:
            files = {f: file_crc(os.path.join(path, f)) for f in state_files}
            if rank() == 0:
                files[".metadata"] = file_crc(os.path.join(path, ".metadata"))
            manifest = StepManifest(step, kind, base, parent, rank(), world_size(), records, files,
                                    {**trainer, "step": step} if rank() == 0 else {})
            chain_dir.write_atomic(os.path.join(path, f"tiered.rank{rank()}.json"), manifest.to_json())
        except OSError as e:
            return f"rank {rank()}: {e}"
        return None

    def _record_of(self, path: str, seconds: float) -> CheckpointRecord:
        return CheckpointRecord.from_trainer(path, chain_dir.read_trainer(path, chain_dir.step_of(os.path.basename(path))),
                                             seconds)

    # ---------------------------------------------------------------- restore ----
    def restore(self, model: nn.Module, dense_optimizer: Any = None, path: Optional[str] = None) -> Dict[str, Any]:
        """Restores the chain ending at ``path`` (default: ``latest``) into ``model`` and
        ``dense_optimizer`` (collective), whatever world size, sharding or tiers they have
        now; returns what ``save`` was given as ``trainer``, with ``"step"`` (for a plain
        DCP checkpoint, such as an export: its ``trainer.json``).

        Raises:
            FileNotFoundError: there is no complete checkpoint.
            ChainError: a step of the chain is missing or damaged; nothing was restored.
            ValueError: a table was saved with another optimizer's state than it has now
                (also a table that changed between tiered and FUSED); nothing was restored
                (the other ranks raise ChainError with the message).
            OSError: the save running in the background failed (waited for first; a
                second call restores).
        """
        self.wait()
        self._start(path)
        path = path or self.latest()
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        step = chain_dir.step_of(os.path.basename(path))
        trainer = chain_dir.read_trainer(path, step)
        if "kind" not in trainer:  # a plain DCP checkpoint (an export): TorchRec's own load
            load_plain(path, model, dense_optimizer)
            self._chain = None
            return trainer
        pieces = local_pieces(model)
        shards = track_fused_tables(model)
        failure: Optional[Exception] = None
        chain: List[ChainStep] = []
        with exclude_tiered_state(model):
            state = state_of(model, dense_optimizer)
            try:
                chain = chain_dir.read_chain(path)
                changed = changed_tables(pieces, tiered_tables(model), chain, state["model"])
                # FUSED when saved and now, with deltas of their changed rows: their dense
                # state loads from the step that holds it, the deltas' rows go on top.
                fused_then = {table_of(s) for s in chain_specs(chain, fused=True)}
                fused_now = {t for t in fused_then - tiered_tables(model) if weight_key(t) in state["model"]}
                earlier = _earlier_sources(chain, fused_now)
                adoptions = _adoptions(pieces, chain)
                adopted = {a.piece.spec.key for a in adoptions}
                targets = [p for p in pieces if p.spec.key not in adopted] + \
                    fused_pieces(state, changed.to_fused | fused_now)
                check_files(chain)
                check_virtual(pieces, chain)
                check_rows(targets, chain)
                dense_sources(chain, changed.to_tiered)  # raises unless a step holds them
                # Tables that changed kind: the same optimizer's state on both sides.
                check_dense_optimizers(pieces, changed.to_tiered, chain)
                check_fused_targets(state, changed.to_fused, chain)
            except (ChainError, ValueError) as e:  # every rank fails together, before anything is loaded
                failure = e
            errors = gather_errors(None if failure is None else str(failure))
            if failure is not None:
                raise failure
            if errors:  # another rank found damage: nothing is restored anywhere
                raise ChainError("; ".join(errors), path, step)
            load_dense(path, state, changed, earlier)
            for adoption in adoptions:
                adopt(adoption, self.directory)
            restore_from_dense(pieces, changed.to_tiered, chain)
            apply_rows(targets, chain)  # FUSED-now tables: into the state's tensors
            apply_virtual(pieces, chain)
            restore_optimizer_steps(pieces, chain)
            load_state_dicts(state, model, dense_optimizer)
        clear_dirty(model)
        clear_fused_dirty(model)
        self._chain = _chain_of(chain, shards)
        return dict(chain[-1].manifests[0].trainer)


class PendingSave:
    """A save running in the background (``DifferentialCheckpointer.async_save``)."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: Optional[float] = None) -> CheckpointRecord:
        """Waits for the save; its record, or its OSError raised."""
        return self._future.result(timeout)


class _SaveJob:
    """The write of one snapshotted step: DCP's files, manifests, ``latest``."""

    def __init__(self, ckpt: "DifferentialCheckpointer", model: nn.Module, step: int, path: str,
                 previous: Optional[str], kind: str, layout: Tuple, snapshots: List[PieceSnapshot],
                 linked: List[LocalPiece], linked_marks: List[Tuple[DirtyRows, DirtyRows]],
                 links: List[PieceRecord], link_error: Optional[str], state: Dict[str, Any],
                 trainer: Dict[str, Any], started: float) -> None:
        self.ckpt, self.model, self.step, self.path, self.previous = ckpt, model, step, path, previous
        self.kind, self.layout, self.snapshots = kind, layout, snapshots
        self.linked, self.linked_marks, self.links, self.link_error = linked, linked_marks, links, link_error
        self.state, self.trainer, self.started = state, trainer, started
        self.blocking_seconds = 0.0  # of the snapshot
        self.background = False  # written by the checkpointer's thread

    def write_on(self, group: Optional[Any]) -> CheckpointRecord:
        with on_group(group):
            return self.write()

    def write(self) -> CheckpointRecord:
        ck, step, path, kind = self.ckpt, self.step, self.path, self.kind
        base = step if kind == FULL else ck._chain.base
        parent = None if kind == FULL else ck._chain.last
        copied = [s.piece for s in self.snapshots if not s.fused]
        fused = [s.piece for s in self.snapshots if s.fused]
        try:
            try:
                chunks = ck._plan(self.snapshots, kind)
                live, live_tensors = live_chunks(self.snapshots)
                planner = RowChunkPlanner(chunks, live_tensors)
                writer = RowChunkWriter(path, planner.chunk_keys(), file_bytes=2 * ck.chunk_bytes)
                dcp.save(self.state, storage_writer=writer, planner=planner, process_group=current_group())
                record, tiered, fused_bytes = ck._finish(path, step, kind, base, parent, copied, fused, chunks,
                                                         self.links, self.link_error, writer, self.trainer, live)
            except (CheckpointException, Exception) as e:  # any failure (DCP's is a BaseException): the
                # step goes, its rows go into the next save
                self._failed(e)
            if rank() == 0:
                fault_point("checkpoint.latest")
                chain_dir.write_atomic(os.path.join(ck.directory, "latest"), chain_dir.step_name(step))
                fault_point("checkpoint.cleanup")
                chain_dir.remove_leftovers(ck.directory, ck.keep_chains)
            barrier()
            release_pins(self.model, ck.directory)
        finally:
            for s in self.snapshots:
                s.release()
        if kind == FULL:
            ck._chain = _Chain(step, step, 1, tiered + fused_bytes, 0, self.layout)
        else:
            ck._chain = dataclasses.replace(ck._chain, last=step, steps=ck._chain.steps + 1,
                                            delta_bytes=ck._chain.delta_bytes + tiered)
        seconds = time.perf_counter() - self.started
        blocking = self.blocking_seconds if self.background else seconds
        return dataclasses.replace(record, seconds=seconds, blocking_seconds=blocking)

    def _failed(self, e: BaseException) -> None:
        """Undoes what the step left and raises the OSError that names it."""
        ck, path, step = self.ckpt, self.path, self.step
        code = errno_of(e)
        if code == errno.EIO and shutil.disk_usage(ck.directory).free < _FULL_BYTES:
            # DCP writes tensors through torch.save's zip writer, which reports a full disk
            # as RuntimeError("unexpected pos ..."): name the cause from the free space.
            code = errno.ENOSPC
        if rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
        for p in self.linked:  # this step never completes: its rows need not stay
            p.emb.linkable_store(p.t).unpin_snapshot(step)
        for s in self.snapshots:
            s.give_back_marks()
        for live, marks in self.linked_marks:
            live.bits.bitwise_or_(marks.bits)
        raise OSError(code, f"checkpoint {path} could not be written ({os.strerror(code)}): {first_line(e)}; "
                            f"the latest complete checkpoint is still {self.previous}") from e


def _earlier_sources(chain: List[ChainStep], tables) -> Dict[str, set]:
    """{step directory: tables} of the FUSED tables whose dense state is in a step before
    the chain's last (its full step; the deltas hold their changed rows)."""
    out: Dict[str, set] = {}
    for table, n in dense_sources(chain, tables).items():
        if n != len(chain) - 1:
            out.setdefault(chain[n].reader.path, set()).add(table)
    return out


def _adoptions(pieces: List[LocalPiece], chain: List[ChainStep]):
    """The local pieces a linked record of the chain restores by adopting its file."""
    linked = {r.spec.key: r for r in chain[0].pieces() if r.snapshot is not None}
    found = []
    for p in pieces:
        record = linked.get(p.spec.key)
        adoption = None if record is None else plan_adoption(p, record, chain[0].directory)
        if adoption is not None:
            found.append(adoption)
    return found


def _chain_of(chain: List[ChainStep], shards: List[FusedShardRows]) -> _Chain:
    sizes = [sum(m.tiered_bytes for m in s.manifests) for s in chain]
    fused_bytes = sum(m.fused_bytes for m in chain[0].manifests)
    installs = all_gather(sorted({s.tracking.install for s in shards}))
    layout = tuple(sorted(chain_specs(chain), key=_spec_key)), tuple(tuple(i) for i in installs)
    return _Chain(chain[0].step, chain[-1].step, len(chain), sizes[0] + fused_bytes, sum(sizes[1:]), layout)


def _spec_key(spec) -> str:
    return spec.key


def _layout(pieces: List[LocalPiece], shards: List[FusedShardRows]) -> Tuple:
    """Every rank's shard specs, sorted, and which install of FUSED tracking each rank's
    kernels have: a chain continues only on the same layout, tracked since its last step."""
    parts = all_gather(([p.spec for p in pieces], sorted({s.tracking.install for s in shards})))
    every = [spec for specs, _ in parts for spec in specs]
    return tuple(sorted(every, key=_spec_key)), tuple(tuple(installs) for _, installs in parts)


