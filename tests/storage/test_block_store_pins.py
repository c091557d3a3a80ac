"""Pins of the block store: a checkpoint that hard-links a table's file keeps the log
segments its map entries point into, while training goes on writing (and collecting
garbage) in the same file.
"""

from __future__ import annotations

import errno
import hashlib

import pytest
import torch

from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.block_store import StoreRuntimeConfig
from torchrec_mtrains.storage.types import CorruptionError

ROWS = 3000
DIM = 8
WIDTH = DIM + 1
RUNTIME = StoreRuntimeConfig(dram_cache_mb=0.0, direct_io=False)


def _store(path, **kw) -> BlockStore:
    # Small segments (2 blocks, ~200 rows): a few rewrites of the table exercise the collector.
    args = dict(dram_cache_mb=0, direct_io=False, segment_blocks=2, overprovision=2.0)
    args.update(kw)
    return BlockStore(str(path), ROWS, DIM, **args)


def _rows(ids: torch.Tensor, version: int) -> torch.Tensor:
    return ids.float().unsqueeze(1).expand(-1, WIDTH) * 10 + version


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


ALL = torch.arange(ROWS)


def test_pinned_rows_survive_rewrites_and_unpin_reclaims_them(tmp_path):
    store = _store(tmp_path / "t.blk")
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(1)
    ids, locs = store.snapshot_entries(1, 0, ROWS)
    assert torch.equal(ids, ALL) and bool((locs >= 1).all())
    for version in range(1, 6):
        store.write(ALL, _rows(ALL, version))
        store.flush()
    stats = store.stats()
    assert stats["gc_segments_freed"] > 0  # the collector ran beside the pins
    assert stats["pinned_segments"] > 0 and stats["retained_segments"] > 0
    assert stats["pin_tags"] == 1 and store.pin_tags() == [1]
    assert torch.equal(store.read_locations(ids, locs), _rows(ALL, 0))
    assert torch.equal(store.read(ALL), _rows(ALL, 5))
    free_before = stats["free_segments"]
    store.unpin_snapshot(1)
    store.unpin_snapshot(99)  # unknown: nothing
    store.flush()
    stats = store.stats()
    assert store.pin_tags() == []
    assert stats["pinned_segments"] == 0 and stats["retained_segments"] == 0
    assert stats["free_segments"] > free_before  # the retained segments came back
    store.close()


def test_writes_with_pins_take_never_used_segments(tmp_path):
    # A few hot rows of a large log, pinned after every round: every dead segment is kept,
    # so the collector has no victim, yet writes go on in never-used segments.
    store = _store(tmp_path / "t.blk", overprovision=4.0)
    hot = torch.arange(400)
    snapshots = []
    for version in range(20):
        store.write(hot, _rows(hot, version))
        store.pin_snapshot(version)
        snapshots.append(store.snapshot_entries(version, 0, ROWS))
    store.flush()
    stats = store.stats()
    assert stats["retained_segments"] > 0 and stats["pin_tags"] == 20
    assert stats["free_segments"] > 0
    for version, (ids, locs) in enumerate(snapshots):
        assert torch.equal(ids, hot)
        assert torch.equal(store.read_locations(ids, locs), _rows(hot, version))
    store.close()


def test_a_log_full_of_pinned_segments_reports_enospc_then_recovers(tmp_path):
    store = _store(tmp_path / "t.blk", segment_blocks=1, overprovision=0.5)
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(4)
    with pytest.raises(OSError, match="pinned") as e:
        for version in range(1, 4):
            store.write(ALL, _rows(ALL, version))
    assert e.value.errno == errno.ENOSPC
    store.unpin_snapshot(4)
    store.write(ALL, _rows(ALL, 9))
    store.flush()
    assert torch.equal(store.read(ALL), _rows(ALL, 9))
    store.close()


def test_open_adopted_restores_the_snapshot(tmp_path):
    path = tmp_path / "t.blk"
    store = _store(path)
    first = torch.arange(500)
    store.write(first, _rows(first, 0))
    store.pin_snapshot(7)
    expected = store.read(ALL)
    ids, locs = store.snapshot_entries(7, 0, ROWS)
    assert torch.equal(ids, first)
    later = torch.arange(1000)  # rows 500..999 are written only after the pin
    for version in range(1, 4):
        store.write(later, _rows(later, version))
        store.flush()
    store.close()

    adopted = BlockStore.open_adopted(path, ids, locs, 7, RUNTIME)
    assert adopted.pin_tags() == [7]
    assert torch.equal(adopted.read(ALL), expected)
    assert torch.equal(adopted.written_ids(0, ROWS), first)
    # Training goes on from the snapshot without touching its segments.
    adopted.write(later, _rows(later, 50))
    adopted.flush()
    assert torch.equal(adopted.read_locations(ids, locs), expected[:500])
    adopted.close()
    assert torch.equal(BlockStore.open(path, dram_cache_mb=0, direct_io=False).read(later), _rows(later, 50))

    again = BlockStore.open_adopted(path, ids, locs, 7, RUNTIME)
    again.close()
    reopened = BlockStore.open(path, dram_cache_mb=0, direct_io=False)
    assert torch.equal(reopened.read(ALL), expected)
    assert torch.equal(reopened.written_ids(0, ROWS), first)
    reopened.close()


def test_pin_locations_after_reopen_keeps_freed_segments(tmp_path):
    path = tmp_path / "t.blk"
    store = _store(path)
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(1)
    ids, locs = store.snapshot_entries(1, 0, ROWS)
    store.write(ALL, _rows(ALL, 1))  # the pinned segments are now dead: retained
    store.close()  # pins are not persisted: those segments are free in the next session

    store = BlockStore.open(path, dram_cache_mb=0, direct_io=False)
    store.pin_locations(5, locs)
    assert store.stats()["retained_segments"] > 0
    for version in range(2, 7):
        store.write(ALL, _rows(ALL, version))
        store.flush()
    assert torch.equal(store.read_locations(ids, locs), _rows(ALL, 0))
    with pytest.raises(ValueError, match="appended since the store was opened"):
        store.pin_locations(6, locs)
    store.close()


def test_snapshot_entries_refused_after_a_write(tmp_path):
    store = _store(tmp_path / "t.blk")
    store.write(ALL, _rows(ALL, 0))
    with pytest.raises(ValueError, match="tag 3"):
        store.snapshot_entries(3, 0, ROWS)  # never pinned
    store.pin_snapshot(3)
    store.snapshot_entries(3, 0, 10)
    with pytest.raises(IndexError):
        store.snapshot_entries(3, 0, ROWS + 1)
    store.write(torch.tensor([5]), _rows(torch.tensor([5]), 1))
    with pytest.raises(ValueError, match="tag 3"):
        store.snapshot_entries(3, 0, ROWS)
    store.pin_snapshot(3)  # pinning again takes the current entries
    ids, locs = store.snapshot_entries(3, 0, ROWS)
    assert torch.equal(store.read_locations(ids, locs), store.read(ALL))
    store.close()


def test_open_read_only_writes_nothing_and_refuses_writes(tmp_path):
    path = tmp_path / "t.blk"
    store = _store(path)
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(1)
    ids, locs = store.snapshot_entries(1, 0, ROWS)
    table_uuid = store.table_uuid
    store.close()
    digest = _sha(path)

    reader = BlockStore.open_read_only(path, RUNTIME)
    assert reader.table_uuid == table_uuid and reader.stripe_paths == []
    assert torch.equal(reader.read_locations(ids, locs), _rows(ALL, 0))
    for call in (
        lambda: reader.write(ids[:1], _rows(ids[:1], 1)),
        lambda: reader.read(ids[:1]),
        lambda: reader.flush(),
        lambda: reader.written_ids(0, ROWS),
        lambda: reader.pin_snapshot(1),
        lambda: reader.snapshot_entries(1, 0, ROWS),
    ):
        with pytest.raises(ValueError, match="read-only snapshot reader"):
            call()
    assert reader.pin_tags() == []
    assert reader.stats()["log_segments"] > 0
    reader.close()
    assert _sha(path) == digest


def test_read_locations_checks_the_row_it_finds(tmp_path):
    store = _store(tmp_path / "t.blk")
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(1)
    ids, locs = store.snapshot_entries(1, 0, ROWS)
    wrong = ids.clone()
    wrong[10] = 11
    with pytest.raises(CorruptionError, match=f"row 11 at location {int(locs[10])}"):
        store.read_locations(wrong, locs)
    with pytest.raises(ValueError, match="location 0 at position 0"):
        store.read_locations(ids[:1], torch.tensor([0]))
    with pytest.raises(ValueError, match="location 999999999"):
        store.read_locations(ids[:1], torch.tensor([999_999_999]))
    with pytest.raises(IndexError, match=str(ROWS)):
        store.read_locations(torch.tensor([ROWS]), locs[:1])
    store.close()


def test_open_adopted_rejects_bad_entries_and_changes_nothing(tmp_path):
    path = tmp_path / "t.blk"
    store = _store(path)
    store.write(ALL, _rows(ALL, 0))
    store.pin_snapshot(1)
    ids, locs = store.snapshot_entries(1, 0, ROWS)
    store.close()
    digest = _sha(path)
    unsorted = ids.clone()
    unsorted[[3, 4]] = unsorted[[4, 3]]
    with pytest.raises(ValueError, match="id 3 at position 4 follows 4"):
        BlockStore.open_adopted(path, unsorted, locs, 1, RUNTIME)
    zero = locs.clone()
    zero[7] = 0
    with pytest.raises(ValueError, match="location 0 at position 7"):
        BlockStore.open_adopted(path, ids, zero, 1, RUNTIME)
    past = locs.clone()
    past[2] = 10**12
    with pytest.raises(ValueError, match=f"location {10**12} of row 2"):
        BlockStore.open_adopted(path, ids, past, 1, RUNTIME)
    with pytest.raises(ValueError, match=f"row {ROWS}"):
        BlockStore.open_adopted(path, torch.tensor([ROWS]), locs[:1], 1, RUNTIME)
    with pytest.raises(ValueError, match="pin_tag=-1"):
        BlockStore.open_adopted(path, ids, locs, -1, RUNTIME)
    assert _sha(path) == digest


def test_a_pin_costs_the_space_of_the_rows_superseded_since_not_a_second_table(tmp_path):
    # Two stores take the same writes; one is pinned after the first. Then a hot tenth of
    # the rows is rewritten, shuffled with new rows, round after round: segments end up
    # partly dead and the collector works to the space budget. The pinned store also keeps
    # the segments of the pinned versions of the hot rows -- and only those: the rest of its
    # pinned segments are live rows, which the budget counts already.
    logical, first = 300_000, torch.arange(30_000)
    hot = first[:3_000]
    gen = torch.Generator().manual_seed(0)
    stores = [BlockStore(str(tmp_path / f"{n}.blk"), logical, DIM, dram_cache_mb=0, direct_io=False,
                         segment_blocks=2, overprovision=0.2) for n in ("pinned", "plain")]
    for s in stores:
        s.write(first, _rows(first, 0))
        s.flush()
    pinned, plain = stores
    pinned.pin_snapshot(1)
    for version in range(1, 100):
        new = torch.arange(30_000 + 600 * (version - 1), 30_000 + 600 * version)
        ids = torch.cat([hot, new])
        ids = ids[torch.randperm(ids.numel(), generator=gen)]
        for s in stores:
            s.write(ids, _rows(ids, version))
            s.flush()

    def in_use(s: BlockStore) -> int:
        stats = s.stats()
        return int(stats["log_segments"] - stats["free_segments"])

    held = int(pinned.stats()["pinned_segments"])
    assert held > 100 and all(s.stats()["gc_rows_moved"] > 0 for s in stores)
    # The hot rows' pinned versions fill a tenth of the pinned segments (counting pinned
    # segments whole would let the pinned store grow by all of them).
    assert in_use(pinned) - in_use(plain) <= held // 4
    for s in stores:
        s.close()
