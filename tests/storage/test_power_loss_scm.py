"""ScmStore across power cuts: crash images of a recorded workload, opened and read.

The workload creates a table, then writes generations of rows (row id and generation in
every row, so which write a row holds is decodable and a mix is not), flushing (msync)
after most. The recorder (tests/support/fs_record.py) snapshots the directory after each write
and sync; each crash image keeps what was synced, and any 4 KiB page written since may
hold its bytes as of any moment since (the kernel writes dirty pages back whenever it
likes), some torn at 512-byte sectors. Checked against ScmStore's crash contract:
  - once the constructor returned, the table opens (its file and directory entry are
    durable);
  - a row not written since the last flush that returned reads as of that flush;
  - a row written since reads as one of its versions since, or raises CorruptionError
    naming it (its bytes and checksum from different moments), never a mix or garbage.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import torch

from tests.support.fs_record import FsRecorder, check_crash_images
from tests.support.power_loss import NIGHTLY_IMAGES, images_wanted, nightly
from torchrec_mtrains.storage import ScmStore
from torchrec_mtrains.storage.types import CorruptionError

ROWS, DIM, STATE, SEED = 512, 6, 2, 5
GENERATIONS = 24


def _row(r: int, gen: int) -> List[float]:
    return [float(r), float(gen)] + [float((r * 7 + gen * 13 + k) % 65521) for k in range(DIM + STATE - 2)]


def _generations(rows: torch.Tensor) -> torch.Tensor:
    """Per row, the generation it holds (-1 for bytes that are no version of it)."""
    r = torch.arange(ROWS, dtype=torch.float64)
    gen = rows[:, 1].double()
    k = torch.arange(DIM + STATE - 2, dtype=torch.float64)
    rest = torch.remainder(r[:, None] * 7 + gen[:, None] * 13 + k[None, :], 65521)
    want = torch.cat([r[:, None], gen[:, None], rest], dim=1).float()
    ok = (rows == want).all(dim=1) & (gen >= 1) & (gen == gen.round())
    return torch.where(ok, gen.long(), torch.full_like(gen, -1).long())


class Workload:
    """The recorded life of one table: marks ("created",), ("gen", g), ("flushed", g)."""

    def __init__(self, root: Path, seed: int) -> None:
        self.root, self.path = root, root / "t.scm"
        root.mkdir(parents=True)
        rng = random.Random(seed)
        self.written: Dict[int, List[int]] = {r: [] for r in range(ROWS)}
        self.flushed: Dict[int, List[int]] = {}  # generation -> each row's version then
        self.rec = FsRecorder(root)
        version = [0] * ROWS
        with self.rec.patch():
            store = ScmStore(self.path, ROWS, DIM, STATE, seed=SEED)
            self.flushed[0] = list(version)
            self.rec.mark(("flushed", 0))
            for gen in range(1, GENERATIONS + 1):
                self.rec.mark(("gen", gen))
                # Two writes a generation: the kernel may write back the pages between them.
                for _ in range(2):
                    ids = sorted(rng.sample(range(ROWS), 40) + rng.sample(range(64), 8))
                    ids = sorted(set(ids))
                    store.write(torch.tensor(ids), torch.tensor([_row(r, gen) for r in ids]))
                    for r in ids:
                        version[r] = gen
                        if self.written[r][-1:] != [gen]:
                            self.written[r].append(gen)
                    self.rec.written()
                if gen % 3 == 2:
                    continue  # not flushed: the next flush takes it
                store.flush()
                self.rec.synced(self.path)
                self.flushed[gen] = list(version)
                self.rec.mark(("flushed", gen))
            store.close()
            self.rec.synced(self.path)
        fresh_root = root.parent / (root.name + "-init")
        fresh_root.mkdir()
        init = ScmStore(fresh_root / "t.scm", ROWS, DIM, STATE, seed=SEED)
        self.init_rows = init.read(torch.arange(ROWS)).clone()
        init.close()

    def check(self, point: int, image: Path) -> Optional[str]:
        """None when the image holds up to the contract, else what is wrong."""
        flushed_gen, gen = None, 0
        for m in self.rec.marks_before(point):
            if m[0] == "flushed":
                flushed_gen = m[1]
            elif m[0] == "gen":
                gen = m[1]
        try:
            store = ScmStore.open(image / "t.scm")
        except (OSError, ValueError) as e:
            return None if flushed_gen is None else f"refused to open: {e}"
        if flushed_gen is None:
            store.close()
            return None
        least = self.flushed[flushed_gen]
        try:
            rows, corrupt = self._read_all(store)
        finally:
            store.close()
        gens = _generations(rows).tolist()
        init = (rows == self.init_rows).all(dim=1).tolist()
        for r in range(ROWS):
            if not corrupt and gens[r] == least[r] and (gen == least[r] or gens[r] >= 1):
                continue  # as of the last flush (the common case, checked without the rest)
            bad = self._check_row(r, corrupt.get(r), init[r], gens[r], least[r], gen)
            if bad is not None:
                return f"row {r} (version {least[r]} at the last returned flush, generation {gen} begun): {bad}"
        return None

    @staticmethod
    def _read_all(store: ScmStore):
        """Every row (zeros for a corrupt one), and {row: the CorruptionError naming it}: a
        read stops at the first corrupt row, so read on after each one it names."""
        rows = torch.zeros(ROWS, DIM + STATE)
        corrupt: Dict[int, CorruptionError] = {}
        start = 0
        while start < ROWS:
            try:
                rows[start:] = store.read(torch.arange(start, ROWS))
                break
            except CorruptionError as e:
                named = re.search(r"row (\d+) ", str(e))
                if named is None or not start <= int(named[1]) < ROWS:
                    raise AssertionError(f"a CorruptionError that names no row read: {e}") from None
                bad = int(named[1])
                corrupt[bad] = e
                if bad > start:  # the rows before it are intact: they read
                    rows[start:bad] = store.read(torch.arange(start, bad))
                start = bad + 1
        return rows, corrupt

    def _check_row(self, r: int, error: Optional[CorruptionError], init: bool, g: int, least: int,
                   gen: int) -> Optional[str]:
        if error is not None:
            rewritten = any(least < w <= gen for w in self.written[r])
            return None if rewritten else f"reads as corrupt, but it was not written since: {error}"
        if init:
            return None if least == 0 else "reads its initial value: a returned flush is lost"
        if g < 1:
            return "reads bytes that are no version of it (a mix or garbage)"
        if g not in self.written[r] or g > gen:
            return f"reads generation {g}, never written to it by then"
        if g < least:
            return f"reads the older generation {g}: a returned flush is lost"
        return None


def run_images(tmp: Path, images: int, seed: int) -> Dict[str, int]:
    w = Workload(tmp / "work", seed)
    return check_crash_images(w.rec, w.check, tmp, images, seed)


def test_scm_store_survives_power_loss(tmp_path: Path) -> None:
    images = images_wanted()
    counts = run_images(tmp_path, images, seed=1)
    assert counts["images"] >= images


@pytest.mark.nightly
@nightly
@pytest.mark.parametrize("seed", [2, 3])
def test_scm_store_survives_power_loss_nightly(tmp_path: Path, seed: int) -> None:
    assert run_images(tmp_path, NIGHTLY_IMAGES, seed)["images"] >= NIGHTLY_IMAGES
