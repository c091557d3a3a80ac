"""Opening never crashes on any input: hypothesis fuzz of the BlockStore and ScmStore
open paths (header / format parsers) over mutations of real table files.

Each example writes a mutated copy of a real table -- bit flips, truncations, arbitrary
bytes behind a valid magic, header fields set to huge or negative-looking values with and
without a recomputed checksum -- and opens it. The outcome must be either a clean
ValueError / OSError (CorruptionError included) naming the file, or a store whose reads
of the rows written before either return exactly those rows (and never-written rows
their initial values) or raise CorruptionError. A watchdog (faulthandler) turns a hang
into a failure with a traceback. The C++ parser is fuzzed further, under ASan, by
csrc/tests/block_format_test.cc (scripts/sanitize.sh).
"""

from __future__ import annotations

import faulthandler
import json
import os
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Dict, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.block_store_helpers import HEADER_BYTES, TABLE_MAGIC, crc32c
from torchrec_mtrains.storage import BlockStore, ScmStore
from torchrec_mtrains.storage.scm_store import _encode_header as scm_encode_header
from torchrec_mtrains.storage.types import CorruptionError

_ROWS, _DIM, _STATE, _SEED = 64, 4, 1, 3
_WRITTEN = list(range(0, _ROWS, 3))
_HANG_SECONDS = 20  # per example: the watchdog aborts the run with a traceback
_SETTINGS = settings(
    max_examples=400,
    deadline=None,  # a hang is caught by the watchdog; slow machines vary
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)

# Header fields of csrc/storage/block_format.cc EncodeHeader: (offset, struct format).
_BLOCK_FIELDS = [(8, "<I"), (12, "<I"), (16, "<Q"), (24, "<I"), (28, "<I"), (32, "<I"), (36, "<I"),
                 (40, "<Q"), (48, "<d"), (56, "<d"), (64, "<Q"), (72, "<Q"), (80, "<I"), (84, "<H")]
_EXTREMES = [0, 1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
             2**40, 2**48 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _rows(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.rand((n, _DIM + _STATE), generator=g, dtype=torch.float32)


class _Blob(bytes):
    def __repr__(self) -> str:  # strategies' arguments show up in hypothesis reports
        return f"<{len(self)} bytes>"


class _Files(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"<table files {sorted(self)}>"


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, bytes]:
    """Bytes of a real BlockStore table and a real ScmStore table with rows _WRITTEN."""
    d = tmp_path_factory.mktemp("fuzz-originals")
    ids = torch.tensor(_WRITTEN)
    with BlockStore(d / "t.blk", _ROWS, _DIM, _STATE, seed=_SEED, segment_blocks=4, dram_cache_mb=0,
                    direct_io=False) as s:
        s.write(ids, _rows(len(_WRITTEN)))
    scm = ScmStore(d / "t.scm", _ROWS, _DIM, _STATE, seed=_SEED)
    scm.write(ids, _rows(len(_WRITTEN)))
    scm.close()
    return _Files(blk=_Blob((d / "t.blk").read_bytes()), scm=_Blob((d / "t.scm").read_bytes()))


@pytest.fixture(scope="module")
def reference(originals: Dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    """Every row of the undamaged table, as the store reads it (written + initial values)."""
    p = tmp_path_factory.mktemp("fuzz-ref") / "t.blk"
    p.write_bytes(originals["blk"])
    with BlockStore.open(p, dram_cache_mb=0, direct_io=False) as s:
        return s.read(torch.arange(_ROWS))


class _Mutated:
    """A mutated file: its bytes, whether a correct reader may still take it for the same
    table (False for forged headers with a valid checksum), and a short description
    (hypothesis prints it for a failing example instead of the whole file)."""

    def __init__(self, data: bytes, strict: bool, what: str) -> None:
        self.data, self.strict, self.what = data, strict, what

    def __repr__(self) -> str:
        return f"<{self.what}; {len(self.data)} bytes; strict={self.strict}>"


class _Watchdog:
    def __enter__(self) -> None:
        faulthandler.dump_traceback_later(_HANG_SECONDS, exit=True)

    def __exit__(self, *exc: object) -> None:
        faulthandler.cancel_dump_traceback_later()


def _write_temp(data: bytes, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix, prefix="mtrains-fuzz-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return Path(name)


def _check_clean_error(e: BaseException, path: Path) -> None:
    assert isinstance(e, (ValueError, OSError)), f"{type(e).__name__} is not a clean error: {e}"
    assert str(path) in str(e), f"error does not name the file {path}: {e}"


def _check_reads(read: Callable[[torch.Tensor], torch.Tensor], expected: torch.Tensor, path: Path,
                 rows: "list[int] | range" = range(_ROWS)) -> None:
    """Each of `rows` reads as expected or raises CorruptionError naming the file."""
    try:
        got = read(torch.tensor(list(rows)))
        assert torch.equal(got, expected[list(rows)]), f"{path}: a damaged table returned wrong rows"
        return
    except CorruptionError as e:
        assert str(path) in str(e)
    for r in rows:
        try:
            got = read(torch.tensor([r]))
        except CorruptionError as e:
            assert str(path) in str(e)
            continue
        assert torch.equal(got[0], expected[r]), f"{path}: row {r} read back wrong after damage"


# ------------------------------------------------------------------ mutations --------

@st.composite
def _mutation(draw: st.DrawFn, original: bytes, fields: list, header_bytes: int) -> _Mutated:
    """A damaged copy of `original`."""
    data = bytearray(original)
    kind = draw(st.sampled_from(["flip", "flip_header", "truncate", "arbitrary", "field", "field_resealed"]))
    if kind in ("flip", "flip_header"):
        hi = header_bytes if kind == "flip_header" else len(data)
        flips = []
        for _ in range(draw(st.integers(1, 6))):
            i, bit = draw(st.integers(0, hi - 1)), draw(st.integers(0, 7))
            data[i] ^= 1 << bit
            flips.append(f"{i}.{bit}")
        return _Mutated(bytes(data), True, "bit flips at " + ",".join(flips))
    if kind == "truncate":
        n = draw(st.integers(0, len(data) - 1))
        return _Mutated(bytes(data[:n]), True, f"truncated to {n}")
    if kind == "arbitrary":
        blob = draw(st.binary(max_size=2 * header_bytes))
        magic = original[:8] if draw(st.booleans()) else b""
        return _Mutated(magic + blob, True, f"arbitrary {blob[:32]!r}... behind magic {magic!r}")
    changed = []
    for _ in range(draw(st.integers(1, 3))):
        off, fmt = draw(st.sampled_from(fields))
        size = struct.calcsize(fmt)
        if fmt == "<d":
            value = struct.pack(fmt, draw(st.floats(allow_nan=True, allow_infinity=True)))
        else:
            v = draw(st.one_of(st.sampled_from(_EXTREMES), st.integers(0, 2 ** (8 * size) - 1)))
            value = (v % 2 ** (8 * size)).to_bytes(size, "little")
        data[off : off + size] = value
        changed.append(f"@{off}={value.hex()}")
    resealed = kind == "field_resealed"
    if resealed and fields is _BLOCK_FIELDS:
        data[HEADER_BYTES - 4 : HEADER_BYTES] = struct.pack("<I", crc32c(bytes(data[: HEADER_BYTES - 4])))
    # A forged header with a valid checksum may describe another table; only its clean
    # failure (or a consistent store) can be required.
    return _Mutated(bytes(data), not resealed, ("resealed " if resealed else "") + "fields " + " ".join(changed))


# ------------------------------------------------------------------ BlockStore -------

@_SETTINGS
@given(data=st.data())
def test_block_store_open_never_crashes(originals: Dict[str, bytes], reference: torch.Tensor,
                                        data: st.DataObject) -> None:
    m = data.draw(_mutation(originals["blk"], _BLOCK_FIELDS, HEADER_BYTES))
    strict = m.strict
    path = _write_temp(m.data, ".blk")
    try:
        with _Watchdog():
            try:
                store = BlockStore.open(path, dram_cache_mb=0, direct_io=False, io_engine="threads")
            except (ValueError, OSError) as e:
                _check_clean_error(e, path)
                return
            try:
                same_shape = (store.num_rows, store.dim, store.state_dim, store.dtype) == (
                    _ROWS, _DIM, _STATE, torch.float32)
                if strict or same_shape:
                    assert same_shape, f"{path}: damaged header accepted as another shape"
                if same_shape:
                    # A forged header may change the initial values of never-written rows,
                    # but rows read from disk are checked against the table's identity.
                    _check_reads(store.read, reference, path, range(_ROWS) if strict else _WRITTEN)
                else:  # a forged table: reads must still end cleanly
                    try:
                        store.read(torch.arange(min(store.num_rows, _ROWS)))
                    except (ValueError, OSError) as e:
                        _check_clean_error(e, path)
            finally:
                try:
                    store.close()
                except OSError as e:
                    _check_clean_error(e, path)
    finally:
        path.unlink()


# ------------------------------------------------------------------ ScmStore ---------

def _scm_meta_header(meta: object, sealed: bool) -> bytes:
    """A header holding `meta`: with a valid checksum (forged), or with none (0, as files
    written before the checksum)."""
    if sealed:
        return scm_encode_header(meta)  # type: ignore[arg-type]
    return (b"MTRNSCM1" + json.dumps(meta).encode()).ljust(HEADER_BYTES, b"\0")[:HEADER_BYTES]


_json_values = st.one_of(
    st.integers(-(2**70), 2**70), st.sampled_from([v for v in _EXTREMES] + [-1, -(2**63)]),
    st.floats(), st.text(max_size=8), st.none(), st.booleans(),
    st.lists(st.floats(), max_size=3), st.sampled_from(["float32", "float16", "bfloat16", "int8"]),
)


@st.composite
def _scm_mutation(draw: st.DrawFn, original: bytes) -> _Mutated:
    if draw(st.booleans()):
        # A header whose JSON says anything at all (missing keys, wrong types, huge sizes).
        meta = json.loads(original[8 : HEADER_BYTES - 4].rstrip(b"\0"))
        for key in draw(st.lists(st.sampled_from(sorted(meta) + ["extra"]), max_size=3, unique=True)):
            if draw(st.integers(0, 4)) == 0:
                meta.pop(key, None)
            else:
                meta[key] = draw(_json_values)
        if draw(st.integers(0, 9)) == 0:
            meta = draw(_json_values)
        sealed = draw(st.booleans())
        header = _scm_meta_header(meta, sealed)
        return _Mutated(header + original[HEADER_BYTES:], False, f"header (sealed={sealed}) {json.dumps(meta)[:200]}")
    if draw(st.booleans()):
        # Damage to the header region.
        m = draw(_mutation(original[:HEADER_BYTES], [(8, "<Q"), (16, "<Q")], HEADER_BYTES))
        if len(m.data) == HEADER_BYTES and not m.what.startswith("truncated"):
            m.data += original[HEADER_BYTES:]
        return m
    # Damage anywhere in the file: rows, their checksums, never-written rows' bytes.
    return draw(_mutation(original, [(8, "<Q"), (16, "<Q")], len(original)))


@_SETTINGS
@given(data=st.data())
def test_scm_store_open_never_crashes(originals: Dict[str, bytes], reference: torch.Tensor,
                                      data: st.DataObject) -> None:
    m = data.draw(_scm_mutation(originals["scm"]))
    path = _write_temp(m.data, ".scm")
    try:
        with _Watchdog():
            try:
                store = ScmStore.open(path)
            except (ValueError, OSError) as e:
                _check_clean_error(e, path)
                return
            try:
                same_shape = (store.num_rows, store.dim, store.state_dim, store.dtype) == (
                    _ROWS, _DIM, _STATE, torch.float32)
                if m.strict:  # damage, not forgery: refused, or the same table read the same
                    assert same_shape, f"{path}: damaged header accepted as another shape"
                    _check_reads(store.read, reference, path)
                elif same_shape:  # a forged header may change never-written rows' values
                    _check_reads(store.read, reference, path, _WRITTEN)
                else:  # a forged header naming another shape of the same size: reads end cleanly
                    try:
                        store.read(torch.arange(min(store.num_rows, _ROWS)))
                    except (ValueError, OSError) as e:
                        _check_clean_error(e, path)
            finally:
                store.close()
    finally:
        path.unlink()
