"""Checks of checkpoint metadata as read from disk: a manifest (``tiered.rank<N>.json``) or
``trainer.json`` whose checksum holds may still have been written by something else, or by a
hand: every field is checked for its JSON type and range before anything uses it, so that a
hostile file is refused with the field named instead of crashing, hanging (a delta that
names itself as its parent) or reading outside the checkpoint directory."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, Mapping

from torchrec_mtrains.layout import OPTIMIZERS

__all__ = ["check_fields", "check_manifest_ranges", "check_trainer"]

_TORCH_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
_TRAINER_COUNTS = ("bytes", "rows_written", "row_bytes", "dense_bytes", "rows_linked", "linked_row_bytes",
                   "map_bytes")


def _check_type(value: Any, tp: Any, where: str) -> None:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return
    if origin is typing.Union:
        if value is None and type(None) in args:
            return
        return _check_type(value, next(a for a in args if a is not type(None)), where)
    if origin in (list, typing.List):
        if not isinstance(value, list):
            raise ValueError(f"{where} must be a list, not {type(value).__name__}")
        for i, v in enumerate(value):
            _check_type(v, args[0] if args else Any, f"{where}[{i}]")
        return
    if origin in (dict, typing.Dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object, not {type(value).__name__}")
        for k, v in value.items():
            _check_type(v, args[1] if args else Any, f"{where}[{k!r}]")
        return
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, tp)
    if not ok:
        raise ValueError(f"{where}={value!r} must be of type {getattr(tp, '__name__', tp)}")


def check_fields(cls: type, raw: Any, where: str, skip: tuple = ()) -> Dict[str, Any]:
    """``raw`` (decoded JSON) as keyword arguments of the dataclass ``cls``: an object with
    every required field, no unknown one, each of its annotated type (``skip``: fields the
    caller decodes itself)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be an object, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields), key=str)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}")
    hints = typing.get_type_hints(cls)
    for name, f in fields.items():
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise ValueError(f"{where} lacks the field {name!r}")
            continue
        if name not in skip:
            _check_type(raw[name], hints[name], f"{where}.{name}")
    return dict(raw)


def _non_negative(obj: Any, names: tuple, where: str) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            raise ValueError(f"{where}.{name}={getattr(obj, name)} must be >= 0")


def check_manifest_ranges(m: Any, full: str, delta: str) -> None:
    """The ranges and relations of a type-checked ``StepManifest``'s fields."""
    if m.kind not in (full, delta):
        raise ValueError(f"kind={m.kind!r} must be {full!r} or {delta!r}")
    _non_negative(m, ("step", "base", "rank"), "manifest")
    if m.world_size < 1 or m.rank >= m.world_size:
        raise ValueError(f"rank={m.rank} of world_size={m.world_size}: needs 0 <= rank < world_size")
    if m.base > m.step:
        raise ValueError(f"base={m.base} is after step={m.step}")
    if (m.parent is None) != (m.kind == full):
        raise ValueError(f"a {m.kind} step has parent={m.parent}")
    if m.parent is not None and not m.base <= m.parent < m.step:
        raise ValueError(f"parent={m.parent} must lie in [base={m.base}, step={m.step})")
    for i, p in enumerate(m.pieces):
        _check_piece(p, f"pieces[{i}]")


def _check_piece(p: Any, where: str) -> None:
    s = p.spec
    _non_negative(s, ("row_offset", "col_offset", "rows", "cols", "table_rows", "table_cols", "state_values"),
                  f"{where}.spec")
    if s.row_offset + s.rows > s.table_rows or s.col_offset + s.cols > s.table_cols:
        raise ValueError(f"{where}.spec: rows [{s.row_offset}, +{s.rows}) x cols [{s.col_offset}, +{s.cols}) "
                         f"exceed the table's {s.table_rows} x {s.table_cols}")
    if s.tables_attr not in ("embedding_bags", "embeddings"):
        raise ValueError(f"{where}.spec.tables_attr={s.tables_attr!r} must be 'embedding_bags' or 'embeddings'")
    if s.optimizer and s.optimizer not in OPTIMIZERS:
        raise ValueError(f"{where}.spec.optimizer={s.optimizer!r} must be one of {list(OPTIMIZERS)}")
    if p.optimizer_step < 0:
        raise ValueError(f"{where}.optimizer_step={p.optimizer_step} must be >= 0")
    if s.dtype not in _TORCH_DTYPES:
        raise ValueError(f"{where}.spec.dtype={s.dtype!r} must be one of {sorted(_TORCH_DTYPES)}")
    if len(s.init_range) != 2:
        raise ValueError(f"{where}.spec.init_range={s.init_range!r} must be [low, high]")
    if p.virtual is not None:
        _non_negative(p.virtual, ("pending", "next_pass_at"), f"{where}.virtual")
        for j, c in enumerate(p.virtual.live):
            _non_negative(c, ("row_lo", "count", "crc32"), f"{where}.virtual.live[{j}]")
            if not c.row_lo <= c.row_hi <= s.rows or c.count > c.row_hi - c.row_lo or c.quantize:
                raise ValueError(f"{where}.virtual.live[{j}]: {c.count} ids of [{c.row_lo}, {c.row_hi}) do not fit "
                                 f"the piece's {s.rows} ids")
    for j, c in enumerate(p.chunks):
        _non_negative(c, ("row_lo", "count", "crc32"), f"{where}.chunks[{j}]")
        if c.quantize not in ("", "fp16", "int8"):
            raise ValueError(f"{where}.chunks[{j}].quantize={c.quantize!r} must be '', 'fp16' or 'int8'")
        if not c.row_lo <= c.row_hi <= s.rows or c.count > c.row_hi - c.row_lo:
            raise ValueError(f"{where}.chunks[{j}]: {c.count} rows of [{c.row_lo}, {c.row_hi}) do not fit the "
                             f"piece's {s.rows} rows")
    if p.snapshot is not None:
        snap = p.snapshot
        _non_negative(snap, ("step", "entries"), f"{where}.snapshot")
        for name in ("file", "map_file"):
            value = getattr(snap, name)
            if not value or value in (".", "..") or "/" in value or "\0" in value:
                raise ValueError(f"{where}.snapshot.{name}={value!r} must be a plain file name")


def check_trainer(doc: Any) -> Mapping[str, Any]:
    """``trainer.json``: an object; its ``step`` and byte and row counts non-negative
    integers, its ``kind`` a string, where present."""
    if not isinstance(doc, dict):
        raise ValueError(f"must be a JSON object, not {type(doc).__name__}")
    for name in ("step",) + _TRAINER_COUNTS:
        if name in doc:
            value = doc[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0")
    if "kind" in doc and not isinstance(doc["kind"], str):
        raise ValueError(f"kind={doc['kind']!r} must be a string")
    return doc
