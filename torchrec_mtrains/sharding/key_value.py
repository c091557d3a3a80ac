"""KEY_VALUE plan entries: TorchRec's vocabulary for an SSD table, trained on the tiered kernel.

TorchRec plans an SSD-offloaded table as ``compute_kernel="key_value"`` with
``KeyValueParams`` (where and how FBGEMM's RocksDB TBE keeps it) and ``CacheParams`` (its
row cache). On the CPU this plugin runs such a table on the block store (``Tier.SSD``)
behind the tiered kernel's row cache: ``as_tiered_plan`` turns each KEY_VALUE entry of a
module's plan into a ``TieredParameterSharding`` (CUSTOMIZED_KERNEL) before TorchRec shards
the module, so the tables then take the tiered path unchanged.

Every field of the two dataclasses is honoured, ignored with one warning naming it, or
refused with a ValueError when ignoring it would change what training computes: the
registries below say which (docs/sharding.md has the mapping).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import CacheParams, KeyValueParams, ParameterSharding
from torchrec.modules.embedding_configs import DataType

from torchrec_mtrains.sharding.types import TieredParameterSharding, TieredParams
from torchrec_mtrains.sharding.virtual_tables import DRAM_SSD_CACHE_GB, VIRTUAL_KERNELS, virtual_kernel_entries
from torchrec_mtrains.types import Tier

__all__ = ["CACHE_ALGORITHMS", "LOCAL_RANK_TOKEN", "as_tiered_plan", "local_rank", "tiered_params_of"]

_KEY_VALUE = EmbeddingComputeKernel.KEY_VALUE.value
LOCAL_RANK_TOKEN = "@local_rank"
"""Replaced by the rank's local rank in ``ssd_storage_directory``, as FBGEMM does."""
_GB_IN_MB = 1024.0  # KeyValueParams.l2_cache_size is in GB; the block store's cache in MiB

CACHE_ALGORITHMS: Mapping[CacheAlgorithm, str] = {CacheAlgorithm.LRU: "lru", CacheAlgorithm.LFU: "lfu"}
"""FBGEMM's CacheAlgorithm -> the tiered kernel's cache policy."""

# KeyValueParams fields the tiered kernel takes (see tiered_params_of): the directory, the
# block store's DRAM cache, and lazy initialisation (the block store always initialises a
# row on its first read, so there is no bulk pass whose chunks to size).
_KV_HONOURED = frozenset({"ssd_storage_directory", "l2_cache_size", "bulk_init_chunk_size", "lazy_bulk_init_enabled"})
# Fields ignored, with why (one warning per field): the result is the same without them.
_KV_IGNORED: Mapping[str, str] = {
    "ssd_rocksdb_write_buffer_size": "the block store is not RocksDB",
    "ssd_rocksdb_shards": "the block store is not RocksDB",
    "gather_ssd_cache_stats": "the tiered kernel always counts; read its cache_stats()",
    "stats_reporter_config": "the tiered kernel reports through its cache_stats()",
    "use_passed_in_path": "table files always go under ssd_storage_directory",
    "max_l1_cache_size": "the row cache is sized by CacheParams.load_factor",
    "enable_async_update": "the block store's DRAM cache is written through in step",
    "enable_raw_embedding_streaming": "there is no embedding streaming on the CPU",
    "res_store_shards": "there is no embedding streaming on the CPU",
}
# Fields refused, with why: ignoring them would change what the job computes or loads.
_KV_REFUSED: Mapping[str, str] = {
    "kvzch_tbe_config": "zero-collision hashing maps ids to rows differently",
    "load_ckpt_without_opt": "checkpoints here always load the optimizer state",
    "ps_hosts": "the table would live on a parameter server, not on this rank's SSD",
    "ps_client_thread_num": "there is no parameter-server client",
    "ps_max_key_per_request": "there is no parameter-server client",
    "ps_max_local_index_length": "there is no parameter-server client",
}
# CacheParams fields: honoured (algorithm, load_factor), read by planners only (stats), or
# not a setting of a kernel here (prefetch_pipeline: the kernel serves prefetched rows when
# a TieredTrainPipeline prefetches, else fetches in forward); precision is checked apart.
_CACHE_HONOURED = frozenset({"algorithm", "load_factor", "stats", "prefetch_pipeline", "precision"})
_CACHE_IGNORED: Mapping[str, str] = {
    "reserved_memory": "it reserves GPU memory; the row cache is sized by load_factor",
    "multipass_prefetch_config": "the tiered kernel prefetches a batch in one pass",
}


def local_rank() -> int:
    """This process's local rank (TorchRec's ``get_local_rank``; LOCAL_RANK or 0 without a
    process group)."""
    if dist.is_initialized():
        from torchrec.distributed.comm import get_local_rank

        return get_local_rank()
    return int(os.environ.get("LOCAL_RANK", "0"))


def _set_fields(params: Any) -> List[Tuple[str, Any]]:
    """(name, value) of the fields of a dataclass ``params`` changed from their defaults."""
    out = []
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if value is not None and not (f.default is not dataclasses.MISSING and value == f.default):
            out.append((f.name, value))
    return out


def _check_fields(table: str, what: str, params: Any, honoured: frozenset, ignored: Mapping[str, str],
                  refused: Mapping[str, str], notes: Dict[str, Tuple[str, List[str]]]) -> None:
    """Raises for a refused field that is set; adds each ignored one (and any field this
    version does not know) to ``notes``: field -> (why, tables)."""
    for name, value in _set_fields(params):
        if name in honoured:
            continue
        if name in refused:
            raise ValueError(f"table {table}: {what}.{name}={value!r} is not supported on the tiered kernel "
                             f"({refused[name]}); leave it unset")
        why = ignored.get(name, "the tiered kernel has no such setting")
        notes.setdefault(f"{what}.{name}", (why, []))[1].append(table)


def _storage_dir(table: str, kv: Optional[KeyValueParams], rank: int) -> str:
    directory = None if kv is None else kv.ssd_storage_directory
    if not directory:
        raise ValueError(f"table {table}: a key_value table needs KeyValueParams(ssd_storage_directory=...) "
                         "(where its files go; '@local_rank' is replaced by the local rank)")
    return os.fspath(directory).replace(LOCAL_RANK_TOKEN, str(rank))


def _dram_cache_mb(table: str, kv: Optional[KeyValueParams]) -> float:
    gb = None if kv is None else kv.l2_cache_size
    if gb is None:
        return 0.0
    if isinstance(gb, bool) or not isinstance(gb, (int, float)) or gb < 0:
        raise ValueError(f"table {table}: KeyValueParams.l2_cache_size={gb!r} must be a number of GB >= 0")
    return float(gb) * _GB_IN_MB


def _load_factor(table: str, cache: Optional[CacheParams]) -> Optional[float]:
    lf = None if cache is None else cache.load_factor
    if lf is not None and (isinstance(lf, bool) or not isinstance(lf, (int, float)) or not lf > 0):
        raise ValueError(f"table {table}: CacheParams.load_factor={lf!r} must be a number > 0")
    return lf


def _cache_algorithm(table: str, cache: Optional[CacheParams]) -> str:
    algorithm = None if cache is None else cache.algorithm
    if algorithm is None:
        return "lru"  # FBGEMM's default
    if algorithm not in CACHE_ALGORITHMS:
        raise ValueError(f"table {table}: CacheParams.algorithm={algorithm!r} must be one of "
                         f"{[a.name for a in CACHE_ALGORITHMS]}")
    return CACHE_ALGORITHMS[algorithm]


def _check_precision(table: str, cache: Optional[CacheParams], data_type: DataType) -> None:
    precision = None if cache is None else cache.precision
    if precision is not None and precision != data_type:
        raise ValueError(f"table {table}: CacheParams.precision={precision} differs from the table's data type "
                         f"{data_type}: the tiered kernel caches rows in the table's precision (leave it unset)")


def tiered_params_of(table: str, ps: ParameterSharding, data_type: DataType, rank: int,
                     notes: Optional[Dict[str, Tuple[str, List[str]]]] = None,
                     tier: Tier = Tier.SSD, dram_cache_gb: float = 0.0) -> TieredParams:
    """The tier settings of a KEY_VALUE table (Tier.SSD) -- or of a virtual table on
    ``tier`` -- from its plan entry.

    Args:
        table: the table's name (for messages).
        ps: its plan entry, with ``key_value_params`` and ``cache_params``.
        data_type: the table's data type (``CacheParams.precision`` must match it).
        rank: the local rank that replaces ``@local_rank`` in ``ssd_storage_directory``.
        notes: collects the fields ignored (field -> (why, tables)), for one warning each.
        tier: where the rows live (Tier.DRAM needs no ``ssd_storage_directory``).
        dram_cache_gb: the block store's DRAM cache when ``l2_cache_size`` is unset.

    Raises:
        ValueError: no ``ssd_storage_directory`` (SSD), a bad value, or a field whose
            ignoring would change results (naming it).
    """
    kv, cache = ps.key_value_params, ps.cache_params
    notes = {} if notes is None else notes
    if kv is not None:
        _check_fields(table, "KeyValueParams", kv, _KV_HONOURED, _KV_IGNORED, _KV_REFUSED, notes)
        if kv.lazy_bulk_init_enabled is False:
            notes.setdefault("KeyValueParams.lazy_bulk_init_enabled",
                             ("the block store always initialises rows lazily, on first read", []))[1].append(table)
    if cache is not None:
        _check_fields(table, "CacheParams", cache, _CACHE_HONOURED, _CACHE_IGNORED, {}, notes)
        _check_precision(table, cache, data_type)
    on_ssd = tier is Tier.SSD
    dram_mb = _dram_cache_mb(table, kv) if kv is not None and kv.l2_cache_size is not None else dram_cache_gb * _GB_IN_MB
    settings = dict(cache_load_factor=_load_factor(table, cache),
                    cache_algorithm=_cache_algorithm(table, cache),
                    storage_dir=_storage_dir(table, kv, rank) if on_ssd else None,
                    ssd_dram_cache_mb=dram_mb if on_ssd else 0.0)
    try:
        return TieredParams(tier, **settings)
    except ValueError as e:
        raise ValueError(f"table {table}: {e}") from None


def as_tiered_plan(params: Mapping[str, ParameterSharding], data_types: Mapping[str, DataType],
                   rank: Optional[int] = None, virtual: Optional[Mapping[str, bool]] = None
                   ) -> Dict[str, ParameterSharding]:
    """A module's plan with each KEY_VALUE entry replaced by a ``TieredParameterSharding``
    of the table on Tier.SSD, and each virtual-table entry (``virtual_tables.py``) by one
    on its kernel's tier (the other entries as they are); warns once per ignored field.

    Args:
        params: table name -> plan entry (a module's sharding plan).
        data_types: table name -> its data type.
        rank: the local rank for ``@local_rank`` (default: this process's).
        virtual: table name -> its config's ``use_virtual_table`` (a virtual-table kernel
            needs it set).

    Raises:
        ValueError: see ``tiered_params_of``; a virtual-table kernel for a table whose
            config is not virtual.
    """
    out: Dict[str, ParameterSharding] = dict(params)
    notes: Dict[str, Tuple[str, List[str]]] = {}
    kv_tables = [name for name, ps in params.items() if ps.compute_kernel == _KEY_VALUE]
    kv_tables += virtual_kernel_entries(params)
    if not kv_tables:
        return out
    rank = local_rank() if rank is None else rank
    for name in kv_tables:
        ps = params[name]
        kernel = ps.compute_kernel
        if kernel == _KEY_VALUE:
            tiered = tiered_params_of(name, ps, data_types[name], rank, notes)
        else:
            if not (virtual or {}).get(name, False):
                raise ValueError(f"table {name}: compute kernel {kernel} needs a virtual table: set "
                                 "use_virtual_table=True (and total_num_buckets) in its config")
            gb = DRAM_SSD_CACHE_GB if kernel == EmbeddingComputeKernel.DRAM_SSD_VIRTUAL_TABLE.value else 0.0
            tiered = tiered_params_of(name, ps, data_types[name], rank, notes, VIRTUAL_KERNELS[kernel], gb)
        fields = {f.name: getattr(ps, f.name) for f in dataclasses.fields(ParameterSharding)}
        # TieredParams carries the cache and store settings now; TorchRec would otherwise
        # add its own cache keys to the table's fused_params.
        fields.update(compute_kernel=EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value, cache_params=None,
                      key_value_params=None)
        out[name] = TieredParameterSharding(**fields, tiered=tiered)
    for field, (why, tables) in sorted(notes.items()):
        warnings.warn(f"{field} is ignored for key_value tables {', '.join(tables)} on the tiered kernel: {why}",
                      stacklevel=3)
    return out
