"""The block store's location map at scale, and its journal across crashes.

A sparse table of 500M logical rows with 2M rows written at random ids must cost memory
and map writes by the rows written, not by the table (csrc/storage/location_map.h,
map_journal.h); a dense table stays within 4 bytes per row; rows flushed before a SIGKILL
survive it; a torn journal tail is dropped while damage inside the journal is reported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.block_store_helpers import assert_rows_equal, expected_lazy, flip_byte, journal_block_offset
from tests.support.paths import REPO_ROOT
from torchrec_mtrains.storage import BlockStore
from torchrec_mtrains.storage.types import CorruptionError

BIG_ROWS, BIG_WRITES, DIM = 500_000_000, 2_000_000, 16
ROW_BYTES = (DIM + 1) * 4  # 68 bytes: dim 16 fp32 + one state float


def _rows_of(ids: torch.Tensor, version: int = 0) -> torch.Tensor:
    """A row that encodes its id and a version exactly (small integers in float32)."""
    k = torch.arange(DIM + 1, dtype=torch.int64)
    return ((ids[:, None] * (k + 1) + version * 7919) % 1_000_003).to(torch.float32)


def _run(script: str, timeout: float = 300) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_sparse_500m_row_table(tmp_path: Path) -> None:
    """2M random-id rows into 500M logical rows, one flush: memory and map writes follow
    the rows written (the old map cost 7 B/row of RSS and wrote 3.5 GB, 26x the rows)."""
    path = tmp_path / "big.tbl"
    got = _run(f"""
        import json, torch
        from torchrec_mtrains.storage import BlockStore

        def rss():
            for line in open("/proc/self/status"):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

        k = torch.arange({DIM + 1}, dtype=torch.int64)
        ids = torch.randint(0, {BIG_ROWS}, ({BIG_WRITES},), generator=torch.Generator().manual_seed(0))
        before = rss()
        s = BlockStore({str(path)!r}, {BIG_ROWS}, {DIM}, dram_cache_mb=0)
        for start in range(0, len(ids), 65536):
            b = ids[start:start + 65536]
            s.write(b, ((b[:, None] * (k + 1)) % 1_000_003).to(torch.float32))
        s.flush()
        st = s.stats()
        st["rss_growth"] = rss() - before
        s.close()
        torch.save(ids, {str(tmp_path / "ids.pt")!r})
        print(json.dumps(st))
        """)
    per_row = got["rss_growth"] / BIG_ROWS
    assert per_row <= 4.0, f"RSS grew {per_row:.3f} B per logical row"
    assert per_row <= 0.5, f"RSS grew {got['rss_growth'] / 1e6:.0f} MB ({per_row:.3f} B/row) for a sparse table"
    assert got["dram_bytes_per_row"] <= 0.1, got["dram_bytes_per_row"]  # about 0.045 measured
    row_bytes = got["rows_appended"] * ROW_BYTES
    assert got["rows_appended"] == BIG_WRITES
    assert got["map_bytes_written"] <= 0.25 * row_bytes, (got["map_bytes_written"], row_bytes)
    assert got["map_bytes_written"] == got["map_journal_bytes_written"] + got["map_checkpoint_bytes_written"]
    assert got["map_checkpoints"] == 0 and got["map_journal_commits"] == 1

    ids = torch.load(tmp_path / "ids.pt")
    with BlockStore.open(path, dram_cache_mb=0) as store:
        assert store.stats()["live_rows"] == len(torch.unique(ids))
        sample = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(1))[:5000]]
        assert_rows_equal(store.read(sample), _rows_of(sample), "written rows after reopen")
        never = torch.randint(0, BIG_ROWS, (2000,), generator=torch.Generator().manual_seed(2))
        never = never[~torch.isin(never, ids)]
        assert_rows_equal(store.read(never), expected_lazy(store, never, 0, (-0.01, 0.01)), "never-written rows")


def test_dense_table_stays_within_4_bytes_per_row(tmp_path: Path) -> None:
    n = 1_000_000
    with BlockStore(tmp_path / "dense.tbl", n, DIM, dram_cache_mb=0) as store:
        for start in range(0, n, 100_000):
            ids = torch.arange(start, start + 100_000)
            store.write(ids, _rows_of(ids))
        store.flush()
        s = store.stats()
        assert s["map_dense_chunks"] > 0 and s["live_rows"] == n
        assert s["dram_bytes_per_row"] <= 4.0, s["dram_bytes_per_row"]
        assert s["dram_bytes_per_row"] <= s["map_value_bits"] / 8 + 0.1, (s["dram_bytes_per_row"], s["map_value_bits"])
    with BlockStore.open(tmp_path / "dense.tbl", dram_cache_mb=0) as again:
        ids = torch.randint(0, n, (3000,), generator=torch.Generator().manual_seed(3))
        assert_rows_equal(again.read(ids), _rows_of(ids), "dense table after reopen")


def test_map_bytes_follow_the_rows_over_many_flushes(tmp_path: Path) -> None:
    """Repeated random-id flushes into one table, through journal checkpoints: the map
    bytes written stay within 0.25x the row bytes written, amortised."""
    n, batch = 200_000, 20_000
    g = torch.Generator().manual_seed(4)
    with BlockStore(tmp_path / "t.tbl", n, DIM, dram_cache_mb=0) as store:
        for k in range(40):
            ids = torch.randint(0, n, (batch,), generator=g)
            store.write(ids, _rows_of(ids, k))
            store.flush()
        s = store.stats()
    assert s["map_checkpoints"] >= 1, "no checkpoint: the test did not cover the amortisation"
    assert s["map_bytes_written"] <= 0.25 * s["rows_appended"] * ROW_BYTES, (s["map_bytes_written"], s["rows_appended"])


_CRASH_CHILD = """
    import sys, torch
    from torchrec_mtrains.storage import BlockStore
    k = torch.arange({width}, dtype=torch.int64)
    s = BlockStore({path!r}, {n}, {dim}, dram_cache_mb={cache}, segment_blocks=16)
    for v in range(1, 10_000):
        ids = torch.randint(0, {n}, (500,), generator=torch.Generator().manual_seed(v))
        s.write(ids, ((ids[:, None] * (k + 1) + v * 7919) % 1_000_003).to(torch.float32))
        if v % 3 == 0:
            s.flush()
            print(v, flush=True)
        {stop}
"""


def _versions(n: int, upto: int) -> "dict[int, list[int]]":
    """For each row, the versions the child wrote in batches 1..upto, in order."""
    out: "dict[int, list[int]]" = {}
    for v in range(1, upto + 1):
        for i in torch.randint(0, n, (500,), generator=torch.Generator().manual_seed(v)).tolist():
            out.setdefault(i, []).append(v)
    return out


@pytest.mark.parametrize("cache_mb", [0, 0.05])
def test_flushed_rows_survive_sigkill(tmp_path: Path, cache_mb: float) -> None:
    """A writer SIGKILLed mid-loop (after several flushes): on reopen every row holds the
    version of the last acknowledged flush or a later one it wrote, never older or torn."""
    path, n = tmp_path / "t.tbl", 20_000
    script = textwrap.dedent(_CRASH_CHILD).format(path=str(path), n=n, dim=DIM, width=DIM + 1, cache=cache_mb,
                                                  stop="")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    acked = 0
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 30:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert acked >= 30, "the writer stopped before its tenth flush"
    written = _versions(n, acked + 50)  # the child ran on for a while after the last ack
    durable = _versions(n, acked)
    with BlockStore.open(path, dram_cache_mb=0) as store:
        rows = store.read(torch.arange(n))
    k = torch.arange(DIM + 1, dtype=torch.int64)
    for i in range(n):
        if i not in written:
            continue
        got = rows[i]
        match = [v for v in written[i] if torch.equal(got, ((i * (k + 1) + v * 7919) % 1_000_003).to(torch.float32))]
        if i in durable:
            assert match and match[-1] >= durable[i][-1], f"row {i}: flushed version {durable[i][-1]} lost"


def _crashed_table(tmp_path: Path, flushes: int) -> Path:
    """A table whose writer flushed `flushes` times and then died without closing it."""
    path = tmp_path / "t.tbl"
    script = textwrap.dedent(_CRASH_CHILD).format(path=str(path), n=20_000, dim=DIM, width=DIM + 1, cache=0,
                                                  stop=f"if v == {3 * flushes}: import os; os._exit(0)")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, env=env, timeout=120)
    return path


def test_torn_journal_tail_is_dropped_and_inner_damage_reported(tmp_path: Path) -> None:
    path = _crashed_table(tmp_path, 3)
    with BlockStore.open(path, dram_cache_mb=0) as store:
        layout = dict(store.layout)
        assert store.stats()["map_journal_bytes"] >= 3 * 4096
        whole = store.read(torch.arange(20_000))
    before = path.read_bytes()  # unchanged by that reopen: a store that only reads writes nothing
    blocks = [p for p in range(64) if before[journal_block_offset(layout, p):][:4] == b"JRNL"]
    assert len(blocks) >= 3, blocks
    # The last commit torn: it is dropped whole, the rows of batches 7-9 (the third flush)
    # read their older values.
    flip_byte(path, journal_block_offset(layout, blocks[-1]) + 200)
    with BlockStore.open(path, dram_cache_mb=0) as store:
        torn = store.read(torch.arange(20_000))
    last = set(_versions(20_000, 9)) - set(_versions(20_000, 6)) | {
        i for v in (7, 8, 9) for i in torch.randint(0, 20_000, (500,), generator=torch.Generator().manual_seed(v)).tolist()}
    changed = {i for i in range(20_000) if not torch.equal(torn[i], whole[i])}
    assert changed and changed <= last, "dropping the torn last commit changed rows it did not write"
    # Damage to an earlier block, with a later commit after it: CorruptionError naming the
    # file and the offset.
    path.write_bytes(before)
    bad = journal_block_offset(layout, blocks[0])
    flip_byte(path, bad + 200)
    with pytest.raises(CorruptionError, match=f"{path}.*map journal block at offset {bad}"):
        BlockStore.open(path)
