"""``mtrains characterize``: per-table statistics of a dlrm_datasets trace, as a table or
JSON, and plots; the statistics are ``torchrec_mtrains.stats.characterize``'s (see there
for what each column means)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from torchrec_mtrains.stats.characterize import CACHE_SHARES, characterize, read_trace_files, table_report
from torchrec_mtrains.stats.types import TableStats

__all__ = ["main"]


def _parse_tables(text: str, count: int) -> List[int]:
    """"0-3,7" -> [0, 1, 2, 3, 7], checked against ``count`` tables."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"--tables: {part!r} is not an index or a range like 0-3") from None
        if not 0 <= a <= b < count:
            raise ValueError(f"--tables: {part!r} is outside the trace's tables 0-{count - 1}")
        out.extend(range(a, b + 1))
    return sorted(set(out))


def _format_table(reports: List[Dict[str, Any]], qps: float) -> str:
    heads = (["table", "rows", "lookups", "unique", "pool"] + [f"lru{int(p * 100)}%" for p in CACHE_SHARES]
             + [f"lfu{int(p * 100)}%" for p in CACHE_SHARES] + ["lookup MB/s", "tier@10% MB/s"])
    body = []
    for r in reports:
        body.append([r["table"], f"{r['rows']:,}" + ("" if r["rows_known"] else "*"), f"{r['lookups']:,}",
                     f"{r['unique_rows']:,}", f"{r['pooling_factor']:.2f}"]
                    + [f"{100 * r['hit_rate'][p][f'{s:g}']:.1f}" for p in ("lru", "lfu") for s in CACHE_SHARES]
                    + [f"{r['lookup_bytes_per_s'] / 1e6:,.1f}", f"{r['tier_bytes_per_s_at_10pct_lru'] / 1e6:,.1f}"])
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(heads), line(["-" * w for w in widths])] + [line(row) for row in body]
    if body:
        out += ["", _format_reuse(reports), ""]
    out.append("first table: hit rates in % of a cache of 1/5/10/20% of the table's rows; "
               f"bandwidth at {qps:,.0f} samples/s"
               + ("; * rows unknown: unique rows used (--num-rows)" if any(not r["rows_known"] for r in reports) else ""))
    return "\n".join(out)


_REUSE_VIEWS = (("lookups", "share_of_lookups"), ("rows", "share_of_unique_rows"))


def _format_reuse(reports: List[Dict[str, Any]]) -> str:
    """Both reuse histograms of each table, in % per reuse bin: "lookups" lines are the
    share of lookups by the reuse bin of their row, "rows" lines the share of unique rows."""
    heads = ["table", "view"] + [label.replace(", ", ",") for label in reports[0]["reuse"]["labels"]]
    body = [[r["table"], view] + [f"{100 * x:.1f}" for x in r["reuse"][key]]
            for r in reports for view, key in _REUSE_VIEWS]
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    title = ("reuse histograms, % per bin of a row's lookups over the trace: lookups = share of lookups by the "
             "reuse bin of their row; rows = share of unique rows by reuse bin")
    return "\n".join([title, line(heads), line(["-" * w for w in widths])] + [line(row) for row in body])


def main(argv: Sequence[str]) -> int:
    """``mtrains characterize``: see the module docstring. Exit code 2 on bad input."""
    parser = argparse.ArgumentParser(
        prog="mtrains characterize",
        description="Per-table statistics of a dlrm_datasets trace (torch.save((indices, offsets, lengths)), "
                    ".pt or .pt.gz): lookups, unique rows, pooling, LRU/LFU hit rates, bandwidth.")
    parser.add_argument("trace", nargs="+", type=Path, metavar="TRACE", help="trace file(s), read in order")
    parser.add_argument("--batch-size", type=int, default=4096,
                        help="samples per training step; each file's batch is cut into such steps (default: 4096)")
    parser.add_argument("--tables", help="only these table indices, e.g. 0-9,17 (default: all)")
    parser.add_argument("--num-rows", help="rows of each table: one number for all, or one per table "
                        "(comma-separated); default: the unique rows seen")
    parser.add_argument("--dim", type=int, default=64, help="embedding dim, for bandwidth (default: 64)")
    parser.add_argument("--qps", type=float, default=100_000.0, help="samples/s, for bandwidth (default: 100000)")
    parser.add_argument("--sample-rate", default="auto", help="SHARDS rate of the LRU curve in (0, 1], or auto")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="write PNG plots into DIR")
    args = parser.parse_args(list(argv))
    try:
        reports, stats = _run(args)
    except (ValueError, OSError, EOFError, RuntimeError) as e:
        # RuntimeError / EOFError: torch.load of a file that is not a torch file
        parser.error(str(e) or type(e).__name__)  # exits 2
    if args.json:
        json.dump({"qps": args.qps, "batch_size": args.batch_size, "dim": args.dim, "tables": reports},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(_format_table(reports, args.qps))
    if args.plot is not None:
        from torchrec_mtrains.stats.plots import write_plots

        for path in write_plots(stats, reports, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> "tuple[List[Dict[str, Any]], List[TableStats]]":
    for name, v, lo in (("--batch-size", args.batch_size, 1), ("--dim", args.dim, 1)):
        if v < lo:
            raise ValueError(f"{name} {v} must be >= {lo}")
    if not args.qps > 0:
        raise ValueError(f"--qps {args.qps} must be > 0")
    rate: "float | str" = args.sample_rate
    if rate != "auto":
        try:
            rate = float(rate)
        except ValueError:
            raise ValueError(f"--sample-rate {rate!r} must be a number in (0, 1] or auto") from None
    if args.plot is not None and args.plot.exists() and not args.plot.is_dir():
        raise ValueError(f"--plot {args.plot}: exists and is not a directory")
    batches = read_trace_files(args.trace)
    count = batches[0].num_tables
    num_rows = _num_rows(args.num_rows, count)
    chosen = None if args.tables is None else _parse_tables(args.tables, count)
    stats = characterize(batches, args.batch_size, num_rows, chosen, rate)
    return [table_report(s, args.qps, args.batch_size, args.dim) for s in stats], stats


def _num_rows(text: Optional[str], count: int) -> Optional[List[int]]:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--num-rows {text!r}: expected integers separated by commas") from None
    if len(values) == 1:
        values = values * count
    if len(values) != count or min(values) < 1:
        raise ValueError(f"--num-rows {text!r}: expected one positive number or {count} (one per table)")
    return values
