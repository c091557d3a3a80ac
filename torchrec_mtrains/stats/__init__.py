"""Trace analysis: per-table lookups, unique rows, pooling factor, reuse histogram, and LRU /
LFU hit-rate (miss-ratio) curves over cache size; TorchRec ``CacheStatistics`` from them;
trace sources (KJT iterators, dlrm_datasets files) and a calibrated trace generator."""

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
from torchrec_mtrains.stats.reuse import fit_zipf_alpha, reuse_histogram
from torchrec_mtrains.stats.stack_distance import shards_mask, stack_distances
from torchrec_mtrains.stats.synthetic import DLRM_DATASETS_REUSE, SyntheticTable, generate_dlrm_batch
from torchrec_mtrains.stats.types import (
    REUSE_BIN_EDGES,
    HitRateCurve,
    ReuseHistogram,
    TableStats,
    TableTrace,
    Trace,
)

__all__ = [
    "DLRM_DATASETS_REUSE",
    "REUSE_BIN_EDGES",
    "CurveCacheStatistics",
    "DlrmBatch",
    "HitRateCurve",
    "ReuseHistogram",
    "SyntheticTable",
    "TableStats",
    "TableTrace",
    "Trace",
    "analyze_table",
    "analyze_trace",
    "check_dlrm_batch",
    "fit_zipf_alpha",
    "generate_dlrm_batch",
    "lfu_curve",
    "load_dlrm_trace",
    "lru_curve",
    "read_dlrm_file",
    "replay_cache_hit_rate",
    "reuse_histogram",
    "shards_mask",
    "stack_distances",
    "step_accesses",
    "trace_from_dlrm_batches",
    "trace_from_kjts",
    "write_dlrm_file",
]
