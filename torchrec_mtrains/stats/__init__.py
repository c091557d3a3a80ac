"""Trace analysis: per-table lookups, unique rows, pooling factor, reuse histograms (share of
unique rows and share of lookups by reuse count), and LRU / LFU hit-rate (miss-ratio) curves
over cache size; distinct ids over windows of steps (a virtual table's live ids); TorchRec
``CacheStatistics`` from them; trace sources (KJT iterators, dlrm_datasets files) and a
calibrated trace generator (with optional drift)."""

from torchrec_mtrains.stats.accesses import step_accesses
from torchrec_mtrains.stats.analyze import analyze_table, analyze_trace
from torchrec_mtrains.stats.cache_statistics import CurveCacheStatistics
from torchrec_mtrains.stats.curves import lfu_curve, lru_curve
from torchrec_mtrains.stats.dlrm_trace import (
    DlrmBatch,
    check_dlrm_batch,
    load_dlrm_trace,
    read_dlrm_file,
    trace_from_dlrm_batches,
    write_dlrm_file,
)
from torchrec_mtrains.stats.kjt_source import trace_from_kjts
from torchrec_mtrains.stats.replay import replay_cache_hit_rate
from torchrec_mtrains.stats.reuse import (
    bin_edges_for,
    bin_mean_reuse,
    check_reuse_shares,
    fit_zipf_alpha,
    lookups_per_unique_row,
    reuse_histogram,
    rows_per_bin,
)
from torchrec_mtrains.stats.stack_distance import shards_mask, stack_distances
from torchrec_mtrains.stats.synthetic import (
    DLRM_DATASETS_LOOKUP_SHARES,
    DLRM_DATASETS_REUSE,
    DLRM_DATASETS_ROW_SHARES,
    SyntheticTable,
    drifted_ids,
    drifted_positions,
    generate_dlrm_batch,
)
from torchrec_mtrains.stats.types import (
    REUSE_BIN_EDGES,
    REUSE_BIN_EDGES_16,
    HitRateCurve,
    ReuseHistogram,
    TableStats,
    TableTrace,
    Trace,
)
from torchrec_mtrains.stats.windows import distinct_ids_in_windows

# What a user imports from here (pinned by tests/package/test_package.py). The reuse-bin
# arithmetic, the dlrm_datasets file format, stack distances, replay and distinct ids over
# windows stay importable from here and from their modules.
__all__ = [
    "DLRM_DATASETS_LOOKUP_SHARES",
    "DLRM_DATASETS_ROW_SHARES",
    "CurveCacheStatistics",
    "HitRateCurve",
    "ReuseHistogram",
    "SyntheticTable",
    "TableStats",
    "TableTrace",
    "Trace",
    "analyze_table",
    "analyze_trace",
    "generate_dlrm_batch",
    "lfu_curve",
    "load_dlrm_trace",
    "lru_curve",
    "reuse_histogram",
    "trace_from_dlrm_batches",
    "trace_from_kjts",
]
