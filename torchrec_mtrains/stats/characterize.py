"""Per-table statistics of dlrm_datasets trace files, as ``mtrains characterize`` reports them.

For each table: lookups, unique rows, pooling factor, hit rate of an LRU and a (perfect)
LFU cache of 1/5/10/20% of the table, and the bandwidth the table needs at a target QPS:
``lookup`` = every looked-up row gathered (QPS x pooling factor x row bytes), ``tier@10%``
= the misses of a 10% LRU cache read from the table's tier (steps/s x distinct rows per
step x miss rate x row bytes). Row bytes = (dim + 1) x 4: fp32 weights + the rowwise
Adagrad state, as stored. ``reuse`` holds the table's two reuse histograms in
dlrm_datasets' bins: ``share_of_lookups`` (share of lookups by the reuse bin of the row they
go to) and ``share_of_unique_rows`` (share of unique rows by reuse bin; also under its
earlier key ``shares``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from torchrec_mtrains.layout import TableLayout
from torchrec_mtrains.stats.analyze import analyze_table
from torchrec_mtrains.stats.dlrm_trace import DlrmBatch, read_dlrm_file, trace_from_dlrm_batches
from torchrec_mtrains.stats.types import TableStats

__all__ = ["CACHE_SHARES", "TIER_CACHE_SHARE", "characterize", "read_trace_files", "table_report"]

CACHE_SHARES = (0.01, 0.05, 0.10, 0.20)
"""Cache sizes reported, as a share of the table's rows."""
TIER_CACHE_SHARE = 0.10
"""Cache size of the ``tier@10%`` bandwidth column."""


def table_report(s: TableStats, qps: float, batch_size: int, dim: int) -> Dict[str, Any]:
    """One table's row of the report (plain types, JSON-ready).

    Args:
        s: the table's statistics.
        qps: samples per second the model trains at.
        batch_size: samples per step (steps/s = qps / batch_size).
        dim: embedding dimension (rows are fp32 weights + row-wise Adagrad state).
    """
    rows = s.table_rows
    row_bytes = TableLayout(dim, "fp32", "exact_row_wise_adagrad").row_bytes
    hit = {policy: {f"{share:g}": float(curve.hit_rate(share * rows)) for share in CACHE_SHARES}
           for policy, curve in (("lru", s.lru), ("lfu", s.lfu))}
    miss = 1.0 - float(s.lru.hit_rate(TIER_CACHE_SHARE * rows))
    return {
        "table": s.name,
        "rows": rows,
        "rows_known": s.num_rows is not None,
        "steps": s.steps,
        "lookups": s.lookups,
        "unique_rows": s.unique_rows,
        "unique_rows_per_step": s.unique_rows_per_step,
        "pooling_factor": s.pooling_factor,
        "hit_rate": hit,
        "lookup_bytes_per_s": qps * s.pooling_factor * row_bytes,
        "tier_bytes_per_s_at_10pct_lru": qps / batch_size * s.unique_rows_per_step * miss * row_bytes,
        "reuse": {"labels": list(s.reuse.labels()),
                  "share_of_lookups": [float(x) for x in s.reuse.lookup_shares],
                  "share_of_unique_rows": [float(x) for x in s.reuse.row_shares],
                  "shares": [float(x) for x in s.reuse.row_shares]},
        "lru_sample_rate": s.lru.sample_rate,
    }


def read_trace_files(paths: Sequence[Path]) -> List[DlrmBatch]:
    """Reads dlrm_datasets trace files (``torch.save((indices, offsets, lengths))``, .pt or
    .pt.gz), in order.

    Raises:
        ValueError: naming the file: missing, not a torch file, or not a valid trace.
    """
    batches = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        try:
            batches.append(read_dlrm_file(path))
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
        except Exception as e:  # torch.load: pickle, zip or gzip errors of a file that is not a trace
            raise ValueError(f"{path}: not a dlrm_datasets trace file ({type(e).__name__}: {e})") from None
    return batches


def characterize(batches: Sequence[DlrmBatch], batch_size: int, num_rows: Optional[Sequence[int]] = None,
                 tables: Optional[Sequence[int]] = None,
                 sample_rate: Union[float, str] = "auto") -> List[TableStats]:
    """Statistics of the trace's tables.

    Args:
        batches: the trace files' batches, in order.
        batch_size: samples per training step; each batch is cut into such steps.
        num_rows: rows of each table (None: the unique rows seen).
        tables: indices of the tables to analyse (None: all).
        sample_rate: SHARDS sampling rate of the LRU curves in (0, 1], or "auto".
    """
    trace = trace_from_dlrm_batches(batches, batch_size, num_rows=num_rows)
    names = list(trace.tables)
    chosen = range(len(names)) if tables is None else tables
    return [analyze_table(names[t], trace.tables[names[t]], sample_rate=sample_rate) for t in chosen]
