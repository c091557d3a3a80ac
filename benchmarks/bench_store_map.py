#!/usr/bin/env python3
"""The block store's location map at scale: memory and map writes of a sparse huge table.

Creates a table of --rows logical rows (default 500M) of dim --dim fp32 + 1 state float,
writes --writes rows (default 2M) at uniformly random ids in batches, flushes once, and
prints: the store's ``dram_bytes_per_row``, this process's RSS growth per logical row
(VmRSS from before the create to after the flush), the map bytes written against the row
bytes written, and the flush / reopen times. For reference it also prints what the
previous map (one u64 per logical row, whole 4 KiB pages written per flush) cost on the
default run: 7.05 B/row of RSS and 3.49 GB of map writes, 25.7x the row bytes.

Usage::

    python benchmarks/bench_store_map.py [--rows N] [--writes N] [--dim D] [--dir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import torch  # noqa: E402

from torchrec_mtrains.storage import BlockStore  # noqa: E402

from benchmarks.lib.process_monitor import process_memory  # noqa: E402

OLD_SCHEME = {"rss_bytes_per_row": 7.05, "map_bytes_written": 3.49e9, "map_to_row_bytes": 25.7}


def rss_bytes() -> int:
    return process_memory(os.getpid())[0]


def run(rows: int, writes: int, dim: int, directory: Path) -> dict:
    """Builds the table, writes, flushes, reopens; returns the figures."""
    path = directory / "map_bench.tbl"
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, rows, (writes,), generator=gen)
    values = torch.rand(65536, dim + 1, generator=gen)  # reused: no allocator noise in RSS
    before = rss_bytes()
    store = BlockStore(path, rows, dim, dram_cache_mb=0, overwrite=True)
    t0 = time.perf_counter()
    for start in range(0, writes, 65536):
        batch = ids[start:start + 65536]
        store.write(batch, values[: len(batch)])
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.flush()
    flush_s = time.perf_counter() - t0
    stats = store.stats()
    growth = rss_bytes() - before
    store.close()
    t0 = time.perf_counter()
    BlockStore.open(path, dram_cache_mb=0).close()
    open_s = time.perf_counter() - t0
    path.unlink()
    row_bytes = stats["rows_appended"] * (dim + 1) * 4
    return {
        "rows": rows, "writes": writes, "dim": dim,
        "dram_bytes_per_row": stats["dram_bytes_per_row"],
        "rss_growth_bytes_per_row": growth / rows,
        "map_bytes_written": stats["map_bytes_written"],
        "map_journal_bytes_written": stats["map_journal_bytes_written"],
        "map_checkpoints": stats["map_checkpoints"],
        "row_bytes_written": row_bytes,
        "map_to_row_bytes": stats["map_bytes_written"] / row_bytes,
        "write_s": write_s, "flush_s": flush_s, "reopen_s": open_s,
        "old_scheme": OLD_SCHEME,
    }


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=500_000_000, help="logical rows of the table")
    p.add_argument("--writes", type=int, default=2_000_000, help="rows written at random ids")
    p.add_argument("--dim", type=int, default=16, help="fp32 weights per row (plus one state float)")
    p.add_argument("--dir", type=Path, default=None, help="directory of the (sparse) table file")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    if a.rows < 1 or a.writes < 1 or a.dim < 1:
        raise ValueError(f"--rows={a.rows}, --writes={a.writes} and --dim={a.dim} must be positive")
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        r = run(a.rows, a.writes, a.dim, Path(d))
    print(f"table {r['rows']:,} rows, {r['writes']:,} random-id writes of {(r['dim'] + 1) * 4} B, one flush")
    print(f"  dram_bytes_per_row        {r['dram_bytes_per_row']:.4f}")
    print(f"  RSS growth per row        {r['rss_growth_bytes_per_row']:.4f} B   (old: {OLD_SCHEME['rss_bytes_per_row']} B)")
    print(f"  map bytes written         {r['map_bytes_written'] / 1e6:.1f} MB = {r['map_to_row_bytes']:.3f}x the "
          f"{r['row_bytes_written'] / 1e6:.0f} MB of rows   (old: {OLD_SCHEME['map_bytes_written'] / 1e9:.2f} GB, "
          f"{OLD_SCHEME['map_to_row_bytes']}x)")
    print(f"  write {r['write_s']:.2f} s, flush {r['flush_s']:.2f} s, reopen {r['reopen_s']:.2f} s")
    if a.json:
        a.json.write_text(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
