"""``mtrains probe-hw``: measure this machine's tiers (DRAM, SCM = mmap, SSD = block store)
and embedding compute into a hardware profile (YAML) that ``load_topology`` reads; the
measuring is ``torchrec_mtrains.planner.hardware.probe``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Sequence

from torchrec_mtrains.planner.hardware.probe import ProbeConfig, ProbeResult, probe
from torchrec_mtrains.planner.hardware.probe_median import median_topology, spread_notes
from torchrec_mtrains.planner.hardware.topology import parse_topology
from torchrec_mtrains.planner.hardware.units import parse_size

__all__ = ["main"]


def main(argv: Sequence[str]) -> int:
    """``mtrains probe-hw``: see the module docstring. Exit code 2 on bad arguments."""
    parser = argparse.ArgumentParser(
        prog="mtrains probe-hw",
        description="Measure this machine's tiers (DRAM, SCM = mmap, SSD = block store) and embedding "
                    "compute into a hardware profile (YAML) that load_topology reads.")
    parser.add_argument("--out", type=Path, help="write the profile here (default: print it)")
    parser.add_argument("--dir", type=Path, default=Path("."),
                        help="a directory on the filesystem of the SCM and SSD tiers (default: .)")
    parser.add_argument("--quick", action="store_true", help="small tables, short runs (~20 s)")
    parser.add_argument("--ranks-per-node", type=int, default=2,
                        help="training processes per node; per-node figures are divided by it (default: 2)")
    parser.add_argument("--table-size", default=None,
                        help="size of each tier probe's table, e.g. 1GiB (default 256MiB, 32MiB with --quick): "
                             "as large as the tables you train, so no cache below the filesystem holds it")
    parser.add_argument("--repeat", type=int, default=1,
                        help="probe N times and write each figure's median, noting its spread (default 1); "
                             "on a shared machine 3 or more")
    args = parser.parse_args(list(argv))
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be >= 1")
    try:
        table_mib = None
        if args.table_size is not None:
            table_mib = max(1, int(parse_size(args.table_size, "--table-size", bare_bytes=True)) >> 20)
        cfg = ProbeConfig(args.dir, quick=args.quick, ranks_per_node=args.ranks_per_node, table_mib=table_mib)
    except ValueError as e:
        parser.error(str(e))  # exits 2
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: directory {args.out.parent} does not exist")
    command = shlex.join(["mtrains", "probe-hw", *argv])
    results = []
    for i in range(args.repeat):
        prefix = f"[probe-hw {i + 1}/{args.repeat}]" if args.repeat > 1 else "[probe-hw]"
        results.append(probe(cfg, command, progress=lambda s, p=prefix: print(f"{p} {s}", file=sys.stderr, flush=True)))
    result = combine(results) if len(results) > 1 else results[0]
    text = result.to_yaml()
    parse_topology(text)  # what we write must load
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"[probe-hw] wrote {args.out}", file=sys.stderr)
    return 0


def combine(results: Sequence[ProbeResult]) -> ProbeResult:
    """One profile of repeated probes: each figure's median, its note saying how far apart
    the probes were; the first probe's notes otherwise."""
    topologies = [r.topology for r in results]
    source = f"{topologies[0].source}; each figure the median of {len(results)} probes"
    notes = dict(results[0].notes)
    for path, spread in spread_notes(topologies).items():
        notes[path] = f"{notes[path]}; {spread}" if notes.get(path) else spread
    header = f"{results[0].header}\nEach figure is the median of {len(results)} probes run one after another."
    return ProbeResult(median_topology(topologies, source), notes, header)
