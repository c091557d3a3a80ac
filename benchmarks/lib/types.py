"""Value types of the benchmarks: configuration, per-phase results, errors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

__all__ = [
    "BaselineUnavailable",
    "CASES",
    "KernelBenchConfig",
    "PHASES",
    "PhaseResult",
    "StoreBenchConfig",
]

FLOAT32_BYTES = 4
"""Bytes per float32 value: rows are stored as float32 (weights + optimizer state)."""

MIB = 1024 * 1024
"""Bytes per MiB."""

PHASES: tuple[str, ...] = (
    "load",
    "read_cold_uniform",
    "read_cold_zipf",
    "read_warm",
    "write_flush_each",
    "write_flush_end",
)
"""Phases every store-like system (ours, RocksDB, memmap) runs, in order.

- ``load``: write every row once (batched), persist.
- ``read_cold_uniform``: batched reads of distinct uniform random ids, caches empty.
- ``read_cold_zipf``: batched Zipf reads (over shuffled ids), starting from an empty cache.
- ``read_warm``: the last uniform batch read again (served from the system's cache).
- ``write_flush_each``: batched random writes, each batch made durable (flush / fsync).
- ``write_flush_end``: batched random writes, one flush at the end of the phase.
"""


class BaselineUnavailable(RuntimeError):
    """A baseline cannot run on this machine (missing tool, library or permission).

    The message says what is missing; the benchmark reports the baseline as skipped.
    """


Scalar = Union[int, float, str, bool, None]


@dataclass
class PhaseResult:
    """What one system measured in one phase.

    Attributes:
        system: "ours", "rocksdb", "memmap" or "fio".
        phase: One of :data:`PHASES` (or a fio job name for "fio").
        rows: Rows (fio: I/Os) the phase processed.
        seconds: Wall-clock seconds of the phase.
        cpu_s: CPU seconds (user + system, all threads of the process) spent in the
            phase, or None when not measured.
        extra: Further figures (hit rates, bytes, latencies), units in the key name.
    """

    system: str
    phase: str
    rows: int
    seconds: float
    cpu_s: Optional[float] = None
    extra: dict[str, Scalar] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        """Throughput in rows (fio: I/Os) per second."""
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_us_per_row(self) -> Optional[float]:
        """CPU microseconds per row, or None when CPU time was not measured."""
        if self.cpu_s is None or self.rows == 0:
            return None
        return 1e6 * self.cpu_s / self.rows

    def to_dict(self) -> dict[str, Scalar]:
        """A flat JSON-ready dict with the derived rates."""
        d: dict[str, Scalar] = {
            "system": self.system,
            "phase": self.phase,
            "rows": self.rows,
            "seconds": self.seconds,
            "rows_per_s": self.rows_per_s,
            "cpu_s": self.cpu_s,
            "cpu_us_per_row": self.cpu_us_per_row,
        }
        d.update(self.extra)
        return d


CASES: tuple[str, ...] = ("main", "cold_uniform_32k", "all")
"""Values of ``StoreBenchConfig.case``: which parts of the store benchmark run."""


@dataclass(frozen=True)
class StoreBenchConfig:
    """Settings of the store benchmark (``benchmarks/configs/store.yaml`` + CLI flags).

    Attributes:
        rows: Rows of the table.
        dim: Weights per row (float32).
        state_dim: Optimizer-state values per row (float32).
        batch: Rows per batched read / write call.
        batches: Batches of the cold uniform read phase.
        zipf_batches: Batches of the cold Zipf read phase (the steady hit rate is the
            mean over its second half).
        write_batches: Batches of each write phase.
        warm_repeats: How often the last uniform batch is read again (warm phase).
        cache_fraction: DRAM cache (ours) / block cache (RocksDB) size as a share of
            the table bytes.
        dir: Directory for all data files (must be on the filesystem under test).
        queue_depth: I/O queue depth of the store and of fio's random reads.
        io_threads: I/O threads of the store; also RocksDB's reader threads unless
            ``rocksdb_threads`` is set.
        rocksdb_threads: Threads splitting each RocksDB MultiGet batch (None: io_threads).
        io_engine: The store's I/O engine: "auto", "uring" or "threads".
        zipf_alpha: Exponent of the Zipf distribution of the skewed reads.
        seed: Seed of the id generators and row values.
        fio_runtime_s: Seconds each fio job runs.
        fio_size_mb: Size of fio's test file in MiB (>= 1024 recommended).
        memmap_madvise: "random" (MADV_RANDOM: no readahead) or "normal" for memmap.
        case: Which cases run: "main" (the phases above, every system), "cold_uniform_32k"
            (one cold read call of the block store against fio, alternated; see
            ``benchmarks.lib.cold_case``) or "all".
        case_rows: Rows of the cold_uniform_32k table (fully written).
        case_batch: Uniform random ids of its one read call.
        case_repeats: fio / read alternations of the case (its ratio: their median).
        case_fio_runtime_s: Seconds of each of the case's fio runs.
        skip_rocksdb: Do not run the RocksDB baseline.
        skip_fio: Do not run fio.
        skip_memmap: Do not run the memmap baseline.
        skip_ours: Do not run the block store (baselines only).
        keep: Keep data files after the run.
        json_path: Where to write every figure as JSON (None: nowhere).
        quick: Whether the quick overlay of the config was applied.
    """

    rows: int = 2_000_000
    dim: int = 128
    state_dim: int = 1
    batch: int = 65_536
    batches: int = 4
    zipf_batches: int = 8
    write_batches: int = 4
    warm_repeats: int = 5
    cache_fraction: float = 0.05
    dir: Optional[Path] = None
    queue_depth: int = 32
    io_threads: int = 8
    rocksdb_threads: Optional[int] = None
    io_engine: str = "auto"
    zipf_alpha: float = 1.05
    seed: int = 0
    fio_runtime_s: float = 10.0
    fio_size_mb: int = 1024
    memmap_madvise: str = "random"
    case: str = "main"
    case_rows: int = 4_000_000
    case_batch: int = 32_768
    case_repeats: int = 5
    case_fio_runtime_s: float = 2.0
    skip_rocksdb: bool = False
    skip_fio: bool = False
    skip_memmap: bool = False
    skip_ours: bool = False
    keep: bool = False
    json_path: Optional[Path] = None
    quick: bool = False

    def __post_init__(self) -> None:
        positive = ("rows", "dim", "batch", "batches", "zipf_batches", "write_batches",
                    "queue_depth", "io_threads", "fio_size_mb", "case_rows", "case_batch",
                    "case_repeats")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.state_dim < 0:
            raise ValueError(f"state_dim must be >= 0, got {self.state_dim!r}")
        if self.warm_repeats < 0:
            raise ValueError(f"warm_repeats must be >= 0, got {self.warm_repeats!r}")
        if self.batch > self.rows:
            raise ValueError(f"batch ({self.batch}) must be <= rows ({self.rows})")
        if not 0.0 < self.cache_fraction <= 1.0:
            raise ValueError(f"cache_fraction must be in (0, 1], got {self.cache_fraction!r}")
        if self.zipf_alpha <= 0:
            raise ValueError(f"zipf_alpha must be > 0, got {self.zipf_alpha!r}")
        if self.fio_runtime_s <= 0:
            raise ValueError(f"fio_runtime_s must be > 0, got {self.fio_runtime_s!r}")
        if self.case not in CASES:
            raise ValueError(f"case must be one of {'|'.join(CASES)}, got {self.case!r}")
        if self.case_batch > self.case_rows:
            raise ValueError(f"case_batch ({self.case_batch}) must be <= case_rows ({self.case_rows})")
        if self.case_fio_runtime_s <= 0:
            raise ValueError(f"case_fio_runtime_s must be > 0, got {self.case_fio_runtime_s!r}")
        if self.io_engine not in ("auto", "uring", "threads"):
            raise ValueError(f"io_engine must be auto|uring|threads, got {self.io_engine!r}")
        if self.memmap_madvise not in ("random", "normal"):
            raise ValueError(f"memmap_madvise must be random|normal, got {self.memmap_madvise!r}")
        if self.rocksdb_threads is not None and self.rocksdb_threads <= 0:
            raise ValueError(f"rocksdb_threads must be > 0, got {self.rocksdb_threads!r}")

    @property
    def row_width(self) -> int:
        """Values per row: dim + state_dim."""
        return self.dim + self.state_dim

    @property
    def row_bytes(self) -> int:
        """Bytes per row (float32)."""
        return self.row_width * FLOAT32_BYTES

    @property
    def table_bytes(self) -> int:
        """Bytes of all rows."""
        return self.rows * self.row_bytes

    @property
    def cache_mb(self) -> float:
        """DRAM cache / block cache size in MiB (cache_fraction of the table)."""
        return self.table_bytes * self.cache_fraction / MIB

    @property
    def reader_threads(self) -> int:
        """Threads of RocksDB's MultiGet split."""
        return self.rocksdb_threads if self.rocksdb_threads is not None else self.io_threads

    def to_dict(self) -> dict[str, Scalar]:
        """JSON-ready settings."""
        d = dataclasses.asdict(self)
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}


CACHE_POLICIES = ("lru", "lfu", "tinylfu")
"""Replacement policies of TieredEmbeddingBags' row cache."""


@dataclass(frozen=True)
class KernelBenchConfig:
    """Settings of the kernel benchmark (``benchmarks/configs/kernel.yaml`` + CLI flags).

    The workload is one table of ``rows`` x ``dim`` fp32 trained with FBGEMM's fused
    EXACT_ROWWISE_ADAGRAD: each step is ``batch`` bags of ``pooling`` ids drawn from a Zipf
    distribution over shuffled ids (forward, ``sum().backward()``).

    Attributes:
        rows: Rows of the table.
        dim: Weights per row (fp32; multiple of 4).
        batch: Bags per step.
        pooling: Ids per bag (fixed pooling factor).
        zipf_alpha: Zipf exponent of the main workload (SCM and SSD runs).
        high_locality_alpha: Zipf exponent of the high-locality SSD run.
        cache_load_factor: Row-cache size as a share of the table's rows.
        cache_algorithm: Policy of the throughput runs ("lru", "lfu" or "tinylfu").
        policies: Policies whose hit rates are reported next to Belady's (each one not
            used by the throughput runs gets a run of its own on the SCM tier). The policy
            comparison (cache-index replay) runs every policy of ``CACHE_POLICIES``.
        drift: Share of the Zipf ranks that move to a fresh id per step in the drifting
            trace of the policy comparison, in (0, 1).
        learning_rate: Learning rate of both FBGEMM and TieredEmbeddingBags.
        warmup_steps: Steps before the first measured block (fill the cache and
            reach steady state: evictions and write-backs every step).
        high_locality_warmup_steps: The same for the high-locality table, whose few
            misses a step fill the cache more slowly.
        blocks: Measured blocks per system; the baseline and ours alternate.
        block_steps: Steps per measured block.
        fill_chunk_rows: Rows per ``set_rows`` call when writing a whole table first.
        fill_scm: Write every row of the SCM table before measuring (else rows never
            written are computed by the store's lazy initialiser).
        sequence: Unpooled lookups (``PoolingMode.NONE``, TorchRec's EmbeddingCollection:
            a row per id out, a sequence of ``pooling`` ids a sample) on both systems.
        dir: Directory for the table files and fio's file (on the device under test).
        seed: Seed of the ids and the initial row values.
        fio_runtime_s: Seconds each fio job runs.
        fio_size_mb: Size of fio's test file in MiB.
        skip_fio, skip_scm, skip_ssd, skip_high_locality, skip_policies, skip_belady:
            Leave that part out.
        policies_only: Run only the policy comparison (no fio, no TBE runs).
        keep: Keep data files after the run.
        json_path: Where to write every figure as JSON (None: nowhere).
        quick: Whether the quick overlay of the config was applied.
    """

    rows: int = 4_000_000
    dim: int = 128
    batch: int = 8192
    pooling: int = 20
    zipf_alpha: float = 1.05
    high_locality_alpha: float = 1.3
    cache_load_factor: float = 0.1
    cache_algorithm: str = "lru"
    policies: tuple[str, ...] = CACHE_POLICIES
    drift: float = 0.02
    learning_rate: float = 0.01
    warmup_steps: int = 40
    high_locality_warmup_steps: int = 160
    blocks: int = 8
    block_steps: int = 8
    fill_chunk_rows: int = 262_144
    fill_scm: bool = True
    sequence: bool = False
    dir: Optional[Path] = None
    seed: int = 0
    fio_runtime_s: float = 5.0
    fio_size_mb: int = 1024
    skip_fio: bool = False
    skip_scm: bool = False
    skip_ssd: bool = False
    skip_high_locality: bool = False
    skip_policies: bool = False
    skip_belady: bool = False
    policies_only: bool = False
    keep: bool = False
    json_path: Optional[Path] = None
    quick: bool = False

    def __post_init__(self) -> None:
        for name in ("rows", "dim", "batch", "pooling", "blocks", "block_steps", "fill_chunk_rows",
                     "fio_size_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dim % 4:
            raise ValueError(f"dim must be a multiple of 4 (FBGEMM), got {self.dim!r}")
        for name in ("warmup_steps", "high_locality_warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("zipf_alpha", "high_locality_alpha", "learning_rate", "fio_runtime_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        if isinstance(self.drift, bool) or not isinstance(self.drift, (int, float)) or not 0.0 < self.drift < 1.0:
            raise ValueError(f"drift must be a number in (0, 1), got {self.drift!r}")
        if not isinstance(self.cache_load_factor, (int, float)) or not 0.0 < self.cache_load_factor <= 1.0:
            raise ValueError(f"cache_load_factor must be in (0, 1], got {self.cache_load_factor!r}")
        if self.cache_algorithm not in CACHE_POLICIES:
            raise ValueError(f"cache_algorithm must be one of {CACHE_POLICIES}, got {self.cache_algorithm!r}")
        if self.policies_only and self.skip_policies:
            raise ValueError("policies_only and skip_policies exclude each other")
        policies = _as_policies(self.policies)
        object.__setattr__(self, "policies", policies)

    @property
    def lookups_per_step(self) -> int:
        """Ids per step: batch x pooling."""
        return self.batch * self.pooling

    @property
    def row_bytes(self) -> int:
        """Bytes per row on the tier: fp32 weights + one fp32 row-wise Adagrad state."""
        return (self.dim + 1) * FLOAT32_BYTES

    @property
    def table_bytes(self) -> int:
        """Bytes of one copy of the table's weights (fp32, FBGEMM's layout)."""
        return self.rows * self.dim * FLOAT32_BYTES

    def to_dict(self) -> dict[str, Scalar]:
        """JSON-ready settings."""
        d = dataclasses.asdict(self)
        return {k: (str(v) if isinstance(v, Path) else ",".join(v) if isinstance(v, tuple) else v)
                for k, v in d.items()}


def _as_policies(value: Any) -> tuple[str, ...]:
    """Policies from a tuple, a YAML list or a comma-separated string."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = []
    if not items:
        raise ValueError(f"policies must be a non-empty list from {CACHE_POLICIES}, got {value!r}")
    out = tuple(str(p).strip() for p in items)
    bad = [p for p in out if p not in CACHE_POLICIES]
    if bad or len(set(out)) != len(out):
        raise ValueError(f"policies must be distinct values from {CACHE_POLICIES}, got {value!r}")
    return out
