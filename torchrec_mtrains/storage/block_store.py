"""BlockStore: embedding rows on a block device (the SSD tier), backed by csrc/storage.

The C++ store keeps rows in a log of crc32c-checked 4 KiB blocks found through a
direct-mapped location map (dense ids need no index), reads with batched O_DIRECT io_uring
I/O, and keeps a write-back DRAM row cache in front. This module validates input where it
enters and turns the C++ status codes into Python exceptions.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from torchrec_mtrains._ops import load_extension
from torchrec_mtrains.storage._validation import (
    PathLike,
    as_ids,
    check_init_range,
    check_int,
    check_number,
    check_path,
    check_row_range,
    check_rows,
)
from torchrec_mtrains.storage.status import raise_for_status
from torchrec_mtrains.storage.types import RowStore

__all__ = ["BlockStore", "StoreRuntimeConfig", "TableConfig"]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPE_BY_NAME = {v: k for k, v in _DTYPES.items()}
_ENGINES = ("auto", "uring", "threads")
_MAX_TAG = 2**63 - 1  # tags cross the TorchScript boundary as int64

@dataclasses.dataclass(frozen=True)
class StoreRuntimeConfig:
    """How an open store runs; not persisted.

    Attributes:
        dram_cache_mb: MiB of write-back row cache in DRAM; 0 disables it.
        direct_io: O_DIRECT I/O (falls back to buffered I/O, with a warning, where the
            filesystem refuses it).
        io_engine: "auto" (io_uring when the kernel allows it), "uring" or "threads"
            (a pread/pwrite thread pool).
        queue_depth: I/O operations in flight per batch (io_uring).
        io_threads: threads of the pread/pwrite engine.
    """

    dram_cache_mb: float = 64.0
    direct_io: bool = True
    io_engine: str = "auto"
    queue_depth: int = 64
    io_threads: int = 8

    def __post_init__(self) -> None:
        check_number("dram_cache_mb", self.dram_cache_mb, 0.0)
        if not isinstance(self.direct_io, bool):
            raise ValueError(f"direct_io={self.direct_io!r} must be a bool")
        if self.io_engine not in _ENGINES:
            raise ValueError(f"io_engine={self.io_engine!r} must be one of {_ENGINES}")
        check_int("queue_depth", self.queue_depth, 1, 4096)
        check_int("io_threads", self.io_threads, 1, 256)

    def settings(self) -> Dict[str, str]:
        return {
            "dram_cache_mb": repr(float(self.dram_cache_mb)),
            "direct_io": "1" if self.direct_io else "0",
            "io_engine": self.io_engine,
            "queue_depth": str(self.queue_depth),
            "io_threads": str(self.io_threads),
        }


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """The shape and on-disk layout of a new table (persisted in its header).

    Attributes:
        num_rows: rows in the table.
        dim: weights per row (multiples of 4 suit FBGEMM).
        state_dim: optimizer-state values stored after the weights of each row.
        dtype: torch.float32, torch.float16 or torch.bfloat16, for weights and state.
        init_range: rows never written read as uniform(lo, hi) weights, zero state.
        seed: seeds those initial values (a pure function of seed, row and column).
        block_size: bytes per block: a power of two from 4096 to 1 MiB.
        segment_blocks: blocks per log segment, the unit of sequential writes and of
            garbage collection (256 x 4 KiB = 1 MiB).
        overprovision: log space beyond what all rows need, as a fraction (>= 0.1);
            more space means less garbage-collection traffic on rewrites.
        stripe_paths: spread the log over these files (e.g. one per SSD); the main file
            then holds only the header, the location map and its journal.
    """

    num_rows: int
    dim: int
    state_dim: int = 1
    dtype: torch.dtype = torch.float32
    init_range: Tuple[float, float] = (-0.01, 0.01)
    seed: int = 0
    block_size: int = 4096
    segment_blocks: int = 256
    overprovision: float = 0.5
    stripe_paths: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_int("num_rows", self.num_rows, 1, 2**48)
        check_int("dim", self.dim, 1, 2**20)
        check_int("state_dim", self.state_dim, 0, 2**20)
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype} must be one of {list(_DTYPES)}")
        check_init_range(self.init_range)
        check_int("seed", self.seed, 0, 2**64 - 1)
        check_int("block_size", self.block_size, 4096, 2**20)
        check_int("segment_blocks", self.segment_blocks, 1, 65536)
        check_number("overprovision", self.overprovision, 0.1)
        for p in self.stripe_paths:
            if "\n" in os.fspath(p):
                raise ValueError(f"stripe path {p!r} contains a newline")

    def settings(self) -> Dict[str, str]:
        return {
            "num_rows": str(self.num_rows),
            "dim": str(self.dim),
            "state_dim": str(self.state_dim),
            "dtype": _DTYPES[self.dtype],
            "init_lo": repr(float(self.init_range[0])),
            "init_hi": repr(float(self.init_range[1])),
            "seed": str(self.seed),
            "block_size": str(self.block_size),
            "segment_blocks": str(self.segment_blocks),
            "overprovision": repr(float(self.overprovision)),
            "stripe_paths": "\n".join(os.path.abspath(os.fspath(p)) for p in self.stripe_paths),
        }


def _runtime_of(runtime: Optional[StoreRuntimeConfig], dram_cache_mb: float, direct_io: bool, io_engine: str,
                queue_depth: int, io_threads: int) -> StoreRuntimeConfig:
    """``runtime``, or the config of the loose arguments; both at once is an error naming the
    arguments changed from their defaults."""
    loose = StoreRuntimeConfig(dram_cache_mb, direct_io, io_engine, queue_depth, io_threads)
    if runtime is None:
        return loose
    if not isinstance(runtime, StoreRuntimeConfig):
        raise ValueError(f"runtime={runtime!r} must be a StoreRuntimeConfig")
    changed = [f.name for f in dataclasses.fields(loose) if getattr(loose, f.name) != f.default]
    if changed:
        raise ValueError(f"give the runtime settings either as runtime= or as arguments, not both: {changed} "
                         "set beside runtime")
    return runtime


class BlockStore(RowStore):
    """A table of embedding rows on a block device (file), with a DRAM row cache.

    ``BlockStore(path, num_rows, dim, ...)`` creates a new table (instantly, whatever its
    size: the file is sparse and rows never written read as their deterministic initial
    value); ``BlockStore.open(path)`` opens an existing one. Thread-safe: reads and writes
    may come from several threads (e.g. a prefetch thread and the training thread).

    Raises (from every method): ``ValueError`` for bad arguments or a file of another
    format, ``IndexError`` for row ids outside ``[0, num_rows)``, ``OSError`` (with
    ``errno``) for I/O failures such as a full disk, ``CorruptionError`` when data read
    back fails its checksum. Messages name the table file and the offending value. After
    any of these the store stays usable and nothing it had accepted is lost.

    An open store owns its file until ``close``: opening it again for writing (``open``,
    ``open_adopted``, creating over it with ``overwrite``, a ``snapshot`` onto it), in
    another process or in this one, raises ``BlockingIOError`` (an OSError, errno
    EWOULDBLOCK) naming the file and the pid holding it. ``open_read_only`` takes no lock.
    """

    def __init__(
        self,
        path: PathLike,
        num_rows: int,
        dim: int,
        state_dim: int = 1,
        dtype: torch.dtype = torch.float32,
        dram_cache_mb: float = 64.0,
        init_range: Tuple[float, float] = (-0.01, 0.01),
        seed: int = 0,
        direct_io: bool = True,
        *,
        block_size: int = 4096,
        segment_blocks: int = 256,
        overprovision: float = 0.5,
        stripe_paths: Sequence[PathLike] = (),
        io_engine: str = "auto",
        queue_depth: int = 64,
        io_threads: int = 8,
        overwrite: bool = False,
        runtime: Optional[StoreRuntimeConfig] = None,
    ) -> None:
        table = TableConfig(
            num_rows=num_rows,
            dim=dim,
            state_dim=state_dim,
            dtype=dtype,
            init_range=tuple(init_range),
            seed=seed,
            block_size=block_size,
            segment_blocks=segment_blocks,
            overprovision=overprovision,
            stripe_paths=tuple(os.fspath(p) for p in stripe_paths),
        )
        runtime = _runtime_of(runtime, dram_cache_mb, direct_io, io_engine, queue_depth, io_threads)
        path = check_path(path)
        self._handle = _new_handle()
        raise_for_status(self._handle.create(path, {**table.settings(), **runtime.settings()}, overwrite))
        self._after_open()

    @classmethod
    def open(
        cls,
        path: PathLike,
        dram_cache_mb: float = 64.0,
        direct_io: bool = True,
        *,
        io_engine: str = "auto",
        queue_depth: int = 64,
        io_threads: int = 8,
        runtime: Optional[StoreRuntimeConfig] = None,
    ) -> "BlockStore":
        """Opens an existing table, validating its header, file sizes and location map.

        The runtime settings come either as the arguments above or all at once as
        ``runtime`` (the one config type of every way of opening a store: ``open_read_only``
        and ``open_adopted`` take it too), whose fields they are."""
        runtime = _runtime_of(runtime, dram_cache_mb, direct_io, io_engine, queue_depth, io_threads)
        return cls._opened(lambda handle: handle.open(check_path(path), runtime.settings()))

    @classmethod
    def open_read_only(
        cls, path: PathLike, runtime: StoreRuntimeConfig = StoreRuntimeConfig()
    ) -> "BlockStore":
        """Opens an existing table to read row versions by location (``read_locations``)
        only, e.g. a checkpoint's hard link of a live table: the files are opened read-only
        and the location map is not loaded. ``stats`` and ``close`` work too (``close``
        writes nothing); every other method raises ValueError."""
        return cls._opened(lambda handle: handle.open_read_only(check_path(path), runtime.settings()))

    @classmethod
    def open_adopted(
        cls,
        path: PathLike,
        ids: torch.Tensor,
        locations: torch.Tensor,
        pin_tag: int,
        runtime: StoreRuntimeConfig = StoreRuntimeConfig(),
    ) -> "BlockStore":
        """Opens an existing table whose location map becomes exactly ``ids[i] ->
        locations[i]`` (entries from ``snapshot_entries``), rows no entry names reading as
        their initial value, and pins the entries' segments under ``pin_tag``. Only the
        map entries that differ from the file's are written (and made durable).

        Args:
            ids: strictly ascending row ids in ``[0, num_rows)``.
            locations: their map values (>= 1), as ``snapshot_entries`` returned them.
            pin_tag: tag of the pin kept on the entries' segments (``unpin_snapshot``).
        """
        path = check_path(path)
        ids = as_ids(path, ids)
        if ids.numel() > 1:
            steps = ids[1:] <= ids[:-1]
            if bool(steps.any()):
                pos = int(steps.nonzero()[0, 0]) + 1
                raise ValueError(
                    f"{path}: ids must be strictly ascending: id {int(ids[pos])} at position "
                    f"{pos} follows {int(ids[pos - 1])}"
                )
        locations = _as_locations(path, locations, ids.numel())
        check_int("pin_tag", pin_tag, 0, _MAX_TAG)
        return cls._opened(lambda handle: handle.open_adopted(path, runtime.settings(), ids, locations, pin_tag))

    @classmethod
    def _opened(cls, open_with: Callable[[torch.ScriptObject], Tuple[int, int, str]]) -> "BlockStore":
        """A store whose new handle ``open_with`` opened (its status raised if not ok)."""
        store = cls.__new__(cls)
        store._handle = _new_handle()
        raise_for_status(open_with(store._handle))
        store._after_open()
        return store

    def _after_open(self) -> None:
        info = dict(self._handle.info())
        self._info = info
        self.num_rows = int(info["num_rows"])
        self.dim = int(info["dim"])
        self.state_dim = int(info["state_dim"])
        self.dtype = _DTYPE_BY_NAME[info["dtype"]]
        self._closed = False
        if info["warning"]:
            warnings.warn(f"{info['path']}: {info['warning']}", RuntimeWarning, stacklevel=3)

    # Properties ---------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The table's main file."""
        return self._info["path"]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (every other method then raises ValueError)."""
        return self._closed

    @property
    def io_engine(self) -> str:
        """The I/O engine in use: "io_uring" or "threads"."""
        return self._info["io_engine"]

    @property
    def direct_io(self) -> bool:
        """Whether O_DIRECT is in effect (False after a fallback to buffered I/O)."""
        return self._info["direct_io"] == "1"

    @property
    def table_uuid(self) -> int:
        """The table's random id, stored in its header and in every block it writes."""
        return int(self._info["table_uuid"])

    @property
    def stripe_paths(self) -> List[str]:
        """The files the log is spread over (empty: the log is in the main file)."""
        stripes = self._info["stripe_paths"]
        return stripes.split("\n") if stripes else []

    @property
    def layout(self) -> Dict[str, str]:
        """Header fields: block size, rows per block, segments, init range, stripes, ..."""
        return dict(self._info)

    # Data path ----------------------------------------------------------------------
    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Returns rows ``ids`` as ``[len(ids), dim + state_dim]`` (into ``out`` if given).

        Args:
            ids: 1-D integer tensor (or sequence) of row ids in ``[0, num_rows)``.
            out: optional contiguous CPU tensor of the store's dtype and that shape,
                reused to avoid allocating (and page-faulting) a new result per batch.
        """
        ids = self._as_ids(ids)
        if out is None:
            out = torch.empty((ids.numel(), self.row_width), dtype=self.dtype)
        else:
            self._check_rows(out, ids.numel(), "out")
            if not out.is_contiguous():
                raise ValueError("out must be contiguous")
        raise_for_status(self._live().read_into(ids, out))
        return out

    def storage_order(self, ids: torch.Tensor) -> torch.Tensor:
        """The permutation of ``ids`` (int64 positions) in which they read fastest: first
        the rows in the DRAM cache or never written, then the rest by their place in the
        log, segment by segment. ``read(ids[order])`` in batches of consecutive positions
        then reads dense stretches of the log whole, sequentially, instead of one random
        block a row (what a checkpoint saving many rows wants). The order is the log's as
        of the call; rows written later may have moved, which costs speed, not correctness.
        """
        ids = self._as_ids(ids)
        order = torch.empty(ids.numel(), dtype=torch.int64)
        raise_for_status(self._live().storage_order_into(ids, order))
        return order

    def write(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Stores ``rows[i]`` as row ``ids[i]``; for a repeated id the last row wins.

        Rows go to the DRAM cache (write-back) or the log; ``flush()`` makes them durable.
        """
        ids = self._as_ids(ids)
        self._check_rows(rows, ids.numel(), "rows")
        raise_for_status(self._live().write(ids, rows.contiguous()))

    def exchange(
        self,
        write_ids: torch.Tensor,
        write_rows: torch.Tensor,
        read_ids: torch.Tensor,
        out: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``write(write_ids, write_rows)`` then ``read(read_ids, out)`` in one call, the
        device writes of the rows running while the reads are in flight.

        A row both written and read here reads its new value. If a read fails, the error
        is raised (the written rows were accepted); if writing the rows to the device
        fails, that error is raised, the rows staying in memory for a later ``flush()``.
        """
        write_ids, read_ids = self._as_ids(write_ids), self._as_ids(read_ids)
        self._check_rows(write_rows, write_ids.numel(), "write_rows")
        if out is None:
            out = torch.empty((read_ids.numel(), self.row_width), dtype=self.dtype)
        else:
            self._check_rows(out, read_ids.numel(), "out")
            if not out.is_contiguous():
                raise ValueError("out must be contiguous")
        raise_for_status(self._live().exchange(write_ids, write_rows.contiguous(), read_ids, out))
        return out

    def attach_to(self, mover: torch.ScriptObject, table: int) -> None:
        raise_for_status(mover.attach_block_store(table, self._live()))

    def written_ids(self, start: int, stop: int) -> torch.Tensor:
        """The ids in ``[start, stop)`` of rows that may differ from their initial value,
        ascending int64: rows in the location map (written to the log, flushed or not, and
        after ``open`` the rows of the reopened map) and rows dirty in the DRAM cache. The
        others read as their lazy initial value. Memory is O(stop - start)."""
        handle = self._live()
        check_row_range(self.path, start, stop, self.num_rows)
        status, ids = handle.written_rows(start, stop - start)
        raise_for_status(status)
        return ids

    # Pins: checkpoints that hard-link the table file ---------------------------------
    def pin_snapshot(self, tag: int) -> None:
        """Flushes, then pins under ``tag`` every log segment holding live rows: they are
        never reused (garbage-collected or overwritten) until ``unpin_snapshot(tag)``.
        Pinning a tag again replaces its segments. Pins live in memory only."""
        check_int("tag", tag, 0, _MAX_TAG)
        raise_for_status(self._live().pin_snapshot(tag))

    def snapshot_entries(self, tag: int, start: int, stop: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The location-map entries of rows in ``[start, stop)`` as of ``pin_snapshot(tag)``:
        ``(ids, locations)``, ascending int64 ids and their map values (int64, >= 1).
        Raises ValueError unless ``tag`` was pinned by ``pin_snapshot`` and nothing was
        written to the log since (a write that stays in the DRAM cache does not count).
        Memory is O(stop - start)."""
        handle = self._live()
        check_int("tag", tag, 0, _MAX_TAG)
        check_row_range(self.path, start, stop, self.num_rows)
        status, ids, locations = handle.snapshot_entries(tag, start, stop - start)
        raise_for_status(status)
        return ids, locations

    def pin_locations(self, tag: int, locations: torch.Tensor) -> None:
        """Adds to ``tag``'s pins the segments of these map values (e.g. a checkpoint's
        entries after a reopen). Raises ValueError once anything was written to the log
        since the store was opened: a segment freed before may already be reused."""
        check_int("tag", tag, 0, _MAX_TAG)
        locations = _as_locations(self.path, locations, None)
        raise_for_status(self._live().pin_locations(tag, locations))

    def unpin_snapshot(self, tag: int) -> None:
        """Drops ``tag``'s pins (an unknown tag: nothing); the space only it kept is
        reclaimed after the next commit (flush)."""
        check_int("tag", tag, 0, _MAX_TAG)
        self._live().unpin_snapshot(tag)

    def pin_tags(self) -> List[int]:
        """The pinned tags, ascending."""
        return list(self._live().pin_tags())

    def read_locations(self, ids: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        """The row versions stored at map values ``locations`` (from ``snapshot_entries``),
        as ``[len(ids), dim + state_dim]`` in the store's dtype. Every block is verified and
        must hold row ``ids[i]``: CorruptionError naming the row and location otherwise.
        Works on stores opened with ``open_read_only``."""
        ids = self._as_ids(ids)
        locations = _as_locations(self.path, locations, ids.numel())
        out = torch.empty((ids.numel(), self.row_width), dtype=self.dtype)
        raise_for_status(self._live().read_locations_into(ids, locations, out))
        return out

    def flush(self) -> None:
        """Writes every dirty row and the location map, then fsyncs."""
        raise_for_status(self._live().flush())

    def snapshot(self, dst_path: PathLike) -> None:
        """Flushes, then writes a consistent point-in-time copy to ``dst_path``.

        The copy is a reflink where the filesystem allows it, else a sparse copy; it is
        written under a temporary name and renamed, so ``dst_path`` is never half-written.
        Stripe files are copied beside it as ``dst_path.stripeN``.
        """
        raise_for_status(self._live().snapshot(check_path(dst_path)))

    def close(self) -> None:
        """Flushes and releases the files. Idempotent; if the flush fails the store stays
        open (and the error is raised) so no accepted row is dropped."""
        if self._closed:
            return
        raise_for_status(self._handle.close())
        self._closed = True

    def stats(self) -> Dict[str, float]:
        """Counters (rows and bytes read/written, cache hits/misses, garbage collection,
        write amplification, location-map memory as ``dram_bytes_per_row`` and map journal /
        checkpoint bytes written) and device latency percentiles (microseconds)."""
        return dict(self._live().stats())

    def __repr__(self) -> str:
        state = "closed" if getattr(self, "_closed", True) else self.io_engine
        return (
            f"BlockStore({self._info.get('path')!r}, num_rows={self.num_rows}, dim={self.dim}, "
            f"state_dim={self.state_dim}, dtype={self.dtype}, {state})"
        )

    # Helpers ------------------------------------------------------------------------
    def _live(self) -> torch.ScriptObject:
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        return self._handle

    def _as_ids(self, ids: object) -> torch.Tensor:
        return as_ids(self.path, ids)

    def _check_rows(self, rows: torch.Tensor, n: int, name: str) -> None:
        check_rows(self.path, rows, n, self.row_width, self.dtype, name)


def _new_handle() -> torch.ScriptObject:
    load_extension()
    return torch.classes.mtrains.BlockStore()


def _as_locations(table: str, locations: object, n: Optional[int]) -> torch.Tensor:
    """``locations`` as a contiguous 1-D int64 tensor of map values (>= 1; the upper
    bound, the log's slots, is checked by the store), ``n`` of them unless None."""
    try:
        locations = as_ids(table, locations)
    except ValueError as e:
        raise ValueError(str(e).replace("ids", "locations", 1)) from None
    if n is not None and locations.numel() != n:
        raise ValueError(f"{table}: {locations.numel()} locations for {n} ids")
    bad = locations < 1
    if bool(bad.any()):
        pos = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{table}: location {int(locations[pos])} at position {pos} is not a log "
            "location (map values are >= 1)"
        )
    return locations
