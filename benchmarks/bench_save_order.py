#!/usr/bin/env python3
"""Copying a block-store table's rows out for a checkpoint: in id order vs in log order.

A checkpoint that copies an SSD table (``link_ssd_tables=False``, or a checkpoint directory
on another filesystem) reads the rows it saves from the block store. The store keeps rows
where each was last written (a log), so reading them in id order is a random read per
block; reading them in the log's order (``BlockStore.storage_order``, what the
checkpointer's chunks now follow) reads dense stretches of the log whole.

Builds a table of ``--rows`` rows (dim ``--dim`` fp32 + 1 state value) whose rows were
written in a shuffled order, as a row cache's evictions write them, then copies them out as
a save does -- chunks of ``--chunk-mb`` read through ``RowSnapshot`` (the save's read path)
and appended to a file, fsynced at the end -- for two selections: every row (a full step)
and a random ``--delta-fraction`` of them (a delta). Cases, alternated ``--repeat`` times:

- ``ids``: chunks of ascending id ranges, rows read in id order (the order before);
- ``log``: chunks in the store's log order (``plan_chunks`` with the store's order).

Prints each case's copy throughput (MB/s of rows read and written), the ratio log / ids,
and each against the sequential write bandwidth of the same filesystem measured first in
the same run (fio or a Python loop: ``benchmarks/lib/seq_bandwidth.py``). Usage::

    .venv/bin/python benchmarks/bench_save_order.py [--rows 4000000] [--dim 64] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root

import torch  # noqa: E402

from benchmarks.lib import seq_bandwidth  # noqa: E402
from benchmarks.lib.types import MIB  # noqa: E402
from torchrec_mtrains.kernels.dirty_rows import DirtyRows  # noqa: E402
from torchrec_mtrains.kernels.row_snapshot import RowSnapshot  # noqa: E402
from torchrec_mtrains.storage import BlockStore  # noqa: E402

CASES = ("ids", "log")
_WRITE_BATCH = 1 << 16  # rows per write while the table is built


class _InIdOrder:
    """The store, read in id order (no storage order): what a save did before."""

    def __init__(self, store: BlockStore) -> None:
        self._store = store

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        return self._store.read(ids)

    def storage_order(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        return None


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", type=int, default=4_000_000, help="rows of the table")
    p.add_argument("--dim", type=int, default=64, help="fp32 values per row (plus one optimizer value)")
    p.add_argument("--chunk-mb", type=float, default=32.0, help="rows per chunk, in MiB (the checkpointer's chunk_mb)")
    p.add_argument("--delta-fraction", type=float, default=0.1, help="share of the rows a delta holds")
    p.add_argument("--repeat", type=int, default=2, help="rounds of the alternated cases")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated cases to run")
    p.add_argument("--dir", default=None, help="where the table and the copies go (default: a temp dir)")
    p.add_argument("--disk-method", choices=seq_bandwidth.METHODS, default="auto",
                   help="how sequential bandwidth is measured")
    p.add_argument("--json", default=None, help="write the figures here")
    return p.parse_args(argv)


def build_table(path: str, rows: int, dim: int) -> BlockStore:
    """A table every row of which was written once, in a shuffled order, then flushed."""
    store = BlockStore(path, rows, dim, dram_cache_mb=0, overwrite=True)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(rows, generator=g)
    values = torch.rand(_WRITE_BATCH, dim + 1, generator=g)
    for lo in range(0, rows, _WRITE_BATCH):
        ids = order[lo:lo + _WRITE_BATCH]
        store.write(ids, values[: ids.numel()])
    store.flush()
    return store


def chunks_of(selected: torch.Tensor, store: BlockStore, case: str, max_rows: int) -> List[torch.Tensor]:
    """The chunks' ids (each ascending) as the checkpointer plans them for ``case`` (for a
    selection of at most one ordering window, ``row_io._ORDER_ROWS`` rows: the default's)."""
    if case == "log":
        selected = selected[store.storage_order(selected)]
        return [torch.sort(selected[lo:lo + max_rows]).values for lo in range(0, selected.numel(), max_rows)]
    return [selected[lo:lo + max_rows] for lo in range(0, selected.numel(), max_rows)]


def copy_out(store: BlockStore, selected: torch.Tensor, case: str, max_rows: int, out_path: str) -> Tuple[float, float]:
    """Seconds to read the selected rows as a save does and write them to ``out_path``, and
    the seconds of that spent planning and reading."""
    rows = store.num_rows
    chosen = DirtyRows(rows)
    chosen.mark(selected)
    source = store if case == "log" else _InIdOrder(store)
    snapshot = RowSnapshot(source, chosen, store.row_width, store.dtype)
    t0 = time.perf_counter()
    with open(out_path, "wb") as f:
        chunks = chunks_of(selected, store, case, max_rows)
        reading = time.perf_counter() - t0
        for ids in chunks:
            t1 = time.perf_counter()
            rows = snapshot.read(ids)
            reading += time.perf_counter() - t1
            f.write(rows.numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - t0
    snapshot.release()
    os.unlink(out_path)
    return seconds, reading


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if not cases or any(c not in CASES for c in cases):
        raise SystemExit(f"--cases must be a comma-separated subset of {','.join(CASES)}")
    own_dir = args.dir is None
    work = Path(tempfile.mkdtemp(prefix="save_order_") if own_dir else args.dir)
    work.mkdir(parents=True, exist_ok=True)
    try:
        disk = seq_bandwidth.measure(work, args.disk_method)
        print(f"disk: sequential write {disk.write_bytes_per_s / 1e6:,.0f} MB/s, read "
              f"{disk.read_bytes_per_s / 1e6:,.0f} MB/s ({disk.method})", flush=True)
        t0 = time.perf_counter()
        store = build_table(str(work / "table.bin"), args.rows, args.dim)
        row_bytes = store.row_width * store.dtype.itemsize
        print(f"table: {args.rows:,} rows of {row_bytes} B ({args.rows * row_bytes / 1e9:.2f} GB), written in a "
              f"shuffled order in {time.perf_counter() - t0:.1f} s", flush=True)
        max_rows = max(1, int(args.chunk_mb * MIB) // row_bytes)
        g = torch.Generator().manual_seed(1)
        selections = {
            "full": torch.arange(args.rows),
            "delta": torch.sort(torch.randperm(args.rows, generator=g)[: int(args.rows * args.delta_fraction)]).values,
        }
        seconds: Dict[str, Dict[str, List[float]]] = {s: {c: [] for c in cases} for s in selections}
        reading: Dict[str, Dict[str, List[float]]] = {s: {c: [] for c in cases} for s in selections}
        for r in range(args.repeat):
            for name, selected in selections.items():
                for case in (cases if r % 2 == 0 else cases[::-1]):
                    s, read_s = copy_out(store, selected, case, max_rows, str(work / "copy.bin"))
                    seconds[name][case].append(s)
                    reading[name][case].append(read_s)
                    nbytes = selected.numel() * row_bytes
                    print(f"round {r} {name:5s} {case:3s}: {s:7.2f} s, {nbytes / s / 1e6:7.1f} MB/s copied; "
                          f"reading {read_s:6.2f} s, {nbytes / read_s / 1e6:7.1f} MB/s", flush=True)
        store.close()
        figures = {}
        for name, selected in selections.items():
            nbytes = selected.numel() * row_bytes
            med = {c: statistics.median(v) for c, v in seconds[name].items()}
            med_read = {c: statistics.median(v) for c, v in reading[name].items()}
            fig = {f"{c}_bytes_per_s": nbytes / med[c] for c in cases}
            fig.update({f"{c}_x_seq_write": nbytes / med[c] / disk.write_bytes_per_s for c in cases})
            fig.update({f"{c}_read_x_seq_read": nbytes / med_read[c] / disk.read_bytes_per_s for c in cases})
            if len(cases) == 2:
                fig["log_over_ids"] = med["ids"] / med["log"]
            figures[name] = {"rows": int(selected.numel()), "bytes": nbytes, "seconds": seconds[name],
                             "reading_seconds": reading[name], **fig}
            line = ", ".join(f"{c} {fig[f'{c}_bytes_per_s'] / 1e6:,.0f} MB/s = {fig[f'{c}_x_seq_write']:.2f}x seq write "
                             f"(reading alone {fig[f'{c}_read_x_seq_read']:.2f}x seq read)" for c in cases)
            ratio = f"; log order {fig['log_over_ids']:.1f}x faster than id order" if "log_over_ids" in fig else ""
            print(f"{name}: {selected.numel():,} rows, {line}{ratio}")
        if args.json:
            Path(args.json).write_text(json.dumps({"disk": vars(disk), "rows": args.rows, "dim": args.dim,
                                                   "chunk_mb": args.chunk_mb, "figures": figures}, indent=2))
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for name in ("table.bin", "copy.bin"):
                try:
                    os.unlink(work / name)
                except FileNotFoundError:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
