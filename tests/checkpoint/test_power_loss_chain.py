"""Differential checkpoint chains across power cuts: crash images of the checkpoint
directory, recorded while a model trains and saves (full steps, deltas, a new chain that
retires the old one), checked as a restore finds them.

The recorder (tests/support/fs_record.py) wraps the file operations the checkpointer and DCP do
(fsync, rename/replace, link, mkdir, unlink, rmdir); each crash image keeps what was synced
and loses or keeps, independently, each directory entry and file write since. A restore
must either find a complete checkpoint -- ``latest`` names a step no older than the last
save that returned, and every file of its chain is what the saves wrote -- or, before any
save returned, find none. (Linked SSD tables are the live store's files, whose own crash
safety is the block store's: their bytes are not compared here.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch

from tests.support import dmp_harness as harness
from tests.support.fs_record import FsRecorder, check_crash_images
from tests.support.power_loss import NIGHTLY_IMAGES, images_wanted, nightly
from torchrec_mtrains.checkpoint import ChainError, DifferentialCheckpointer
from torchrec_mtrains.checkpoint.chain import latest_checkpoint, read_chain, step_of
from torchrec_mtrains.checkpoint.integrity import check_files

TIERS = {"ssd_a": "ssd", "ssd_b": "ssd", "scm_c": "scm", "plain_d": None}
SAVES = [1, 2, 3, 4]  # full, delta, full (a new chain: the old one goes), delta


def _step_files(step_dir: Path) -> Dict[str, str]:
    """The step's files (relative path -> path), the linked store files excluded."""
    return {os.path.relpath(p, step_dir): p for p in map(str, step_dir.rglob("*"))
            if os.path.isfile(p) and os.sep + "links" + os.sep not in p}


class Workload:
    """The recorded saves; marks ("begin", step) and ("saved", step)."""

    def __init__(self, tmp: Path) -> None:
        from torchrec_mtrains.sharding import TieredTrainPipeline

        torch.save(harness.initial_weights(), tmp / "init.pt")
        spec = harness.RunSpec(world_size=1, steps=0, out_dir=str(tmp), storage_dir=str(tmp / "storage"), tiers=TIERS)
        dmp, opt = harness._build(spec, 0)
        harness._load_initial(dmp, str(tmp / "init.pt"))
        self.root = tmp / "ckpt"
        self.root.mkdir()
        self.rec = FsRecorder(self.root, opaque=lambda rel: f"{os.sep}links{os.sep}" in os.sep + rel)
        self.saved: Dict[int, Dict[str, bytes]] = {}  # step -> its files' bytes
        ckpt = DifferentialCheckpointer(str(self.root), full_every=2, max_chain_fraction=100.0)
        pipeline = TieredTrainPipeline(dmp, opt, torch.device("cpu"))
        batches = iter([harness.local_batch(s, 0, 1) for s in range(max(SAVES))])
        with self.rec.patch():
            for step in range(1, max(SAVES) + 1):
                pipeline.progress(batches)
                if step not in SAVES:
                    continue
                self.rec.mark(("begin", step))
                record = ckpt.save(step, dmp, None, {"at": step})
                files = _step_files(Path(record.path))
                self.saved[step] = {rel: Path(p).read_bytes() for rel, p in files.items()}
                self.rec.mark(("saved", step))
        pipeline.detach()

    def check(self, point: int, image: Path) -> Optional[str]:
        """None when a restore finds what it must in the image, else what is wrong."""
        begun, returned = 0, None
        for m in self.rec.marks_before(point):
            if m[0] == "begin":
                begun = m[1]
            else:
                returned = m[1]
        latest = latest_checkpoint(str(image))
        if latest is None:
            return None if returned is None else f"no complete checkpoint, but the save of step {returned} returned"
        step = step_of(os.path.basename(latest))
        if step is None or step > begun or (returned is not None and step < returned):
            return f"latest names {os.path.basename(latest)}: the saves begun were up to {begun}, returned {returned}"
        try:
            chain = read_chain(latest)
            check_files(chain)
        except ChainError as e:
            return f"the restore refuses {os.path.basename(latest)} (saves returned up to {returned}): {e}"
        for s in chain:
            have = _step_files(Path(s.reader.path))
            for rel, data in self.saved[s.step].items():
                if rel not in have:
                    return f"step {s.step} of the chain of {step} has no {rel}"
                if Path(have[rel]).read_bytes() != data:
                    return f"step {s.step}'s {rel} is not what its save wrote"
        return None


def run_images(tmp: Path, images: int, seed: int) -> Dict[str, int]:
    w = Workload(tmp)
    return check_crash_images(w.rec, w.check, tmp, images, seed)


def test_checkpoint_chain_survives_power_loss(process_group, tmp_path: Path) -> None:
    images = images_wanted()
    assert run_images(tmp_path, images, seed=1)["images"] >= images


@pytest.mark.nightly
@nightly
@pytest.mark.parametrize("seed", [2, 3])
def test_checkpoint_chain_survives_power_loss_nightly(process_group, tmp_path: Path, seed: int) -> None:
    assert run_images(tmp_path, NIGHTLY_IMAGES, seed)["images"] >= NIGHTLY_IMAGES
