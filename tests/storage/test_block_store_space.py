"""The block store's disk space follows the rows written, not the table's logical size.

A table's log is sized for every row, but a lazily initialised table of hundreds of millions
of rows may write only a fraction of them, over and over. The log must then collect its
garbage within space proportional to the rows written (times the overprovision), instead of
filling the whole log -- on a disk that could never hold it -- before reclaiming any.
"""

import os

import torch

from torchrec_mtrains.storage import BlockStore

ROWS = 4_000_000  # a 272 MB table at 68-B rows (log: 408 MB)
DIM = 16
HOT = 20_000  # rows rewritten every round...
FRESH = 2_000  # ...mixed with rows written once (so segments hold both: none empties alone)
ROUNDS = 60
SEGMENT_BLOCKS = 16  # 64 KiB segments: the collector's reserve is small beside the rows


def _disk_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


def test_rewriting_few_rows_of_a_large_table_stays_within_their_space(tmp_path):
    path = str(tmp_path / "t.blk")
    log = str(tmp_path / "t.log")  # the log in a file of its own: its space alone is measured
    store = BlockStore(path, ROWS, DIM, dram_cache_mb=0, direct_io=False, segment_blocks=SEGMENT_BLOCKS,
                       stripe_paths=[log], overwrite=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randperm(ROWS, generator=gen)[:HOT + ROUNDS * FRESH]
    hot, fresh = ids[:HOT], ids[HOT:].view(ROUNDS, FRESH)
    for r in range(ROUNDS):
        batch = torch.cat([hot, fresh[r]])[torch.randperm(HOT + FRESH, generator=gen)]
        store.write(batch, batch.float().unsqueeze(1).expand(-1, DIM + 1) + r)
        store.flush()
    stats = store.stats()
    row_bytes = (DIM + 1) * 4
    appended = stats["rows_appended"] * row_bytes
    assert appended >= ROUNDS * (HOT + FRESH) * row_bytes  # every round went to the log
    assert stats["live_rows"] == HOT + ROUNDS * FRESH
    assert stats["gc_segments_freed"] > 0
    # The live rows' blocks (53 rows to a 4 KiB block) times the overprovision, plus the
    # collector's reserve of 192 segments (12 MiB): far below what was appended.
    live_bytes = stats["live_rows"] / 53 * 4096
    disk = _disk_bytes(log)
    assert disk <= 1.6 * live_bytes + 13 * 2**20, (disk, live_bytes, appended)
    assert disk < appended / 2, (disk, appended)

    def expected(rows: torch.Tensor, last_round: torch.Tensor) -> torch.Tensor:
        return rows.float().unsqueeze(1).expand(-1, DIM + 1) + last_round.float().unsqueeze(1)

    rounds = torch.arange(ROUNDS).repeat_interleave(FRESH)
    want_hot, want_fresh = expected(hot, torch.full((HOT,), ROUNDS - 1)), expected(fresh.reshape(-1), rounds)
    assert torch.equal(store.read(hot), want_hot)
    assert torch.equal(store.read(fresh.reshape(-1)), want_fresh)
    store.close()
    reopened = BlockStore.open(path, dram_cache_mb=0, direct_io=False)
    assert torch.equal(reopened.read(hot), want_hot)
    assert torch.equal(reopened.read(fresh.reshape(-1)), want_fresh)
    reopened.close()
