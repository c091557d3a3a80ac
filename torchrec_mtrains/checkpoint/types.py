"""Value types of differential checkpoints: what a step saved of each table shard."""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any, Dict, List, Optional, Tuple

import torch

from torchrec_mtrains.checkpoint.manifest_schema import check_fields, check_manifest_ranges
from torchrec_mtrains.layout import state_parts

__all__ = [
    "ChainError",
    "CheckpointRecord",
    "ChunkSpec",
    "LINKS_DIR",
    "MAP_ENTRY_BYTES",
    "SnapshotSpec",
    "Table",
    "VirtualRecord",
    "PieceRecord",
    "PieceSpec",
    "StepManifest",
    "FULL",
    "table_of",
    "DELTA",
]

FULL, DELTA = "full", "delta"
LINKS_DIR = "links"  # a step's hard links to block-store files (not the step's own bytes)
MAP_ENTRY_BYTES = 16  # a location-map entry in a map file: row id int64, location int64


# A table as checkpoints name it: (state_dict prefix of the collection, table name, its
# module dict: "embedding_bags" or "embeddings"); a plain tuple after a collective.
Table = Tuple[str, str, str]


def table_of(spec: Any) -> Table:
    """The table of a PieceSpec (or anything with ``module``, ``table``, ``tables_attr``)."""
    return (spec.module, spec.table, spec.tables_attr)


class ChainError(ValueError):
    """A checkpoint chain cannot be restored: a step is missing, damaged or of another chain.

    Attributes:
        path: the file or directory at fault.
        step: the training step of the checkpoint it belongs to (None if unknown).
    """

    def __init__(self, message: str, path: str, step: Optional[int]) -> None:
        super().__init__(message)
        self.path, self.step = path, step


@dataclasses.dataclass(frozen=True)
class PieceSpec:
    """One tiered table shard as saved: where it sits in its table and how its rows are
    laid out (``cols`` weights of ``dtype``, then ``state_values`` fp32 optimizer values
    in the bytes of ``state_slots`` more elements), and how its never-written rows start
    (``lazy_init_rows`` of the shard-local row id, ``seed`` and ``init_range``)."""

    table: str
    module: str  # state_dict prefix of the sharded collection, e.g. "sparse.ebc."
    row_offset: int
    col_offset: int
    rows: int
    cols: int
    table_rows: int
    table_cols: int
    dtype: str  # torch dtype name: "float32", "float16"
    state_values: int
    seed: int
    init_range: List[float]
    # A virtual table's shard: ``rows`` is its id space (``row_offset`` its first id) and
    # its chunks' ids are the live ids saved (no row of it is implied; VirtualRecord).
    virtual: bool = False
    # The collection's module dict of tables: "embedding_bags" (an EmbeddingBagCollection)
    # or "embeddings" (an EmbeddingCollection); the table's weight is
    # ``<module><tables_attr>.<table>.weight``.
    tables_attr: str = "embedding_bags"
    # The optimizer (FBGEMM's EmbOptimType value) whose state the rows carry; "" in a
    # manifest written before it was saved, and for a FUSED shard: see ``optimizer_name``.
    optimizer: str = ""

    @property
    def optimizer_name(self) -> str:
        """The optimizer whose state the rows carry: as saved, else the one ``state_values``
        implies (none: SGD, one: row-wise Adagrad, else Adagrad), the only ones saved before."""
        if self.optimizer:
            return self.optimizer
        return {0: "exact_sgd", 1: "exact_row_wise_adagrad"}.get(self.state_values, "exact_adagrad")

    @property
    def state_parts(self) -> Tuple[int, ...]:
        """Values per row of each of FBGEMM's parts of the state (``TableLayout.state_parts``)."""
        return state_parts(self.optimizer_name, self.cols)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def element_bytes(self) -> int:
        return torch.empty(0, dtype=self.torch_dtype).element_size()

    @property
    def state_slots(self) -> int:
        return self.state_values * 4 // self.element_bytes

    @property
    def row_width(self) -> int:
        return self.cols + self.state_slots

    @property
    def row_bytes(self) -> int:
        return self.row_width * self.element_bytes

    @property
    def ids_dtype(self) -> torch.dtype:
        """The dtype of the shard's saved row ids (shard-local)."""
        return torch.int32 if self.rows < 2**31 else torch.int64

    def chunk_bytes(self, count: int, dense: bool, quantize: str = "") -> int:
        """Bytes of a chunk of ``count`` rows (quantized as ``quantize``: ``quantize.py``),
        and of their ids unless ``dense``."""
        ids = 0 if dense else torch.empty(0, dtype=self.ids_dtype).element_size()
        return count * ((self.quantized_row_bytes(quantize) if quantize else self.row_bytes) + ids)

    def quantized_row_bytes(self, quantize: str) -> int:
        """Bytes of a row quantized as ``"fp16"`` or ``"int8"`` (``quantize.py``): the
        weights encoded, the optimizer state's fp32 values as they are."""
        weights = {"fp16": 2 * self.cols, "int8": 8 + self.cols}.get(quantize)
        if weights is None:
            raise ValueError(f"quantize={quantize!r} must be 'fp16' or 'int8'")
        return weights + 4 * self.state_values

    @property
    def key(self) -> str:
        return f"{self.module}{self.table_prefix}{self.table}/r{self.row_offset}_c{self.col_offset}"

    @property
    def table_prefix(self) -> str:
        """"" for a bag table (the keys of older steps), "embeddings." for a sequence one."""
        return "" if self.tables_attr == "embedding_bags" else f"{self.tables_attr}."

    @property
    def weight_key(self) -> str:
        """The table's weight in the model's state_dict."""
        return f"{self.module}{self.tables_attr}.{self.table}.weight"


@dataclasses.dataclass(frozen=True)
class ChunkSpec:
    """Rows of one piece saved as one DCP tensor ``key`` (``[count, row_width]``) with the
    shard-local ids at ``key + "/ids"`` (absent when the chunk is every row of
    ``[row_lo, row_hi)``); ``crc32`` covers the ids' bytes, then the rows'. A ``quantize``d
    chunk (a lossy delta, ``quantize.py``) holds ``uint8`` rows of that encoding."""

    key: str
    row_lo: int
    row_hi: int
    count: int
    crc32: int
    quantize: str = ""

    @property
    def dense(self) -> bool:
        return self.count == self.row_hi - self.row_lo


@dataclasses.dataclass(frozen=True)
class SnapshotSpec:
    """A piece saved without copying its rows: step ``step`` holds a hard link
    ``LINKS_DIR/file`` to the piece's block-store file (whose log segments the live store
    never reuses while the step exists) and the store's location map as of the save in
    ``map_file``: ``entries`` (row, location) pairs, in the piece record's chunks (each
    chunk's ``key`` is ``map_file@byte_offset``; its CRC-32 covers its ids, then its
    locations). Rows not in the map hold their initial values."""

    step: int
    file: str
    map_file: str
    entries: int
    table_uuid: int


@dataclasses.dataclass
class VirtualRecord:
    """A virtual table shard's live ids as of the step: ``live`` chunks, each a DCP tensor
    ``key`` of ``[count, 3]`` int64 -- shard-local id (ascending, in ``[row_lo, row_hi)``),
    access count (its fp32 bits), last-use seconds -- with its CRC-32. Every live id's row
    is in this step's chunks or, unchanged since, in an earlier step's of the chain.
    ``pending``: steps its kernel had mapped (prefetched) but not computed; a restore
    replays them without counting their ids again. ``next_pass_at``: live ids at which the
    next eviction pass may run."""

    live: List[ChunkSpec]
    pending: int = 0
    next_pass_at: int = 0


@dataclasses.dataclass
class PieceRecord:
    spec: PieceSpec
    complete: bool  # every row of the piece is in this step (no initial values implied)
    chunks: List[ChunkSpec]
    snapshot: Optional[SnapshotSpec] = None  # rows linked, not copied: chunks are map entries
    # A shard of a table in TorchRec's own FUSED kernel: a full step holds it whole in the
    # dense state (plain DCP, as TorchRec saves it; no chunks), a delta the rows its
    # training looked up since the parent step.
    fused: bool = False
    virtual: Optional[VirtualRecord] = None  # a virtual table's shard: its live ids
    # The step count of the shard's kernel's optimizer when saved (the Adam family's bias
    # correction, FBGEMM's ``iter``); 0 for the optimizers that keep none.
    optimizer_step: int = 0

    @property
    def rows_saved(self) -> int:
        return sum(c.count for c in self.chunks)


@dataclasses.dataclass
class StepManifest:
    """What one rank saved of its table shards in one checkpoint step: tiered ones, and
    FUSED ones tracked for deltas (``PieceRecord.fused``)."""

    step: int
    kind: str  # FULL or DELTA
    base: int  # step of the chain's full checkpoint
    parent: Optional[int]  # the step this delta applies on; None for a full one
    rank: int
    world_size: int
    pieces: List[PieceRecord]
    files: Dict[str, int] = dataclasses.field(default_factory=dict)  # file -> CRC-32, besides chunks
    trainer: Dict[str, Any] = dataclasses.field(default_factory=dict)  # the caller's state (rank 0)

    @property
    def tiered_bytes(self) -> int:
        """Bytes of the rows (and ids) this rank copied (linked pieces: see ``map_bytes``)."""
        return sum(p.spec.chunk_bytes(c.count, c.dense, c.quantize) for p in self.pieces if p.snapshot is None
                   for c in p.chunks)

    @property
    def fused_bytes(self) -> int:
        """Bytes of the FUSED shards this rank holds whole in the dense state (full steps)."""
        return sum(p.spec.rows * p.spec.row_bytes for p in self.pieces if p.fused and p.complete)

    @property
    def map_bytes(self) -> int:
        """Bytes of the location maps of the pieces this rank linked."""
        return sum(p.snapshot.entries * MAP_ENTRY_BYTES for p in self.pieces if p.snapshot is not None)

    def to_json(self) -> str:
        body = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return json.dumps({"crc32": zlib.crc32(body.encode()), "manifest": body})

    @staticmethod
    def from_json(text: str, path: str, step: Optional[int]) -> "StepManifest":
        """Decodes and checks a manifest read from ``path`` (every field's type and range).

        Raises:
            ChainError: the file is damaged (checksum) or its fields are not a manifest's.
        """
        try:
            outer = json.loads(text)
            if not isinstance(outer, dict) or not isinstance(outer.get("manifest"), str):
                raise ValueError("not a manifest (an object with a 'manifest' string and its 'crc32')")
            body = outer["manifest"]
            if zlib.crc32(body.encode()) != outer.get("crc32"):
                raise ValueError("checksum mismatch")
            raw = check_fields(StepManifest, json.loads(body), "manifest", skip=("pieces",))
            pieces = [_piece(p, f"pieces[{i}]") for i, p in enumerate(_list(raw.pop("pieces"), "pieces"))]
            manifest = StepManifest(pieces=pieces, **raw)
            check_manifest_ranges(manifest, FULL, DELTA)
            return manifest
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ChainError(f"checkpoint manifest {path} (step {step}) is damaged: {e}", path, step) from None


def _list(value: Any, where: str) -> List[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list, not {type(value).__name__}")
    return value


def _piece(raw: Any, where: str) -> PieceRecord:
    fields = check_fields(PieceRecord, raw, where, skip=("spec", "chunks", "snapshot", "virtual"))
    spec = PieceSpec(**check_fields(PieceSpec, fields["spec"], f"{where}.spec"))
    chunks = [ChunkSpec(**check_fields(ChunkSpec, c, f"{where}.chunks[{j}]"))
              for j, c in enumerate(_list(fields["chunks"], f"{where}.chunks"))]
    snap = fields.get("snapshot")
    snapshot = SnapshotSpec(**check_fields(SnapshotSpec, snap, f"{where}.snapshot")) if snap else None
    fused = fields.get("fused", False)
    if fused and (snapshot is not None or (fields["complete"] and chunks)):
        raise ValueError(f"{where}: a FUSED shard is either whole in the dense state or chunks of changed rows")
    virtual = None
    if fields.get("virtual") is not None:
        raw_virtual = check_fields(VirtualRecord, fields["virtual"], f"{where}.virtual", skip=("live",))
        live = [ChunkSpec(**check_fields(ChunkSpec, c, f"{where}.virtual.live[{j}]"))
                for j, c in enumerate(_list(raw_virtual.pop("live"), f"{where}.virtual.live"))]
        virtual = VirtualRecord(live, **raw_virtual)
        if not spec.virtual or snapshot is not None or fused:
            raise ValueError(f"{where}: live ids belong to a virtual table's copied shard")
    elif spec.virtual:
        raise ValueError(f"{where}: a virtual table's shard lacks its live ids")
    return PieceRecord(spec, fields["complete"], chunks, snapshot, fused, virtual, fields.get("optimizer_step", 0))


@dataclasses.dataclass(frozen=True)
class CheckpointRecord:
    """One save: the row of ``metrics.json``'s ``"checkpoints"`` list."""

    step: int
    kind: str
    path: str
    bytes: int  # bytes of the step's files, every rank's
    rows_written: int  # tiered rows saved, every rank's
    seconds: float  # flush of the tiers to ``latest`` switched
    row_bytes: int = 0  # bytes of those rows (weights + optimizer state), ids not counted
    dense_bytes: int = 0  # bytes of the files of the dense state (everything not tiered)
    rows_linked: int = 0  # rows of SSD tables saved by linking their store file, every rank's
    linked_row_bytes: int = 0  # bytes of those rows (kept in the store files, not copied)
    map_bytes: int = 0  # bytes of the location maps that name them
    blocking_seconds: float = 0.0  # of ``seconds``, those training was stopped (async: the snapshot)

    # The fields that trainer.json holds too, by these names (``counts``, ``from_trainer``).
    COUNTS = ("bytes", "rows_written", "row_bytes", "dense_bytes", "rows_linked", "linked_row_bytes", "map_bytes")

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def counts(self) -> Dict[str, int]:
        """The byte and row counts, as trainer.json holds them."""
        return {name: getattr(self, name) for name in self.COUNTS}

    @classmethod
    def from_trainer(cls, path: str, trainer: Dict[str, Any], seconds: float) -> "CheckpointRecord":
        """The record of the step at ``path`` from its trainer.json (counts it lacks: 0)."""
        counts = {name: int(trainer.get(name, 0)) for name in cls.COUNTS}
        return cls(step=int(trainer["step"]), kind=trainer.get("kind", FULL), path=path, seconds=seconds, **counts)
