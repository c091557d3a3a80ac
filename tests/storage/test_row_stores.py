"""DramStore and ScmStore (torchrec_mtrains/storage): the DRAM and SCM tiers under the row
cache (CPU only).

Both implement RowStore: rows never written read as lazy_init_rows (the same values on every
tier, BlockStore included), writes round-trip with the last of repeated ids winning, bad
input raises ValueError / IndexError naming the store and writes nothing. Random operation
sequences are checked against an in-memory model; ScmStore files are reopened, and damaged
or foreign files refused.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Callable, Dict

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.block_store_helpers import flip_byte
from torchrec_mtrains.storage import BlockStore, CorruptionError, DramStore, RowStore, ScmStore, lazy_init_rows

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KINDS = ["dram", "scm"]


def make_store(kind: str, tmp_path: Path, num_rows: int, dim: int, state_dim: int = 1,
               dtype: torch.dtype = torch.float32, init_range=(-0.01, 0.01), seed: int = 0) -> RowStore:
    if kind == "dram":
        return DramStore(num_rows, dim, state_dim, dtype, init_range, seed, name="dram_t")
    return ScmStore(tmp_path / "t.scm", num_rows, dim, state_dim, dtype, init_range, seed, overwrite=True)


def rand_rows(n: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, width, generator=g) * 20 - 10).to(dtype)


# Initial values ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_never_written_rows_read_as_lazy_init(tmp_path: Path, kind: str, dtype: torch.dtype) -> None:
    n, dim, sd, rng, seed = 3000, 12, 2, (-0.25, 0.5), 42
    store = make_store(kind, tmp_path, n, dim, sd, dtype, rng, seed)
    assert (store.num_rows, store.dim, store.state_dim, store.dtype, store.row_width) == (n, dim, sd, dtype, dim + sd)
    rows = store.read(torch.arange(n))
    assert rows.shape == (n, dim + sd) and rows.dtype == dtype
    assert torch.equal(rows, lazy_init_rows(torch.arange(n), dim, sd, rng, seed, dtype))
    w = rows[:, :dim].float()
    assert bool((w >= rng[0]).all()) and bool((w <= rng[1]).all())
    assert bool((rows[:, dim:] == 0).all()), "optimizer state starts at zero"
    assert abs(w.mean().item() - 0.125) < 0.01, "uniform(lo, hi)"
    # A row's value depends on (seed, row) only: not on the batch it is read in.
    some = torch.tensor([2999, 5, 5, 0])
    assert torch.equal(store.read(some), rows[some])
    store.close()


def test_initial_rows_are_the_same_on_every_tier(tmp_path: Path) -> None:
    n, dim, sd, rng, seed = 700, 20, 1, (-0.1, 0.1), 9
    ids = torch.randperm(n)
    dram = DramStore(n, dim, sd, torch.float32, rng, seed)
    scm = ScmStore(tmp_path / "a.scm", n, dim, sd, torch.float32, rng, seed)
    blk = BlockStore(tmp_path / "a.blk", n, dim, sd, torch.float32, dram_cache_mb=0, init_range=rng, seed=seed)
    want = dram.read(ids)
    assert torch.equal(scm.read(ids), want)
    assert torch.equal(blk.read(ids), want)
    for s in (dram, scm, blk):
        s.close()


def test_initial_rows_depend_on_seed_and_row(tmp_path: Path) -> None:
    a = DramStore(100, 8, 0, seed=1).read(torch.arange(100))
    b = DramStore(100, 8, 0, seed=2).read(torch.arange(100))
    assert not torch.equal(a, b)
    assert a.unique(dim=0).shape[0] == 100, "distinct rows"


# Round trips -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_write_then_read(tmp_path: Path, kind: str, dtype: torch.dtype) -> None:
    n, dim, sd = 1000, 8, 3
    store = make_store(kind, tmp_path, n, dim, sd, dtype, seed=3)
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:400]
    rows = rand_rows(400, dim + sd, dtype, 1)
    store.write(ids, rows)
    assert torch.equal(store.read(ids), rows)
    untouched = torch.tensor(sorted(set(range(n)) - set(ids.tolist())))
    assert torch.equal(store.read(untouched), lazy_init_rows(untouched, dim, sd, (-0.01, 0.01), 3, dtype))
    # int32 ids, a list of ids, and a preallocated out=
    assert torch.equal(store.read(ids.int()), rows)
    assert torch.equal(store.read(ids[:3].tolist()), rows[:3])
    out = torch.empty(400, dim + sd, dtype=dtype)
    assert store.read(ids, out=out) is out and torch.equal(out, rows)
    assert store.read(torch.empty(0, dtype=torch.long)).shape == (0, dim + sd)
    store.write(torch.empty(0, dtype=torch.long), torch.empty(0, dim + sd, dtype=dtype))
    store.flush()
    assert torch.equal(store.read(ids), rows)
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_repeated_ids_last_write_wins(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path, 50, 4, 1)
    rows = rand_rows(4, 5, torch.float32, 2)
    store.write(torch.tensor([7, 3, 7, 7]), rows)
    assert torch.equal(store.read(torch.tensor([7, 3])), rows[[3, 1]])
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_state_dim_zero(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path, 10, 4, 0, torch.float16)
    rows = rand_rows(2, 4, torch.float16, 3)
    store.write(torch.tensor([9, 0]), rows)
    assert torch.equal(store.read(torch.tensor([0, 9])), rows[[1, 0]])
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_stats_count_rows(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path, 100, 4, 1)
    assert store.stats()["rows_read"] == 0 and store.stats()["rows_written"] == 0
    store.read(torch.tensor([1, 2, 3]))
    store.write(torch.tensor([1, 5]), rand_rows(2, 5, torch.float32, 0))
    store.read(torch.tensor([1, 1]))
    st = store.stats()
    assert (st["rows_read"], st["rows_written"]) == (5.0, 2.0)
    if kind == "scm":  # rows 1, 2, 3 were read before any write: their initial value computed
        assert st["lazy_init_rows"] == 3.0
    store.close()


# Bad input --------------------------------------------------------------------------------------
BAD_IDS = {
    "past_the_end": (torch.tensor([0, 100]), IndexError, "100"),
    "negative": (torch.tensor([-1, 3]), IndexError, "-1"),
    "float": (torch.tensor([1.0, 2.0]), ValueError, "integer"),
    "2d": (torch.tensor([[1, 2]]), ValueError, "1-D"),
}


@pytest.mark.parametrize("bad", list(BAD_IDS))
@pytest.mark.parametrize("kind", KINDS)
def test_bad_ids_are_rejected_and_nothing_is_written(tmp_path: Path, kind: str, bad: str) -> None:
    store = make_store(kind, tmp_path, 100, 4, 1)
    before = store.read(torch.arange(100))
    ids, exc, match = BAD_IDS[bad]
    name = "dram_t" if kind == "dram" else "t.scm"
    with pytest.raises(exc, match=match) as info:
        store.write(ids, torch.ones(ids.reshape(-1).numel(), 5))
    assert name in str(info.value)
    with pytest.raises(exc, match=match):
        store.read(ids)
    assert store.stats()["rows_written"] == 0
    assert torch.equal(store.read(torch.arange(100)), before)
    store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_bad_rows_are_rejected_and_nothing_is_written(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path, 100, 4, 1)
    before = store.read(torch.arange(100))
    ids = torch.tensor([1, 2])
    for rows, match in [
        (torch.ones(2, 4), "shape"),  # state column missing
        (torch.ones(3, 5), "shape"),  # one row too many
        (torch.ones(2, 5, dtype=torch.float64), "dtype"),
        (torch.ones(2, 5, dtype=torch.float16), "dtype"),
        ([[1.0] * 5] * 2, "torch.Tensor"),
    ]:
        with pytest.raises(ValueError, match=match):
            store.write(ids, rows)
    with pytest.raises(ValueError, match="out"):
        store.read(ids, out=torch.empty(2, 4))
    assert store.stats()["rows_written"] == 0
    assert torch.equal(store.read(torch.arange(100)), before)
    store.close()


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_rows=0), "num_rows"),
    (dict(dim=0), "dim"),
    (dict(state_dim=-1), "state_dim"),
    (dict(init_range=(1.0, -1.0)), "init_range"),
    (dict(init_range=(0.0, float("inf"))), "init_range"),
])
@pytest.mark.parametrize("kind", KINDS)
def test_constructor_rejects(tmp_path: Path, kind: str, kwargs: dict, match: str) -> None:
    args = dict(num_rows=10, dim=4, state_dim=1, init_range=(-0.1, 0.1))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_store(kind, tmp_path, **args)
    assert not (tmp_path / "t.scm").exists()


# Against a model --------------------------------------------------------------------------------
N, DIM, SD = 40, 4, 1


@st.composite
def operations(draw):
    ops = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["write", "write", "read", "flush", "reopen"]))
        ids = draw(st.lists(st.integers(0, N - 1), max_size=12))
        ops.append((kind, ids, draw(st.integers(0, 2**31))))
    return ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), dtype=st.sampled_from(DTYPES), ops=operations())
def test_random_operations_match_a_model(tmp_path: Path, kind: str, dtype: torch.dtype, ops) -> None:
    store = make_store(kind, tmp_path, N, DIM, SD, dtype, seed=5)
    model: Dict[int, torch.Tensor] = {}
    initial = lazy_init_rows(torch.arange(N), DIM, SD, (-0.01, 0.01), 5, dtype)
    for op, ids, seed in ops:
        t = torch.tensor(ids, dtype=torch.long)
        if op == "write":
            rows = rand_rows(len(ids), DIM + SD, dtype, seed)
            store.write(t, rows)
            for i, r in zip(ids, rows):
                model[i] = r
        elif op == "read":
            want = torch.stack([model.get(i, initial[i]) for i in ids]) if ids else torch.empty(0, DIM + SD, dtype=dtype)
            assert torch.equal(store.read(t), want)
        elif op == "flush":
            store.flush()
        elif kind == "scm":  # reopen the file
            store.close()
            store = ScmStore.open(tmp_path / "t.scm")
    everything = torch.stack([model.get(i, initial[i]) for i in range(N)])
    assert torch.equal(store.read(torch.arange(N)), everything)
    store.close()


# ScmStore files --------------------------------------------------------------------------------
def test_scm_reopen_keeps_rows_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "t.scm"
    store = ScmStore(path, 500, 16, 2, torch.bfloat16, (-0.5, 0.5), 77)
    ids = torch.tensor([0, 499, 250])
    rows = rand_rows(3, 18, torch.bfloat16, 4)
    store.write(ids, rows)
    store.close()
    store.close()  # idempotent
    again = ScmStore.open(str(path))  # str or PathLike
    assert (again.num_rows, again.dim, again.state_dim, again.dtype) == (500, 16, 2, torch.bfloat16)
    assert again.init_range == (-0.5, 0.5) and again.seed == 77
    assert torch.equal(again.read(ids), rows)
    assert torch.equal(again.read(torch.arange(1, 10)),
                       lazy_init_rows(torch.arange(1, 10), 16, 2, (-0.5, 0.5), 77, torch.bfloat16))
    again.close()


def test_scm_table_is_a_sparse_file_created_instantly(tmp_path: Path) -> None:
    path = tmp_path / "big.scm"
    store = ScmStore(path, 20_000_000, 64, 1, preallocate=False)  # 5.2 GB of rows
    assert os.path.getsize(path) > 5e9
    assert os.stat(path).st_blocks * 512 < 50e6, "rows never written take no space"
    store.write(torch.tensor([19_999_999]), torch.ones(1, 65))
    assert torch.equal(store.read(torch.tensor([19_999_999])), torch.ones(1, 65))
    store.close()


def test_scm_create_refuses_an_existing_file_unless_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "t.scm"
    store = ScmStore(path, 10, 4, 1)
    store.write(torch.tensor([1]), torch.ones(1, 5))
    store.close()
    with pytest.raises(FileExistsError, match="t.scm"):
        ScmStore(path, 10, 4, 1)
    assert torch.equal(ScmStore.open(path).read(torch.tensor([1])), torch.ones(1, 5)), "left intact"
    fresh = ScmStore(path, 10, 4, 1, overwrite=True)
    assert torch.equal(fresh.read(torch.tensor([1])), lazy_init_rows(torch.tensor([1]), 4, 1, (-0.01, 0.01), 0))
    fresh.close()
    with pytest.raises(FileNotFoundError):
        ScmStore(tmp_path / "no_such_dir" / "t.scm", 10, 4, 1)


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "magic":
        data[0:8] = b"NOTSCM!!"
    elif how == "header_json":
        data[8:20] = b"{{{{{{{{{{{{"
    elif how in ("header_field", "header_field_resealed", "negative_dim_resealed", "digit_flip"):
        # The header's JSON lies in bytes [8, 4092); its CRC-32 (zlib) in [4092, 4096).
        meta = json.loads(bytes(data[8:4092]).rstrip(b"\0"))
        if how == "negative_dim_resealed":
            meta["dim"] = -1
        elif how == "digit_flip":  # num_rows 100 -> 101: one bit, valid JSON, same file size
            meta["num_rows"] = 101
        else:
            del meta["dim"]
        data[8:4092] = json.dumps(meta).encode().ljust(4084, b"\0")
        if how.endswith("resealed"):
            data[4092:4096] = struct.pack("<I", zlib.crc32(bytes(data[:4092])))
    elif how == "truncated":
        data = data[:-1]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how, match", [
    ("magic", "not an SCM table"),
    ("header_json", "corrupted"),
    ("header_field", "checksum mismatch"),
    ("header_field_resealed", "field 'dim' is missing"),
    ("negative_dim_resealed", "dim=-1"),
    ("digit_flip", "checksum mismatch"),
    ("truncated", "truncated"),
])
def test_scm_open_refuses_damaged_or_foreign_files(tmp_path: Path, how: str, match: str) -> None:
    path = tmp_path / "t.scm"
    ScmStore(path, 100, 4, 1).close()
    _damage(path, how)
    with pytest.raises(ValueError, match=match):
        ScmStore.open(path)


def test_scm_open_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.scm"):
        ScmStore.open(tmp_path / "nope.scm")


@pytest.mark.parametrize("op", ["read", "write", "flush"])
def test_scm_closed_store_raises_value_error(tmp_path: Path, op: str) -> None:
    """After close(), read, write and flush raise ValueError naming the file (STYLE: never
    an AttributeError from inside the store)."""
    store = ScmStore(tmp_path / "t.scm", 10, 4, 1)
    store.close()
    calls: Dict[str, Callable[[], object]] = {
        "read": lambda: store.read(torch.tensor([1])),
        "write": lambda: store.write(torch.tensor([1]), torch.ones(1, 5)),
        "flush": store.flush,
    }
    with pytest.raises(ValueError, match="closed"):
        calls[op]()


# ScmStore row checksums ---------------------------------------------------------------------------
def _scm_row_offset(store: ScmStore, row: int) -> int:
    return 4096 + row * store.row_width * store.data.element_size()


def _scm_sum_offset(store: ScmStore, row: int) -> int:
    return 4096 + store.num_rows * store.row_width * store.data.element_size() + 4 * row


@pytest.mark.parametrize("where", ["row data", "optimizer state", "checksum"])
def test_scm_flipped_byte_in_a_row_is_detected_never_returned(tmp_path: Path, where: str) -> None:
    """A flipped bit in a written row (weights or state) or in its checksum: CorruptionError
    naming the file and row; other rows still read; writing the row again repairs it."""
    path = tmp_path / "t.scm"
    rows = torch.randn(50, 9)
    with ScmStore(path, 50, 8, 1) as store:
        store.write(torch.arange(50), rows)
        offset = {"row data": _scm_row_offset(store, 7) + 5,
                  "optimizer state": _scm_row_offset(store, 7) + 8 * 4 + 1,
                  "checksum": _scm_sum_offset(store, 7) + 2}[where]
    flip_byte(path, offset, mask=0x10)
    with ScmStore.open(path) as store:
        with pytest.raises(CorruptionError, match=rf"{path}: row 7 .*crc32c mismatch") as e:
            store.read(torch.tensor([3, 7, 9]))
        assert e.value.errno == errno.EBADMSG and isinstance(e.value, OSError)
        torch.testing.assert_close(store.read(torch.tensor([3, 9, 49])), rows[[3, 9, 49]], rtol=0, atol=0)
        store.write(torch.tensor([7]), rows[[7]])
        torch.testing.assert_close(store.read(torch.tensor([7])), rows[[7]], rtol=0, atol=0)


def test_scm_never_written_rows_read_their_initial_value_and_checksums_track_rewrites(tmp_path: Path) -> None:
    """Rows never written have no checksum (lazy init); every rewrite, repeated ids
    included, leaves checksums that match the bytes (a reopen reads all rows back)."""
    path = tmp_path / "t.scm"
    with ScmStore(path, 1000, 4, 1, seed=5) as store:
        ids = torch.tensor([5, 900, 5, 17])  # 5 twice: the last wins
        store.write(ids, torch.arange(20, dtype=torch.float32).view(4, 5))
        touched = set(ids.tolist())
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            some = torch.randint(0, 1000, (200,), generator=g)
            store.write(some, torch.randn(200, 5, generator=g))
            touched |= set(some.tolist())
        want = store.read(torch.arange(1000))
    with ScmStore.open(path) as store:
        assert store.checksummed
        torch.testing.assert_close(store.read(torch.arange(1000)), want, rtol=0, atol=0)
        untouched = sorted(set(range(1000)) - touched)[:3]
        torch.testing.assert_close(store.read(torch.tensor(untouched)),
                                   lazy_init_rows(torch.tensor(untouched), 4, 1, (-0.01, 0.01), 5))


def test_scm_first_format_files_still_open_unchecked(tmp_path: Path) -> None:
    """A file of the first format (a written-flag byte per row, no "row_checksums" key)
    opens, reads and writes as before."""
    path = tmp_path / "old.scm"
    n, dim, sd = 20, 4, 1
    meta = {"num_rows": n, "dim": dim, "state_dim": sd, "dtype": "float32", "init_range": [-0.01, 0.01], "seed": 3}
    body = b"MTRNSCM1" + json.dumps(meta).encode()
    body = body.ljust(4092, b"\0")
    rows = torch.randn(n, dim + sd)
    written = torch.zeros(n, dtype=torch.uint8)
    written[:10] = 1
    path.write_bytes(body + struct.pack("<I", zlib.crc32(body)) + rows.numpy().tobytes() + written.numpy().tobytes())
    with ScmStore.open(path) as store:
        assert not store.checksummed
        torch.testing.assert_close(store.read(torch.arange(10)), rows[:10], rtol=0, atol=0)
        torch.testing.assert_close(store.read(torch.tensor([15])),
                                   lazy_init_rows(torch.tensor([15]), dim, sd, (-0.01, 0.01), 3))
        store.write(torch.tensor([15]), rows[[0]])
    with ScmStore.open(path) as store:
        torch.testing.assert_close(store.read(torch.tensor([15])), rows[[0]], rtol=0, atol=0)
