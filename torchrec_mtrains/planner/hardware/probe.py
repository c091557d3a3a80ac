"""Measures this machine's tiers and compute into a hardware profile (``mtrains probe-hw``).

Per tier, what the kernel's access pattern gets (random rows of 512 B: 127 fp32 weights +
1 rowwise-Adagrad state value):

- DRAM: ``DramStore`` (the kernel's DRAM tier: C++ row gather/scatter) random row reads and
  writes of a table far larger than the CPU caches; torch ``index_select`` / ``index_copy_``
  of the same rows as comments (slower here: per-element copies).
- SCM: ``ScmStore`` (an mmap of a file in ``--dir``) random row reads and writes, every row
  written first. Without PMem or CXL memory the file sits in the page cache, so this is
  DRAM behind a page table, which is what the SCM tier is on such a machine.
- SSD: ``BlockStore`` (O_DIRECT, no DRAM row cache) random row reads on a fully written,
  reopened (cold) file, and random row writes + flush; fio 4 KiB random-read IOPS at QD 32
  (the device limit) as a comment, when fio is installed.
- SCM and SSD, as the kernel moves rows (probe_row_path.py): its CPU per row loaded and per
  evicted row written back, from ``cache_stats()``'s stage counters of a training run; the
  perf model charges a miss both, on the rank's cores.

Compute (probe_compute.py, probe_dense.py): FBGEMM's CPU TBE bytes/s; TieredEmbeddingBags'
own cost against it, run with its prefetch pipeline as training runs it (per step, per lookup
and per unique row on the critical path; its worker threads' CPU per step and per lookup);
a dense layer's cost from its shape (per multiply-accumulate, per output, per layer), so the
planner costs the dense part of the model it plans. ``cores_per_node`` is this machine's
core count: the planner's CPU-contention term divides the worker threads' CPU by the cores
of a rank.

Per-node figures (capacities, memory bandwidth) are divided by ``--ranks-per-node`` and
measurements use ``cores / ranks_per_node`` threads, as each rank of a job would.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from torchrec_mtrains.planner.hardware.fio import FioJob, FioUnavailable, run_fio
from torchrec_mtrains.planner.hardware.probe_row_path import BATCH, POOLING, first_touch_cpu, row_path_cpu
from torchrec_mtrains.planner.hardware.topology import topology_to_yaml
from torchrec_mtrains.planner.hardware.units import format_quantity
from torchrec_mtrains.planner.types import TieredTopology, TierSpec
from torchrec_mtrains.types import Tier

__all__ = ["ProbeConfig", "ProbeResult", "meminfo_bytes", "probe"]

ROW_DIM = 127
"""Weights per probe row; + 1 optimizer-state value = 128 fp32 = 512 B per row."""
ROW_BYTES = (ROW_DIM + 1) * 4
BLOCK_BYTES = 4096
"""BlockStore's block size: one random row access reads or writes one block."""
MEMORY_ACCESS_BYTES = 64
"""A cache line: the access unit of byte-addressable memory (DRAM, mmap'd SCM)."""


MIN_TABLE_MIB = 16


@dataclass(frozen=True)
class ProbeConfig:
    """What to measure and how long.

    Args:
        directory: filesystem of the SCM and SSD tiers (their files go to a temporary
            folder in it, removed afterwards).
        quick: small tables and short runs (~20 s instead of ~1-2 min).
        ranks_per_node: training processes per node; per-node figures are divided by it.
        dram_fraction: share of MemTotal the node gives to embeddings (the rest: OS,
            activations, page cache).
        storage_fraction: share of the directory's free space given to each of SCM and
            SSD (they share the filesystem here).
        table_mib: MiB of each tier probe's table (default 256, 32 with ``quick``): random
            reads of a small file can be served by caches below the filesystem (a VM's
            host), so probe with tables the size of the ones that will be trained.
    """

    directory: Path
    quick: bool = False
    ranks_per_node: int = 2
    dram_fraction: float = 0.5
    storage_fraction: float = 0.4
    table_mib: Optional[int] = None

    def __post_init__(self) -> None:
        if self.table_mib is not None and (isinstance(self.table_mib, bool) or not isinstance(self.table_mib, int)
                                           or self.table_mib < MIN_TABLE_MIB):
            raise ValueError(f"table_mib={self.table_mib!r} must be an integer >= {MIN_TABLE_MIB} "
                             "(the probes read batches of 16,384 distinct rows)")
        if not isinstance(self.ranks_per_node, int) or self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node={self.ranks_per_node!r} must be an integer >= 1")
        for name in ("dram_fraction", "storage_fraction"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise ValueError(f"{name}={v!r} must be in (0, 1]")
        if not self.directory.is_dir():
            raise ValueError(f"directory={str(self.directory)!r} is not a directory")

    @property
    def table_bytes(self) -> int:
        """Bytes of each probe table (far above the CPU caches; the SSD one is read O_DIRECT)."""
        return (self.table_mib or (32 if self.quick else 256)) * 2**20

    @property
    def seconds(self) -> float:
        """Target seconds of each timed loop."""
        return 0.3 if self.quick else 1.5

    @property
    def threads(self) -> int:
        """Threads of one rank: this machine's cores shared by the ranks."""
        return max(1, (os.cpu_count() or 1) // self.ranks_per_node)


@dataclass
class ProbeResult:
    """A measured topology with a comment per field (how it was measured)."""

    topology: TieredTopology
    notes: Dict[str, str] = field(default_factory=dict)
    header: str = ""

    def to_yaml(self) -> str:
        return topology_to_yaml(self.topology, self.notes, self.header)


def timed_rate(step: Callable[[], int], seconds: float, min_reps: int = 3) -> float:
    """Runs ``step`` (returning the units it did) at least ``min_reps`` times and for about
    ``seconds`` after one warm-up call; returns units per second."""
    step()
    done, reps, t0 = 0, 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - t0 < seconds:
        done += step()
        reps += 1
    return done / (time.perf_counter() - t0)


def meminfo_bytes(key: str = "MemTotal") -> int:
    """A /proc/meminfo figure (MemTotal by default) in bytes; OSError if it is missing."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/meminfo has no {key}")


def probe_dram(cfg: ProbeConfig) -> tuple[TierSpec, Dict[str, str]]:
    """Random 512-B row reads and writes of host memory, two ways: ``DramStore`` (the
    C++ row gather/scatter the kernel's DRAM tier uses: the figures) and plain torch
    ``index_select`` / ``index_copy_`` (in the notes)."""
    from torchrec_mtrains.storage import DramStore

    rows = cfg.table_bytes // ROW_BYTES
    store = DramStore(rows, ROW_DIM, state_dim=1)
    _fill(store, rows)
    reads, writes, _ = _row_io_rates(store, rows, 16384, cfg.seconds)
    del store
    table = torch.rand(rows, ROW_DIM + 1)
    batch = min(65536, rows)
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(rows, (batch,), generator=gen) for _ in range(8)]
    perms = [torch.randperm(rows, generator=gen)[:batch] for _ in range(8)]
    src = torch.rand(batch, ROW_DIM + 1)
    out = torch.empty(batch, ROW_DIM + 1)
    k = [0]

    def gather() -> int:
        k[0] += 1
        torch.index_select(table, 0, ids[k[0] % 8], out=out)
        return batch

    def scatter() -> int:
        k[0] += 1
        table.index_copy_(0, perms[k[0] % 8], src)
        return batch

    torch_read = timed_rate(gather, cfg.seconds) * ROW_BYTES
    torch_write = timed_rate(scatter, cfg.seconds) * ROW_BYTES
    mem = meminfo_bytes()
    capacity = mem * cfg.dram_fraction / cfg.ranks_per_node // 2**20 * 2**20
    what = f"random {ROW_BYTES}-B rows of a {cfg.table_bytes >> 20} MiB table, {cfg.threads} thread(s)"
    return TierSpec(capacity, _round(reads * ROW_BYTES), _round(writes * ROW_BYTES),
                    access_bytes=MEMORY_ACCESS_BYTES), {
        "capacity": f"{cfg.dram_fraction:g} x MemTotal {mem / 2**30:.1f} GiB / {cfg.ranks_per_node} ranks",
        "read_bandwidth": f"DramStore.read (the kernel's DRAM tier), {what}; "
                          f"torch.index_select: {_gbps(torch_read)}",
        "write_bandwidth": f"DramStore.write, {what}; Tensor.index_copy_: {_gbps(torch_write)}",
    }


def _gbps(x: float) -> str:
    return f"{x / 1e9:.2f} GB/s"


def _free_bytes(cfg: ProbeConfig) -> int:
    free = shutil.disk_usage(cfg.directory).free
    return float(free * cfg.storage_fraction / cfg.ranks_per_node // 2**20 * 2**20)


def _fill(store: object, rows: int, chunk: int = 65536) -> None:
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        store.write(torch.arange(start, start + n), torch.rand(n, ROW_DIM + 1))  # type: ignore[attr-defined]


def _row_io_rates(store: object, rows: int, batch: int, seconds: float,
                  after_write: Optional[Callable[[], None]] = None) -> tuple[float, float, float]:
    """Random row reads/s, writes/s (distinct ids per batch), and process CPU seconds per
    row moved (user + system, all threads: what moving rows costs the host)."""
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randperm(rows, generator=gen)[:batch] for _ in range(8)]
    payload = torch.rand(batch, ROW_DIM + 1)
    k = [0]

    def read() -> int:
        k[0] += 1
        store.read(batches[k[0] % 8])  # type: ignore[attr-defined]
        return batch

    def write() -> int:
        k[0] += 1
        store.write(batches[k[0] % 8], payload)  # type: ignore[attr-defined]
        if after_write is not None:
            after_write()
        return batch

    cpu0, moved = time.process_time(), [0]

    def counted(step: Callable[[], int]) -> Callable[[], int]:
        def run() -> int:
            n = step()
            moved[0] += n
            return n
        return run

    reads, writes = timed_rate(counted(read), seconds), timed_rate(counted(write), seconds)
    return reads, writes, (time.process_time() - cpu0) / max(1, moved[0])


def probe_scm(cfg: ProbeConfig, work: Path) -> tuple[TierSpec, Dict[str, str]]:
    """ScmStore (mmap) random row reads and writes on a fully written table."""
    from torchrec_mtrains.storage import ScmStore

    rows = cfg.table_bytes // ROW_BYTES
    store = ScmStore(work / "probe.scm", rows, ROW_DIM, state_dim=1)
    try:
        _fill(store, rows)
        reads, writes, cpu_per_row = _row_io_rates(store, rows, 16384, cfg.seconds)
    finally:
        store.close()
    what = f"ScmStore (mmap of {work.parent}), random {ROW_BYTES}-B rows of a fully written {cfg.table_bytes >> 20} MiB table"
    miss_cpu, write_back_cpu, how = row_path_cpu(Tier.SCM, work, rows, cfg.seconds)
    return TierSpec(_free_bytes(cfg), _round(reads * ROW_BYTES), _round(writes * ROW_BYTES),
                    access_bytes=MEMORY_ACCESS_BYTES, row_cpu_s=_round(cpu_per_row),
                    miss_cpu_s=_round(miss_cpu), write_back_cpu_s=_round(write_back_cpu)), {
        "row_cpu_cost": "process CPU time per row read or written in the measurements above",
        "miss_cpu_cost": f"the kernel's CPU per row loaded (its slot planned, read, checksum, into its slot); {how}",
        "write_back_cpu_cost": "the kernel's CPU per evicted row written back; same run",
        "capacity": f"{cfg.storage_fraction:g} x free space of {work.parent} / {cfg.ranks_per_node} ranks (shared with ssd)",
        "read_bandwidth": f"{_rows(reads)} rows/s; {what} (page cache: no PMem/CXL here)",
        "write_bandwidth": f"{_rows(writes)} rows/s; {what}",
    }


def probe_ssd(cfg: ProbeConfig, work: Path) -> tuple[TierSpec, Dict[str, str]]:
    """BlockStore (O_DIRECT, no DRAM cache) random row reads (cold) and writes + flush."""
    from torchrec_mtrains.storage import BlockStore

    rows = cfg.table_bytes // ROW_BYTES
    path = work / "probe.blk"
    store = BlockStore(path, rows, ROW_DIM, state_dim=1, dram_cache_mb=0.0, direct_io=True)
    try:
        _fill(store, rows)
        store.flush()
    finally:
        store.close()
    store = BlockStore.open(path, dram_cache_mb=0.0, direct_io=True)  # cold: nothing cached
    try:
        reads, writes, cpu_per_row = _row_io_rates(store, rows, 4096, cfg.seconds, after_write=store.flush)
        engine = store.io_engine
    finally:
        store.close()
    notes = {
        "capacity": f"{cfg.storage_fraction:g} x free space of {work.parent} / {cfg.ranks_per_node} ranks (shared with scm)",
        "read_iops": f"BlockStore ({engine}, O_DIRECT, no DRAM cache), cold random rows of a fully written "
                     f"{cfg.table_bytes >> 20} MiB table, batches of 4096",
        "write_iops": "BlockStore random rows, batches of 4096, each flushed (log-structured: rows are packed "
                      "into appended segments, so writes outrun reads)",
        "read_bandwidth": f"read_iops x {BLOCK_BYTES} B (one block per random row)",
        "write_bandwidth": f"write_iops x {ROW_BYTES} B: row bytes appended per second (the planner costs SSD "
                           "writes by their bytes, not by blocks)",
        "row_cpu_cost": "process CPU time (all threads, user + system) per row read or written above",
    }
    notes["read_iops"] += "; " + _fio_note(cfg, work)
    miss_cpu, write_back_cpu, how = row_path_cpu(Tier.SSD, work, rows, cfg.seconds)
    notes["miss_cpu_cost"] = (f"the kernel's CPU per row loaded (its slot planned, block read submitted and "
                              f"completed, checked, into its slot); {how}")
    notes["write_back_cpu_cost"] = "the kernel's CPU per evicted row written back (packed, appended to the log); same run"
    first_touch, how = first_touch_cpu(Tier.SSD, work, max(rows, 16 * BATCH * POOLING), cfg.seconds)
    notes["first_touch_cpu_cost"] = f"the kernel's CPU per row made on its first miss (no read); {how}"
    spec = TierSpec(_free_bytes(cfg), _round(reads * BLOCK_BYTES), _round(writes * ROW_BYTES),
                    read_iops=_round(reads), write_iops=_round(writes), access_bytes=BLOCK_BYTES,
                    row_cpu_s=_round(cpu_per_row), miss_cpu_s=_round(miss_cpu),
                    write_back_cpu_s=_round(write_back_cpu), first_touch_cpu_s=_round(first_touch))
    return spec, notes


def _fio_note(cfg: ProbeConfig, work: Path) -> str:
    """fio 4 KiB random-read IOPS at QD 32 on the same filesystem (the device limit)."""
    try:
        res = run_fio(work, [FioJob("randread_4k_qd32", "randread", 4096, 32)],
                      size_mb=cfg.table_bytes >> 20, runtime_s=1.0 if cfg.quick else 2.0)
    except FioUnavailable as e:
        return f"fio not run: {e}"
    iops = res["randread_4k_qd32"].iops
    return f"fio 4K randread QD32 (io_uring, direct): {format_quantity(_round(iops), 'count_rate')} IOPS"


def _round(x: float) -> float:
    """3 significant digits: measurements are not more precise than that."""
    return float(f"{x:.3g}")


def _rows(x: float) -> str:
    return format_quantity(_round(x), "count_rate")


def probe(cfg: ProbeConfig, command: str = "", progress: Callable[[str], None] = lambda s: None) -> ProbeResult:
    """Measures this machine (see the module docstring).

    Args:
        cfg: what to measure.
        command: the command line, for the profile's ``source``.
        progress: called with a line before each measurement.
    """
    from torchrec_mtrains.planner.hardware import probe_compute

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    notes: Dict[str, str] = {}
    tiers: Dict[Tier, TierSpec] = {}
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="mtrains-probe-", dir=cfg.directory) as tmp:
            work = Path(tmp)
            for tier, fn in ((Tier.DRAM, lambda: probe_dram(cfg)), (Tier.SCM, lambda: probe_scm(cfg, work)),
                             (Tier.SSD, lambda: probe_ssd(cfg, work))):
                progress(f"{tier.value}: random {ROW_BYTES}-B rows")
                tiers[tier], tier_notes = fn()
                notes.update({f"tiers.{tier.value}.{k}": v for k, v in tier_notes.items()})
            progress("compute: FBGEMM TBE, TieredEmbeddingBags vs FBGEMM, dense layers")
            compute, compute_notes = probe_compute.probe_compute(cfg.quick, work, cfg.ranks_per_node)
            notes.update({f"compute.{k}": v for k, v in compute_notes.items()})
    finally:
        torch.set_num_threads(threads)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = f"measured {now} on {platform.node()} by `{command or 'torchrec_mtrains.planner.hardware.probe.probe()'}`"
    topo = TieredTopology(name="local", compute_device="cpu", ranks_per_node=cfg.ranks_per_node, tiers=tiers,
                          compute=compute, source=source, cores_per_node=os.cpu_count() or 1)
    header = (f"This machine, measured by mtrains probe-hw{' --quick' if cfg.quick else ''} in "
              f"{time.perf_counter() - t0:.0f} s: {os.cpu_count()} cores, "
              f"MemTotal {meminfo_bytes() / 2**30:.1f} GiB, torch {torch.__version__}.\n"
              f"Figures are PER RANK: ranks_per_node = {cfg.ranks_per_node}; capacities are the node's divided by "
              f"{cfg.ranks_per_node}, and\nevery measurement ran on {cfg.threads} thread(s) "
              f"(= {os.cpu_count()} cores / {cfg.ranks_per_node} ranks), as one rank of a job would.\n"
              f"Bandwidths of random rows: {ROW_BYTES}-B rows (127 fp32 weights + 1 rowwise-Adagrad state).")
    return ProbeResult(topo, notes, header)
