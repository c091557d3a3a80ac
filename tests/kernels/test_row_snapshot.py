"""RowSnapshot: selected rows as of the snapshot, however training's writes to the tier and
the save's reads interleave (copy-on-write), against the rows copied at the snapshot."""

from __future__ import annotations

import os
import tempfile
import threading

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_mtrains.kernels.dirty_rows import DirtyRows
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot
from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.dram_store import DramStore

ROWS, DIM = 64, 4


@settings(max_examples=40, deadline=None)
@given(
    selected=st.sets(st.integers(0, ROWS - 1), min_size=1),
    held=st.sets(st.integers(0, ROWS - 1)),
    writes=st.lists(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=10), max_size=8),
    reads=st.integers(1, 8),
)
def test_reads_give_the_rows_as_of_the_snapshot_whatever_was_written(selected, held, writes, reads) -> None:
    store = DramStore(ROWS, DIM, state_dim=1, seed=5)
    chosen = DirtyRows(ROWS)
    chosen.mark(torch.tensor(sorted(selected)))
    held_ids = torch.tensor(sorted(held & selected), dtype=torch.int64)
    held_rows = torch.full((held_ids.numel(), DIM + 1), -7.0)  # the cache's newer copies
    want = store.data.clone()
    want[held_ids] = held_rows
    snapshot = RowSnapshot(store, chosen, DIM + 1, torch.float32, (held_ids, held_rows))
    ids = chosen.ids()
    parts = list(torch.tensor_split(ids, reads))
    got = []
    for n, part in enumerate(parts):  # writes and reads interleaved
        for w in writes[n::reads]:
            w = torch.tensor(w, dtype=torch.int64)
            snapshot.before_write(w)
            store.write(w, torch.full((w.numel(), DIM + 1), float(n + 1)))
        got.append(snapshot.read(part))
    assert torch.equal(torch.cat(got), want[ids])
    snapshot.release()


def test_a_writer_on_another_thread_never_changes_what_the_save_reads() -> None:
    store = DramStore(4096, DIM, state_dim=1, seed=2)
    chosen = DirtyRows(4096)
    chosen.mark(torch.arange(0, 4096, 2))
    want = store.data[chosen.ids()].clone()
    snapshot = RowSnapshot(store, chosen, DIM + 1, torch.float32)
    stop = threading.Event()

    def writer() -> None:
        g = torch.Generator().manual_seed(0)
        while not stop.is_set():
            ids = torch.randint(0, 4096, (64,), generator=g)
            snapshot.before_write(ids)
            store.write(ids, torch.randn(64, DIM + 1, generator=g))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        got = torch.cat([snapshot.read(part) for part in torch.split(chosen.ids(), 100)])
    finally:
        stop.set()
        thread.join()
    assert torch.equal(got, want)


@settings(max_examples=25, deadline=None)
@given(
    selected=st.sets(st.integers(0, 4 * ROWS - 1), min_size=1),
    writes=st.lists(st.lists(st.integers(0, 4 * ROWS - 1), min_size=1, max_size=40), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_block_store_rows_are_read_in_log_order_and_as_of_the_snapshot(selected, writes, seed) -> None:
    """The block store's rows, written in a shuffled order, are read in the log's order
    (storage_order), each as of the snapshot whatever training writes in between."""
    rows = 4 * ROWS
    with tempfile.TemporaryDirectory() as tmp:
        store = BlockStore(os.path.join(tmp, "t.bin"), rows, DIM, dram_cache_mb=0, seed=seed)
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(rows, generator=g)[: rows // 2]  # half the rows written, shuffled
        store.write(order, torch.randn(order.numel(), DIM + 1, generator=g))
        chosen = DirtyRows(rows)
        chosen.mark(torch.tensor(sorted(selected)))
        ids = chosen.ids()
        want = store.read(ids)
        snapshot = RowSnapshot(store, chosen, DIM + 1, torch.float32)
        parts = list(torch.tensor_split(ids, max(1, len(writes))))
        got = []
        for n, part in enumerate(parts):
            if n < len(writes):
                w = torch.tensor(writes[n], dtype=torch.int64)
                snapshot.before_write(w)
                store.write(w, torch.full((w.numel(), DIM + 1), float(n + 1)))
            got.append(snapshot.read(part))
        assert torch.equal(torch.cat(got), want)
        snapshot.release()
        store.close()
