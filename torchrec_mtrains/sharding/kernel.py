"""The TorchRec embedding kernel of tiered tables: TieredEmbeddingBags behind BaseEmbedding.

TorchRec builds one kernel per group of table shards with equal ``fused_params``; this one
turns the group into a ``TieredEmbeddingBags`` (one kernel table per local shard), runs it
on the lookup's KeyedJaggedTensor, prefetches for the train pipeline, and exposes the
fused optimizer's state (read through the tiers on demand) as TorchRec's FUSED kernel does.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import nn
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import (
    GroupedEmbeddingConfig,
    ShardedEmbeddingTable,
)
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import DataType, PoolingType, pooling_type_to_pooling_mode
from torchrec.optim.fused import FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_mtrains.kernels import TieredConfig, TieredEmbeddingBags
from torchrec_mtrains.kernels.tier_stores import ssd_file
from torchrec_mtrains.kernels.virtual_rows import VirtualTableSpec
from torchrec_mtrains.sharding.checkpoint import load_optimizer_state, optimizer_state_of
from torchrec_mtrains.sharding.fused_params import kernel_settings
from torchrec_mtrains.sharding.live_state import LiveStateShards
from torchrec_mtrains.sharding.staging import StagingArea
from torchrec_mtrains.sharding.types import CACHE_LOAD_FACTOR, TieredParams
from torchrec_mtrains.sharding.virtual_tables import eviction_spec_of, virtual_shard_rows, warn_ignored
from torchrec_mtrains.storage.file_lock import FileLock, lock_directory
from torchrec_mtrains.types import Tier

__all__ = ["FUSED_DRAWS_MAX_WEIGHTS", "TieredBatchedEmbeddingBag", "TieredFusedOptimizer", "draw_uniform",
           "draws_as_fused", "place_vbe_output", "rank_storage_dir"]

# NONE: the lookups of an EmbeddingCollection (a row per id).
_POOLINGS = (PoolingType.SUM, PoolingType.MEAN, PoolingType.NONE)
_PRECISION = {DataType.FP32: SparseType.FP32, DataType.FP16: SparseType.FP16}
_CHUNK_ROWS = 1 << 16  # rows per read or write when streaming a shard


# A tiered table of at most this many weights (rows x dim) takes from torch's global
# generator the numbers a FUSED table takes at sharding (draws_as_fused); a larger one takes
# none. About 4 ns a number on the 2-core machine the tests run on: 2^28 weights (1 GiB of
# fp32) cost ~2 s, drawn twice; FBGEMM's FUSED kernel pays the same to hold such a table.
FUSED_DRAWS_MAX_WEIGHTS = 1 << 28


def draws_as_fused(table: Any) -> bool:
    """Whether a tiered table (a TorchRec table config or sharded table) draws what a FUSED
    one draws from torch's global generator at sharding: a table that is not virtual (TorchRec's
    virtual-table kernels draw nothing) of at most ``FUSED_DRAWS_MAX_WEIGHTS`` weights."""
    return (not getattr(table, "use_virtual_table", False)
            and table.num_embeddings * table.embedding_dim <= FUSED_DRAWS_MAX_WEIGHTS)


_DRAW_BLOCK_WEIGHTS = 1 << 22  # weights a block of draw_uniform holds (16 MiB of fp32)


def draw_uniform(rows: int, cols: int, dtype: torch.dtype, lo: float, hi: float) -> None:
    """Takes from torch's global generator what ``torch.empty(rows, cols, dtype=dtype)
    .uniform_(lo, hi)`` takes, and drops it, in blocks of rows (memory: one block). On the
    CPU ``uniform_`` takes one 32-bit number a weight, in order, so the blocks take the same
    numbers as one tensor would."""
    block = max(1, _DRAW_BLOCK_WEIGHTS // max(1, cols))
    for start in range(0, rows, block):
        torch.empty(min(block, rows - start), cols, dtype=dtype).uniform_(lo, hi)


def _draw_as_fused_kernel(tables: List[ShardedEmbeddingTable], dtype: torch.dtype) -> None:
    """Takes from torch's global generator the numbers FBGEMM's FUSED kernel takes when
    TorchRec builds it (``init_parameters``: ``uniform_`` over each local shard, rows x
    cols, in the kernel's order), and drops them: the tiered rows keep their seeded initial
    values, which checkpoints rely on."""
    for table in tables:
        if draws_as_fused(table):
            draw_uniform(table.local_rows, table.local_cols, dtype, table.get_weight_init_min(),
                         table.get_weight_init_max())


def rank_storage_dir(storage_dir: Optional[str], rank: int) -> Optional[str]:
    """The directory of one rank's table files: ranks never share a file."""
    return None if storage_dir is None else os.path.join(storage_dir, f"rank_{rank}")


def shard_offsets(table: ShardedEmbeddingTable) -> List[int]:
    """[row, col] offset of a local shard in its table."""
    return list(table.local_metadata.shard_offsets) if table.local_metadata is not None else [0, 0]


def _shard_name(table: ShardedEmbeddingTable) -> str:
    row, col = shard_offsets(table)
    return f"{table.name}.r{row}.c{col}"


def _shard_cache_rows(params: TieredParams, table: ShardedEmbeddingTable, rows: int) -> int:
    """A shard's cache slots for its ``rows`` kernel rows (a virtual shard's live ids): its
    table's own load factor (each table of a group may have its own, under TorchRec's
    ``cache_load_factor``), else the group's settings."""
    lf = (table.fused_params or {}).get(CACHE_LOAD_FACTOR)
    if lf is None:
        if params.cache_rows is not None:
            return params.shard_cache_rows(table.local_rows, table.num_embeddings)
        return params.shard_cache_rows(rows, rows)
    return max(1, math.ceil(float(lf) * rows))


def _virtual_specs(params: List[TieredParams], tables: List[ShardedEmbeddingTable]
                   ) -> Tuple[List[Optional[VirtualTableSpec]], List[int]]:
    """Each shard's VirtualTableSpec (None unless its table is virtual) and its kernel rows:
    a virtual shard's live ids, else its rows. A virtual shard's ids are local to its rows
    of the table (TorchRec's row-wise input dist), its initial values by global id."""
    specs: List[Optional[VirtualTableSpec]] = []
    rows: List[int] = []
    notes: Dict[str, Tuple[str, List[str]]] = {}
    for p, t in zip(params, tables):
        if not t.use_virtual_table:
            specs.append(None)
            rows.append(t.local_rows)
            continue
        eviction = eviction_spec_of(t.name, t.virtual_table_eviction_policy, notes)
        rows.append(virtual_shard_rows(t.name, p.virtual_rows, eviction, t.local_rows, t.num_embeddings))
        specs.append(VirtualTableSpec(id_space=t.local_rows, id_offset=shard_offsets(t)[0], eviction=eviction))
    warn_ignored(notes)
    return specs, rows


def _rows_written(params: TieredParams, table: ShardedEmbeddingTable, rows: int) -> int:
    if table.use_virtual_table:
        return rows  # its live ids
    if params.rows_written is None:
        return table.local_rows
    return min(table.local_rows, math.ceil(params.rows_written * table.local_rows / table.num_embeddings))


def _check_space(params: List[TieredParams], directory: str, tables: List[ShardedEmbeddingTable],
                 row_bytes: List[int], kernel_rows: List[int]) -> None:
    """A rank's SSD shards must fit the free space of its directory once written: fully, or
    their share of their table's ``rows_written``. The space of a table file already at a
    shard's path counts as free: the new store replaces it, or -- a resume from a checkpoint
    that links it -- adopts it."""
    ssd = [(p, t, b, r) for p, t, b, r in zip(params, tables, row_bytes, kernel_rows) if p.tier is Tier.SSD]
    if not ssd:
        return
    tables = [t for _, t, _, _ in ssd]
    free = shutil.disk_usage(directory).free + sum(_allocated(ssd_file(directory, _shard_name(t)))
                                                   for t in tables)
    need = sum(_rows_written(p, t, r) * b for p, t, b, r in ssd)
    if need > free:
        names = ", ".join(sorted({t.name for t in tables}))
        raise ValueError(
            f"tables {names} on tier SSD need {need / 2**20:,.1f} MiB in {directory}, "
            f"which has {free / 2**20:,.1f} MiB free"
        )


def _allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _kernel_config(params: List[TieredParams], config: GroupedEmbeddingConfig,
                   storage_dir: Optional[str], virtual: List[Optional[VirtualTableSpec]],
                   kernel_rows: List[int], sharding_type: Optional[ShardingType]) -> TieredConfig:
    """The kernel config of a group of local shards: one kernel table per shard on its
    table's tier, named after its table and offsets, in the rank's storage directory. Its
    pooling is what TorchRec's FUSED lookup runs for ``sharding_type``: MEAN bags of a
    row-wise sharding pool as SUM, TorchRec dividing by the bag length after the reduce."""
    tables = list(config.embedding_tables)
    ssd_shards = sum(p.tier is Tier.SSD for p in params)
    return params[0].kernel_config(
        tier=tuple(p.tier for p in params),
        cache_rows=[_shard_cache_rows(p, t, r) for p, t, r in zip(params, tables, kernel_rows)],
        storage_dir=storage_dir,
        pooling_mode=pooling_type_to_pooling_mode(config.pooling, sharding_type),
        weights_precision=_PRECISION[config.data_type],
        init_range=[(t.get_weight_init_min(), t.get_weight_init_max()) for t in tables],
        table_names=[_shard_name(t) for t in tables],
        feature_table_map=[i for i, t in enumerate(tables) for _ in range(t.num_features())],
        ssd_dram_cache_mb=params[0].ssd_dram_cache_mb / max(1, ssd_shards),  # the kernel's, per store
        virtual_tables=virtual,
        prefetch_pipeline=None,  # stage threads where they pay (kernels/stage_threads.py)
        lookahead=max(p.lookahead for p in params),
        # Optimizer, learning rate, eps (FBGEMM's defaults where silent), seed, FBGEMM's TBE settings.
        **kernel_settings(dict(config.fused_params or {}), params[0].cache_algorithm),
    )


def place_vbe_output(out: torch.Tensor, batch_sizes: List[List[int]], dims: List[int], vbe_output: torch.Tensor,
                      vbe_output_offsets: torch.Tensor) -> torch.Tensor:
    """``vbe_output`` with ``out`` (a kernel's VBE output: rank by rank, feature by feature,
    ``batch_sizes[f][r] * dims[f]`` values each) put at ``vbe_output_offsets[r][f]``;
    out of place, so autograd carries the gradients of both."""
    offsets = vbe_output_offsets.tolist()
    ranks = len(batch_sizes[0]) if batch_sizes else 0
    if len(offsets) != ranks or any(len(row) != len(dims) for row in offsets):
        raise ValueError(f"vbe_output_offsets has shape {tuple(vbe_output_offsets.shape)}; expected "
                         f"[{ranks} ranks, {len(dims)} features]")
    positions = [torch.arange(offsets[r][f], offsets[r][f] + batch_sizes[f][r] * dims[f])
                 for r in range(ranks) for f in range(len(dims))]
    index = torch.cat(positions) if positions else torch.empty(0, dtype=torch.long)
    if index.numel() != out.numel() or (index.numel() and int(index.max()) >= vbe_output.numel()):
        raise ValueError(f"vbe_output_offsets place {index.numel()} values in a vbe_output of {vbe_output.numel()}; "
                         f"this kernel's output has {out.numel()}")
    return vbe_output.index_copy(0, index, out.to(vbe_output.dtype))


def _variable_batch_sizes(features: KeyedJaggedTensor) -> Optional[List[List[int]]]:
    """FBGEMM's ``batch_size_per_feature_per_rank`` of a batch with a variable batch per
    feature (VBE), else None."""
    return features.stride_per_key_per_rank() if features.variable_stride_per_key() else None


class TieredBatchedEmbeddingBag(BaseEmbedding, FusedOptimizerModule):
    """A group of tiered table shards computed by one TieredEmbeddingBags."""

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        pg: Optional[dist.ProcessGroup] = None,
        device: Optional[torch.device] = None,
        sharding_type: Optional[ShardingType] = None,
    ) -> None:
        super().__init__()
        if device is not None and device.type not in ("cpu", "meta"):
            raise ValueError(f"tiered tables run on the CPU in this build, got device {device}")
        self._config = config
        self._pg = pg
        fused = dict(config.fused_params or {})
        tables = list(config.embedding_tables)
        names = sorted({t.name for t in tables})
        try:
            # Per table: tier and rows written may differ within a kernel; the rest is the group's.
            self.table_params = [TieredParams.from_fused_params(fused, t.name) for t in tables]
        except ValueError as e:
            raise ValueError(f"tables {', '.join(names)}: {e}") from None
        self.params = self.table_params[0]
        if config.pooling not in _POOLINGS:
            raise ValueError(f"tables {', '.join(names)}: pooling {config.pooling} is not SUM, MEAN or NONE")
        if config.data_type not in _PRECISION:
            raise ValueError(f"tables {', '.join(names)}: data type {config.data_type} is not FP32 or FP16")
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.storage_dir = rank_storage_dir(self.params.storage_dir, self.rank)
        tiers = sorted({p.tier.name for p in self.table_params})
        where = f"tables {', '.join(names)} on tier{'s' if len(tiers) > 1 else ''} {', '.join(tiers)}"
        try:
            self._virtual, self._kernel_rows = _virtual_specs(self.table_params, tables)
            kernel_config = _kernel_config(self.table_params, config, self.storage_dir, self._virtual,
                                           self._kernel_rows, sharding_type)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        # This rank owns its storage directory while a kernel of it lives (the kernels of
        # one process share the lock); another job on it is refused before any file changes.
        self._dir_lock: Optional[FileLock] = None
        if self.storage_dir is not None:
            try:
                os.makedirs(self.storage_dir, exist_ok=True)
            except OSError as e:
                raise ValueError(f"{where}: cannot create {self.storage_dir}: {e.strerror}") from None
            try:
                self._dir_lock = lock_directory(self.storage_dir, "rank storage directory")
            except OSError as e:
                raise OSError(e.errno, f"{where}: {e.strerror or e}") from None
            row_bytes = [kernel_config.layout(t.local_cols).row_bytes for t in tables]
            _check_space(self.table_params, self.storage_dir, tables, row_bytes, self._kernel_rows)
        self._tables = tables
        try:
            self._emb = TieredEmbeddingBags([(r, t.local_cols) for r, t in zip(self._kernel_rows, tables)],
                                            config=kernel_config)
        except (ValueError, OSError) as e:
            raise ValueError(f"{where}: {e}") from None
        self._version = 0  # bumped whenever rows may have changed
        self.state_excluded = False  # the fused optimizer then reports no tiered state
        # The state_dict() copies handed out: their in-place writes reach the tables.
        self._live = LiveStateShards(self._load_shard, [t.name for t in tables])
        self._optim = TieredFusedOptimizer(self, kernel_config.learning_rate)
        _draw_as_fused_kernel(tables, self._emb.weights_dtype)  # torch's generator as after a FUSED kernel

    # ---------------------------------------------------------------- compute ----
    def forward(self, features: KeyedJaggedTensor, vbe_output: Optional[torch.Tensor] = None,
                vbe_output_offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The lookups of ``features`` (pooled, or a row per id), as TorchRec's FUSED kernel
        gives them; with a variable batch per feature (VBE), FBGEMM's 1-D VBE output, or
        ``vbe_output`` with this kernel's part put at ``vbe_output_offsets`` (``[ranks,
        features]``: where each feature's bags from each rank start) when TorchRec's lookup
        merges several kernels' outputs into one."""
        self._live.apply()
        self._version += 1
        if self.training:
            self._live.shards_changed()
        batch_sizes = _variable_batch_sizes(features)
        weights = features.weights_or_none()
        if weights is not None and not torch.is_floating_point(weights):
            weights = None  # as TorchRec's FUSED kernel: integer weights are not per-sample weights
        out = self._emb(features.values(), features.offsets(), weights, batch_size_per_feature_per_rank=batch_sizes)
        if vbe_output is None and vbe_output_offsets is None:
            return out
        if batch_sizes is None or vbe_output is None or vbe_output_offsets is None:
            raise ValueError(f"tables {', '.join(sorted({t.name for t in self._tables}))}: vbe_output and "
                             "vbe_output_offsets go together, with a variable batch per feature")
        return place_vbe_output(out, batch_sizes, self._config.embedding_dims(), vbe_output, vbe_output_offsets)

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Starts loading the rows of ``features`` (the next batch this kernel computes)."""
        self._live.apply()
        batch_sizes = _variable_batch_sizes(features)
        self._emb.prefetch(features.values(), features.offsets(), batch_sizes)

    def flush(self, *, steps_done: bool = False, durable: bool = True) -> None:
        self._live.apply()
        if self.state_excluded:
            # TorchRec's state_dict() flushes every lookup first; a differential checkpoint
            # asks for a state_dict without the tiered rows, having flushed them itself.
            return
        self._emb.flush(steps_done=steps_done, durable=durable)

    def purge(self) -> None:
        pass

    def close(self) -> None:
        self._emb.close()

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    @property
    def emb_module(self) -> TieredEmbeddingBags:
        self._live.apply()  # the caller sees the tables as written through state_dict()
        return self._emb

    @property
    def process_group(self) -> Optional[dist.ProcessGroup]:
        """The group this kernel's tables are sharded over (None: the default group)."""
        return self._pg

    @property
    def fused_optimizer(self) -> "TieredFusedOptimizer":
        return self._optim

    def set_learning_rate(self, lr: float) -> None:
        self._emb.set_learning_rate(lr)

    def set_optimizer_step(self, step: int) -> None:
        """Sets the Adam family's step count (FBGEMM's ``set_optimizer_step``)."""
        self._live.apply()
        self._version += 1
        self._emb.set_optimizer_step(step)

    # TorchRec reads these while it builds its state: a tiered kernel exposes no tensors
    # there (the sharded module streams its tables itself).
    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):  # type: ignore[override]
        return destination if destination is not None else {}

    def named_parameters_by_table(self) -> Iterator[Tuple[str, nn.Parameter]]:
        return iter(())

    def named_split_embedding_weights(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return iter(())

    # ----------------------------------------------------------- whole shards ----
    def shards(self) -> List[Tuple[int, ShardedEmbeddingTable]]:
        """(kernel table index, shard) of every local shard."""
        return list(enumerate(self._tables))

    def has_optimizer_state(self) -> bool:
        return self._emb.layouts[0].state_values > 0

    def _state_columns(self, t: int, part: str) -> Optional[Tuple[int, int]]:
        """The columns of the state block that part ``"state.<k>"`` (FBGEMM's part k of the
        optimizer state: Adam's momentum1 or momentum2) holds; None for another part."""
        if not part.startswith("state."):
            return None
        widths = self._emb.layouts[t].state_parts
        k = int(part[len("state."):])
        if not 0 <= k < len(widths):
            raise ValueError(f"table {self._tables[t].name}: its optimizer state has {len(widths)} parts, "
                             f"not a part {part!r}")
        start = sum(widths[:k])
        return start, start + widths[k]

    def _part_layout(self, t: int, part: str) -> Tuple[Tuple[int, ...], torch.dtype]:
        """Shape and dtype of local shard ``t``'s weights, optimizer state (``"state"``, one
        block) or one of FBGEMM's parts of it (``"state.<k>"``), in FBGEMM's layout."""
        rows, layout = self._tables[t].local_rows, self._emb.layouts[t]
        if part == "weight":
            return (rows, layout.dim), self._emb.weights_dtype
        if part == "step":
            return (), torch.int64
        columns = self._state_columns(t, part)
        if columns is not None:
            width = columns[1] - columns[0]
            return ((rows,) if width == 1 else (rows, width)), torch.float32
        # SGD has no state: a state shard given for it is taken as per-weight and ignored.
        return layout.state_shape(rows) or (rows, layout.dim), torch.float32

    def _state_part(self, t: int, part: str, state: torch.Tensor) -> torch.Tensor:
        """Part ``part`` ("state" or "state.<k>") of a block of rows' state (``read_rows``)."""
        columns = self._state_columns(t, part)
        if columns is None:
            return state
        block = state if state.dim() == 2 else state.unsqueeze(1)
        out = block[:, columns[0]:columns[1]]
        return out.reshape(-1) if columns[1] - columns[0] == 1 else out

    def stage_step(self, t: int) -> torch.Tensor:
        """The kernel's optimizer step count (FBGEMM's ``iter``) as a 0-d int64 tensor for
        local shard ``t``'s state; an in-place write into it sets the count (as
        ``load_shard(t, "step", ...)``) before the kernel next runs."""
        self._live.apply()
        out = torch.tensor(self._emb.optimizer_step, dtype=torch.int64)
        self._live.track(t, "step", out)
        return out

    def check_dense(self, t: int, what: str) -> None:
        """Raises for a virtual shard: its rows are keyed by id, not a dense tensor."""
        if self._virtual[t] is not None:
            raise ValueError(
                f"table {self._tables[t].name} is a virtual table: {what} of its rows as a dense tensor is not "
                "supported (its ids are keys in a space of {:,} ids); read them by id with the kernel's "
                "read_ids()".format(self._tables[t].num_embeddings))

    def stage_shard(self, t: int, part: str, area: StagingArea) -> torch.Tensor:
        """Local shard ``t``'s weights (``part="weight"``) or optimizer state
        (``"state"``), read through the tiers in chunks into a tensor of ``area``. In-place
        writes into it reach the shard before the kernel next reads or changes it (see
        ``live_state.py``)."""
        self.check_dense(t, "staging")
        self._live.apply()
        rows = self._tables[t].local_rows
        out = area.empty(*self._part_layout(t, part))
        for lo in range(0, rows, _CHUNK_ROWS):
            hi = min(rows, lo + _CHUNK_ROWS)
            weights, state = self._emb.read_rows(t, lo, hi)
            out[lo:hi] = weights if part == "weight" else self._state_part(t, part, state)
        self._live.track(t, part, out)
        return out

    def load_shard(self, t: int, part: str, source: torch.Tensor) -> None:
        """Writes ``source`` (the full local shard ``t``: weights, optimizer state or one of
        its parts, see ``_part_layout``) to the tiers in chunks, keeping the rest of each
        row; ``part="step"``: the kernel's optimizer step count (a 0-d tensor)."""
        if part != "step":
            self.check_dense(t, "loading")
        self._live.apply()
        self._load_shard(t, part, source)
        self._live.shards_changed(t, part, source=source)

    def _load_shard(self, t: int, part: str, source: torch.Tensor) -> None:
        rows = self._tables[t].local_rows
        want, dtype = self._part_layout(t, part)
        if tuple(source.shape) != want:
            raise ValueError(
                f"table {self._tables[t].name}: the {part} shard to load has shape {tuple(source.shape)}, "
                f"expected {want}"
            )
        self._version += 1
        if part == "step":
            self._emb.set_optimizer_step(int(source.item()))
            return
        columns = self._state_columns(t, part)
        for lo in range(0, rows, _CHUNK_ROWS):
            hi = min(rows, lo + _CHUNK_ROWS)
            weights, state = self._emb.read_rows(t, lo, hi)
            if part == "weight":
                weights = source[lo:hi].to(dtype)
            elif columns is not None:
                state = state.clone()
                block = state if state.dim() == 2 else state.unsqueeze(1)
                block[:, columns[0]:columns[1]] = source[lo:hi].to(dtype).reshape(hi - lo, -1)
            else:
                state = source[lo:hi].to(dtype)
            self._emb.set_rows(t, torch.arange(lo, hi), weights.contiguous(),
                               None if state is None else state.contiguous())


class TieredFusedOptimizer(FusedOptimizer):
    """The fused optimizer of a tiered kernel, keyed as TorchRec's FUSED kernel keys its
    own (``<table>.weight`` -> ``{"<table>.momentum1": ShardedTensor}``), so checkpoints
    move between tiered and plain tables. The state is read through the tiers when asked
    for and written back by ``post_load_state_dict``.

    Its learning rate is held as FBGEMM's TBE holds it, a float32 (0.009999999776482582 for
    0.01): TorchRec's FUSED optimizer starts its param group from the TBE's value, so a
    scheduler decays the same number on both and hands the TBE the same float32 each step."""

    def __init__(self, kernel: TieredBatchedEmbeddingBag, lr: float) -> None:
        self._kernel = kernel
        self._ready = False
        self._cached: Optional[Tuple[int, Dict[Any, Any]]] = None
        keys: Dict[str, torch.Tensor] = {}
        for _, table in kernel.shards():
            keys.setdefault(f"{table.name}.weight", nn.Parameter(torch.empty(0), requires_grad=False))
        # TorchRec renames the keys (it prepends "embedding_bags."); the objects stay.
        self.table_of_param: Dict[int, str] = {id(p): k[: -len(".weight")] for k, p in keys.items()}
        super().__init__(keys, {}, [{"params": list(keys.values()), "lr": self.held_by_fbgemm(lr)}])
        self._ready = True

    @property  # type: ignore[override]
    def state(self) -> Dict[Any, Any]:
        if not self._ready:
            return {}
        if self._kernel.state_excluded:
            return {param: {} for param in self.params.values()}
        if self._cached is None or self._cached[0] != self._kernel._version:
            self._cached = (self._kernel._version, optimizer_state_of(self._kernel, self.table_of_param, self.params.values()))
        return self._cached[1]

    @state.setter
    def state(self, value: Any) -> None:  # KeyedOptimizer.__init__ assigns it
        pass

    def post_load_state_dict(self) -> None:
        if self._cached is None:
            return
        _, state = self._cached
        self._cached = None
        load_optimizer_state(self._kernel, self.table_of_param, state)

    @staticmethod
    def held_by_fbgemm(lr: float) -> float:
        """``lr`` as FBGEMM's TBE holds it (a float32 tensor) and gives it back (a float)."""
        return torch.tensor(lr, dtype=torch.float32).item()

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._kernel.set_learning_rate(self.param_groups[0]["lr"])

    def step(self, closure: Any = None) -> None:
        self._kernel.set_learning_rate(self.param_groups[0]["lr"])

    def set_optimizer_step(self, step: int) -> None:
        """FBGEMM's fused optimizer's ``set_optimizer_step`` (TorchRec's KeyedOptimizer passes
        it on): the Adam family's step count."""
        self._kernel.set_optimizer_step(step)
