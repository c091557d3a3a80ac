"""MODEL.yaml: the model a plan is for (batch, target QPS, precision, optimizer, tables with
their locality), read into ``ModelSpec`` with every field checked by name."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml

from torchrec_mtrains.layout import PRECISIONS
from torchrec_mtrains.planner.hardware.units import parse_quantity
from torchrec_mtrains.types import Tier
from torchrec_mtrains.planner.model.locality import (
    LocalityCurve,
    histogram_locality,
    zipf_locality,
)
from torchrec_mtrains.planner.model.optimizers import canonical_optimizer, optimizer_row_bytes

if TYPE_CHECKING:
    from torchrec_mtrains.stats.types import TableTrace

__all__ = ["LAZY_TIERS", "DenseSpec", "ModelSpec", "ModelTable", "dense_spec_of", "load_model_spec",
           "load_table_trace", "parse_model_spec"]

_TOP_KEYS = {"batch_size", "target_qps", "dtype", "optimizer", "tables", "dense_layers", "input_time_per_sample"}
_TABLE_KEYS = {"name", "num_embeddings", "embedding_dim", "pooling_factor", "zipf_alpha", "reuse_histogram",
               "reuse_trace_steps", "trace", "trace_table", "count", "rows_written", "run_steps", "drift", "sequence"}
_LOCALITY_KEYS = ("zipf_alpha", "reuse_histogram", "trace")
# Tiers whose stores take space only for rows written (the block store's sparse log); the
# SCM store reserves its whole file at creation.
LAZY_TIERS = frozenset({Tier.SSD})
_DTYPES = PRECISIONS
# libyaml's safe loader where PyYAML has it: 7x faster on a 1,000-table spec, same documents.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclasses.dataclass(frozen=True)
class ModelTable:
    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float
    row_bytes: int  # weights + optimizer state as stored
    locality: LocalityCurve
    # Distinct rows the job writes (None: all). A tier that initialises rows lazily (SSD)
    # holds only these; the others hold the whole table.
    rows_written: Optional[int] = None
    # The steps of the run ``rows_written`` is for: its rows' first touches, which read
    # nothing from a lazy tier, are spread over them (None: not known, every miss a read).
    run_steps: Optional[int] = None
    # Set by a ParameterConstraints (the StorageAwarePlanner's): the tier placement must
    # keep the table on (its backing tier, or the compute tier for the table whole), and
    # its cache rows (None: placement sizes the cache).
    pinned_tier: Optional[Tier] = None
    pinned_cache_rows: Optional[float] = None
    # A virtual table (ids are keys): ``num_embeddings`` is then the live ids it holds, and
    # its id index takes ``index_bytes_per_row`` of host DRAM per live id on any tier.
    virtual: bool = False
    index_bytes_per_row: float = 0.0
    # A table of an EmbeddingCollection (a row per id out, not one per bag): its output is
    # ``pooling_factor`` rows a sample, the sequence's length.
    sequence: bool = False

    @property
    def bytes(self) -> float:
        return float(self.num_embeddings) * self.row_bytes

    def bytes_on(self, tier: Tier) -> float:
        """Bytes the table takes on ``tier`` as its backing store."""
        if tier in LAZY_TIERS and self.rows_written is not None:
            return float(min(self.rows_written, self.num_embeddings)) * self.row_bytes
        return self.bytes

    def first_touches_per_step(self, tier: Tier) -> float:
        """Rows a step touches for the first time in the run, on average: on a lazy tier
        they are initialised in place, not read. 0 where the run is not known."""
        if tier not in LAZY_TIERS or self.rows_written is None or not self.run_steps:
            return 0.0
        return min(self.rows_written, self.num_embeddings) / self.run_steps

    @property
    def lookups_per_sample(self) -> float:
        return self.pooling_factor


@dataclasses.dataclass(frozen=True)
class DenseSpec:
    """The dense part of a model as the perf model costs it: its matrix products.

    Attributes:
        macs_per_sample: multiply-accumulates of the forward pass per sample (a layer of
            ``n_in`` x ``n_out`` weights: ``n_in * n_out``).
        outputs_per_sample: values the layers output per sample (their elementwise work).
        layers: weight matrices (each costs a fixed amount per step).
    """

    macs_per_sample: float
    outputs_per_sample: float
    layers: int

    @classmethod
    def of_shapes(cls, shapes: Sequence[Tuple[int, int]]) -> "DenseSpec":
        """From the ``(n_in, n_out)`` of each weight matrix."""
        return cls(float(sum(i * o for i, o in shapes)), float(sum(o for _, o in shapes)), len(shapes))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    batch_size: int  # global, per step
    target_qps: Optional[float]  # None (planner use only): no target
    dtype: str
    optimizer: str
    tables: Tuple[ModelTable, ...]
    dense: Optional[DenseSpec] = None  # None: costed at the profile's dense_time_per_sample
    # Seconds a rank's input pipeline (reading or generating batches, on the rank's cores)
    # spends per sample; 0: free, or off the training cores.
    input_s_per_sample: float = 0.0

    @property
    def embedding_bytes(self) -> float:
        return sum(t.bytes for t in self.tables)


_INT64_MAX = 2**63 - 1


def _number(where: str, value: Any, integer: bool = False, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ValueError(f"{where}={value!r} must be {'an integer' if integer else 'a number'}")
    # Python ints are exact at any size (np.isfinite refuses those beyond 64 bits).
    if (isinstance(value, float) and not math.isfinite(value)) or (positive and value <= 0) or value < 0:
        raise ValueError(f"{where}={value!r} must be {'> 0' if positive else '>= 0'}")
    if integer and value > _INT64_MAX:  # ids, rows and batches are int64 in TorchRec and FBGEMM
        raise ValueError(f"{where}={value!r} must be < 2^63")
    return value


def row_bytes(dim: int, dtype: str, optimizer: str) -> int:
    """Bytes of a stored row: ``dim`` weights in ``dtype`` and ``optimizer``'s state (a
    short name or FBGEMM's EmbOptimType value)."""
    return optimizer_row_bytes(dim, dtype, optimizer)


def load_table_trace(where: str, entry: Mapping[str, Any], batch_size: int, base_dir: str = ".") -> "TableTrace":
    """The trace a table entry's ``trace`` names, in steps of ``batch_size`` samples.

    ``trace`` is a dlrm_datasets file (a path, relative to ``base_dir``) whose table
    ``trace_table`` (default 0) is read, or a ``TableTrace`` already read (the
    StorageAwarePlanner reads a virtual table's once, to size it and for its curve), taken
    as it is.

    Raises:
        ValueError: naming ``where``: a bad ``trace`` or ``trace_table``, or an unreadable file.
    """
    from torchrec_mtrains.stats import TableTrace, load_dlrm_trace

    path = entry["trace"]
    if isinstance(path, TableTrace):
        if "trace_table" in entry:
            raise ValueError(f"{where}.trace_table applies to a trace file, not to a TableTrace")
        return path
    if not isinstance(path, str):
        raise ValueError(f"{where}.trace={path!r} must be a file path")
    table = int(_number(f"{where}.trace_table", entry.get("trace_table", 0), integer=True, positive=False))
    path = path if os.path.isabs(path) else os.path.join(base_dir, path)
    try:
        trace = load_dlrm_trace(path, batch_size=batch_size)
    except OSError as e:
        raise ValueError(f"{where}.trace: cannot read {path}: {e.strerror or e}") from None
    if table >= len(trace.tables):
        raise ValueError(f"{where}.trace_table={table} is outside the {len(trace.tables)} tables of {path}")
    return list(trace.tables.values())[table]


def _trace_locality(trace: "TableTrace", num_rows: int) -> Tuple[LocalityCurve, float]:
    """The locality curve (cache sizes up to ``num_rows``) and pooling factor measured on ``trace``."""
    from torchrec_mtrains.stats import analyze_table

    stats = analyze_table("trace", trace)
    sizes = np.unique(np.geomspace(1, num_rows, 64).round())
    lru = np.maximum.accumulate(stats.lru.hit_rate(sizes))
    lfu = np.maximum.accumulate(stats.lfu.hit_rate(sizes))
    return LocalityCurve(stats.unique_rows_per_step, sizes, lru, lfu), stats.pooling_factor


def _table(where: str, entry: Any, batch_size: int, dtype: str, optimizer: str, base_dir: str) -> List[ModelTable]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - _TABLE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(_TABLE_KEYS)})")
    for key in ("name", "num_embeddings", "embedding_dim"):
        if key not in entry:
            raise ValueError(f"{where}.{key} is missing")
    name = entry["name"]
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name={name!r} must be a non-empty string")
    rows = int(_number(f"{where}.num_embeddings", entry["num_embeddings"], integer=True))
    dim = int(_number(f"{where}.embedding_dim", entry["embedding_dim"], integer=True))
    if dim % 4:
        raise ValueError(f"{where}.embedding_dim={dim} must be a multiple of 4 (FBGEMM)")
    count = int(_number(f"{where}.count", entry.get("count", 1), integer=True))
    given = [k for k in _LOCALITY_KEYS if k in entry]
    if len(given) != 1:
        raise ValueError(f"{where}: give exactly one of {list(_LOCALITY_KEYS)}, got {given or 'none'}")
    pooling = entry.get("pooling_factor")
    if given[0] == "trace":
        curve, measured_pf = _trace_locality(load_table_trace(where, entry, batch_size, base_dir), rows)
        pooling = measured_pf if pooling is None else pooling
    if pooling is None:
        raise ValueError(f"{where}.pooling_factor is missing")
    pooling = float(_number(f"{where}.pooling_factor", pooling))
    lookups = batch_size * pooling
    if "drift" in entry and given[0] != "reuse_histogram":
        raise ValueError(f"{where}.drift applies to reuse_histogram tables (a Zipf law or a trace has no drift)")
    if given[0] == "zipf_alpha":
        alpha = float(_number(f"{where}.zipf_alpha", entry["zipf_alpha"], positive=False))
        curve = zipf_locality(rows, lookups, alpha)
    elif given[0] == "reuse_histogram":
        from torchrec_mtrains.stats import check_reuse_shares

        shares = entry["reuse_histogram"]  # share of lookups by the reuse bin of their row
        if (not isinstance(shares, Sequence) or isinstance(shares, str)
                or any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in shares)):
            raise ValueError(f"{where}.reuse_histogram must be a list of numbers, got {shares!r}")
        check_reuse_shares(shares, f"{where}.reuse_histogram")
        steps = _number(f"{where}.reuse_trace_steps", entry.get("reuse_trace_steps", 1000))
        drift = float(_number(f"{where}.drift", entry.get("drift", 0.0), positive=False))
        if drift >= 1:
            raise ValueError(f"{where}.drift={drift!r} must be in [0, 1)")
        curve = histogram_locality(rows, lookups, tuple(float(s) for s in shares), float(steps), drift=drift)
    written = entry.get("rows_written")
    if written is not None:
        written = int(_number(f"{where}.rows_written", written, integer=True))
    run_steps = entry.get("run_steps")
    if run_steps is not None:
        if written is None:
            raise ValueError(f"{where}.run_steps needs rows_written (the rows the run of those steps writes)")
        run_steps = int(_number(f"{where}.run_steps", run_steps, integer=True))
    sequence = entry.get("sequence", False)
    if not isinstance(sequence, bool):
        raise ValueError(f"{where}.sequence={sequence!r} must be true or false")
    rb = row_bytes(dim, dtype, optimizer)
    names = [name] if count == 1 else [f"{name}_{i}" for i in range(count)]
    return [ModelTable(n, rows, dim, pooling, rb, curve, written, run_steps, sequence=sequence) for n in names]


def parse_model_spec(doc: Any, base_dir: str = ".") -> ModelSpec:
    if not isinstance(doc, Mapping):
        raise ValueError("the model spec must be a YAML mapping")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"unknown keys {unknown} (known: {sorted(_TOP_KEYS)})")
    for key in ("batch_size", "target_qps", "tables"):
        if key not in doc:
            raise ValueError(f"{key} is missing")
    batch = int(_number("batch_size", doc["batch_size"], integer=True))
    qps = float(_number("target_qps", doc["target_qps"]))
    dtype = doc.get("dtype", "fp32")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {sorted(_DTYPES)}")
    optimizer = doc.get("optimizer", "rowwise_adagrad")
    canonical_optimizer(optimizer)  # a short name or FBGEMM's EmbOptimType value; else the list of both
    entries = doc["tables"]
    if not isinstance(entries, list) or not entries:
        raise ValueError("tables must be a non-empty list")
    tables: List[ModelTable] = []
    for i, entry in enumerate(entries):
        tables += _table(f"tables[{i}]", entry, batch, dtype, optimizer, base_dir)
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"tables: duplicate names {dup[:5]}")
    dense = _dense_layers(doc["dense_layers"]) if "dense_layers" in doc else None
    input_s = (parse_quantity(doc["input_time_per_sample"], "time", "input_time_per_sample")
               if "input_time_per_sample" in doc else 0.0)
    return ModelSpec(batch, qps, dtype, optimizer, tuple(tables), dense, input_s)


def _dense_layers(doc: Any) -> DenseSpec:
    """MODEL.yaml's ``dense_layers``: the model's MLPs, each a list of layer widths from its
    input to its output, e.g. ``[[13, 512, 256, 64], [415, 512, 512, 256, 1]]``."""
    if not isinstance(doc, list) or not doc:
        raise ValueError(f"dense_layers={doc!r} must be a non-empty list of MLPs (lists of layer widths)")
    shapes: List[Tuple[int, int]] = []
    for i, mlp in enumerate(doc):
        if not isinstance(mlp, list) or len(mlp) < 2:
            raise ValueError(f"dense_layers[{i}]={mlp!r} must list at least an input and an output width")
        widths = [int(_number(f"dense_layers[{i}][{j}]", w, integer=True)) for j, w in enumerate(mlp)]
        shapes += list(zip(widths, widths[1:]))
    return DenseSpec.of_shapes(shapes)


def dense_spec_of(module: Any, skip: Sequence[Any] = ()) -> Optional[DenseSpec]:
    """The dense part of a torch module: every 2-D weight outside the ``skip`` modules
    (the embedding tables) is one matrix product per sample (``nn.Linear`` layers, low-rank
    cross layers); None if it has none."""
    skipped = {id(p) for m in skip for p in m.parameters()}
    shapes = [(int(p.shape[1]), int(p.shape[0])) for p in module.parameters()
              if p.dim() == 2 and id(p) not in skipped]
    return DenseSpec.of_shapes(shapes) if shapes else None


def load_model_spec(path: str) -> ModelSpec:
    try:
        with open(path) as f:
            doc = yaml.load(f, Loader=_YAML_LOADER)
    except OSError as e:
        raise ValueError(f"cannot read model spec {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"model spec {path} is not valid YAML: {e}") from None
    try:
        return parse_model_spec(doc, os.path.dirname(os.path.abspath(path)))
    except ValueError as e:
        raise ValueError(f"model spec {path}: {e}") from None
