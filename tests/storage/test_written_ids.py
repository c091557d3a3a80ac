"""RowStore.written_ids: the rows of a range that may differ from their initial value.

For every store: after writes of random ids (with repeats), written_ids over empty, full
and partial ranges (some crossing the location map's chunk boundaries) lists exactly the
rows written (DramStore, which does not track writes: every row), ascending int64; every
row not listed reads as lazy_init_rows of its id. The BlockStore runs with no cache (rows
only in the location map), a large cache (rows only dirty in the cache), and a small one
(both, overlapping), then after a flush, more writes, reads that evict, and close + open.
Ranges outside [0, num_rows] raise IndexError naming the table and the range.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

from torchrec_mtrains.storage import BlockStore, DramStore, RowStore, ScmStore, lazy_init_rows

CHUNK = 4096  # LocationMap::kChunkRows (csrc/storage/location_map.h)
N = 3 * CHUNK + 1000  # four map chunks, the last one short
DIM, STATE_DIM = 4, 1
INIT = (-0.05, 0.05)
SEED = 7
OUT_OF_RANGE = [(0, N + 1), (-1, 3), (5, 4), (N + 1, N + 2), (N, N + 1)]


def ranges(n: int) -> List[Tuple[int, int]]:
    """Empty, full and partial ranges; several cross a chunk boundary or end at the table's end."""
    return [
        (0, 0), (5000, 5000), (n, n), (0, n), (1, n - 1),
        (CHUNK - 1, CHUNK + 1), (CHUNK - 7, CHUNK + 9), (CHUNK, 2 * CHUNK),
        (2 * CHUNK - 100, 3 * CHUNK + 100), (3 * CHUNK - 3, n), (n - 10, n), (0, 1),
    ]


class Model:
    """The rows written so far (last write wins)."""

    def __init__(self) -> None:
        self.rows: Dict[int, torch.Tensor] = {}
        self._gen = torch.Generator().manual_seed(1234)

    def write(self, store: RowStore, count: int) -> None:
        """Writes `count` random ids (repeats included, and the ids at chunk edges)."""
        ids = torch.randint(0, N, (count,), generator=self._gen)
        edges = torch.tensor([0, CHUNK - 1, CHUNK, CHUNK, 2 * CHUNK - 1, N - 1, 0])
        ids = torch.cat([ids, edges, ids[: count // 10]])
        rows = torch.randn(ids.numel(), DIM + STATE_DIM, generator=self._gen)
        store.write(ids, rows)
        for i, r in zip(ids.tolist(), rows):
            self.rows[i] = r


def check_written(store: RowStore, expected: List[int]) -> None:
    for start, stop in ranges(N):
        got = store.written_ids(start, stop)
        assert got.dtype == torch.int64 and got.dim() == 1, (start, stop, got.dtype, got.shape)
        want = [i for i in expected if start <= i < stop]
        assert got.tolist() == want, f"range [{start}, {stop}): {len(got)} ids, want {len(want)}"


def check_reads(store: RowStore, model: Model) -> None:
    """Rows not listed read as their initial value; written rows read what was written."""
    listed = store.written_ids(0, N)
    unlisted = torch.ones(N, dtype=torch.bool)
    unlisted[listed] = False
    ids = unlisted.nonzero().view(-1)
    assert ids.numel() > 0
    assert torch.equal(store.read(ids), lazy_init_rows(ids, DIM, STATE_DIM, INIT, SEED))
    written = torch.tensor(sorted(model.rows))
    assert torch.equal(store.read(written), torch.stack([model.rows[i] for i in written.tolist()]))


def check_out_of_range(store: RowStore, label: str) -> None:
    for start, stop in OUT_OF_RANGE:
        with pytest.raises(IndexError, match=rf"{re.escape(label)}.*\[{start}, {stop}\)"):
            store.written_ids(start, stop)
    with pytest.raises(ValueError, match="start"):
        store.written_ids(1.5, 4)


def test_dram_store_lists_every_row() -> None:
    store = DramStore(N, DIM, STATE_DIM, init_range=INIT, seed=SEED, name="dram_t")
    check_written(store, list(range(N)))
    Model().write(store, 3000)
    check_written(store, list(range(N)))
    check_out_of_range(store, "dram_t")


def test_scm_store(tmp_path: Path) -> None:
    path = tmp_path / "t.scm"
    store = ScmStore(path, N, DIM, STATE_DIM, init_range=INIT, seed=SEED)
    check_written(store, [])
    model = Model()
    model.write(store, 3000)
    check_written(store, sorted(model.rows))
    check_reads(store, model)
    check_out_of_range(store, str(path))
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.written_ids(0, 1)
    again = ScmStore.open(path)
    check_written(again, sorted(model.rows))
    model.write(again, 500)
    check_written(again, sorted(model.rows))
    check_reads(again, model)
    again.close()


@pytest.mark.parametrize("cache", ["none", "small", "large"])
def test_block_store(tmp_path: Path, cache: str) -> None:
    cache_mb = {"none": 0.0, "small": 0.05, "large": 4.0}[cache]  # small: ~870 of N rows
    path = tmp_path / "t.tbl"
    store = BlockStore(path, N, DIM, STATE_DIM, dram_cache_mb=cache_mb, init_range=INIT, seed=SEED,
                       segment_blocks=8)
    check_written(store, [])
    model = Model()
    model.write(store, 3000)
    stats = store.stats()
    # Where the written rows are: only the map, only the cache, or both.
    if cache == "none":
        assert stats["cache_dirty_rows"] == 0 and stats["rows_appended"] > 0
    elif cache == "large":
        assert stats["cache_dirty_rows"] == len(model.rows) and stats["rows_appended"] == 0
    else:
        assert stats["cache_dirty_rows"] > 0 and stats["rows_appended"] > 0
    check_written(store, sorted(model.rows))
    store.flush()
    assert store.stats()["cache_dirty_rows"] == 0
    check_written(store, sorted(model.rows))
    model.write(store, 2000)  # rewrites of flushed rows and new ones, dirty again
    check_written(store, sorted(model.rows))
    check_reads(store, model)  # reads evict dirty rows into the log: the set stays
    check_written(store, sorted(model.rows))
    check_out_of_range(store, str(path))
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.written_ids(0, 1)
    with BlockStore.open(path, dram_cache_mb=cache_mb) as again:
        check_written(again, sorted(model.rows))
        check_reads(again, model)
        model.write(again, 500)
        check_written(again, sorted(model.rows))


def test_block_store_binding_checks_the_range(tmp_path: Path) -> None:
    """The C++ method refuses a bad range itself (status, not a crash), naming the file."""
    path = tmp_path / "t.tbl"
    with BlockStore(path, N, DIM, STATE_DIM, dram_cache_mb=0) as store:
        for first, count in [(N - 5, 10), (N + 1, 0), (-1, 2), (0, -1)]:
            (code, _, message), ids = store._handle.written_rows(first, count)
            assert code == 2 and str(path) in message and ids.numel() == 0, (first, count, message)
        (code, _, _), ids = store._handle.written_rows(N, 0)
        assert code == 0 and ids.numel() == 0
