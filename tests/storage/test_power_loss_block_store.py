"""BlockStore across power cuts: the C++ driver csrc/tests/test_power_loss.cc, built and run.

The driver runs the real BlockStore on in-memory files that record every write and sync
(Create's header, flushed and unflushed generations of row writes through a small row
cache that make the collector free segments, the map journal grow and checkpoints rewrite
map pages in place, a pinned snapshot, a close and reopen, a clean close), then opens at
least ``MTRAINS_POWER_LOSS_IMAGES`` crash images (default 1,000) with BlockStore::Open and
reads every row with BlockStore::Read: the table must open once Create returned, and every
row must read as a version written to it, none older than at the last flush that returned.
"""

from __future__ import annotations

import pytest

from tests.support.power_loss import NIGHTLY_IMAGES, images_wanted, nightly, run_driver


def _check(counts: dict, images: int) -> None:
    assert counts["failures"] == 0, counts
    assert counts["images"] >= images, counts
    # Every crash point is cut at least at its syncs; points with writes in flight also in
    # issue order and at random (lost, reordered, torn).
    assert counts["synced"] == counts["points"] and counts["in_order"] > 0 and counts["random"] > 0, counts
    # The workload reached the interesting writes: segments freed by the collector, map
    # checkpoints (pages written in place, some of the images tear them) and journal commits.
    assert counts["gc_segments_freed"] > 0 and counts["map_checkpoints"] > 1 and counts["journal_commits"] > 1, counts
    assert counts["torn_map_page_opens"] > 0, counts


def test_block_store_survives_power_loss() -> None:
    images = images_wanted()
    _check(run_driver(images, seed=1), images)


@pytest.mark.nightly
@nightly
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_block_store_survives_power_loss_nightly(seed: int) -> None:
    _check(run_driver(NIGHTLY_IMAGES, seed), NIGHTLY_IMAGES)
