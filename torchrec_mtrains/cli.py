"""The ``mtrains`` command line: the table of commands.

Commands form a tree: a :class:`Group` maps names to sub-commands, a
:class:`Command` is a leaf that receives every argument after its name and
parses them itself (so ``mtrains bench store --help`` shows the benchmark's own
options). Each command is a module of :mod:`torchrec_mtrains.commands`; add one by
adding an entry to :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from torchrec_mtrains import __version__
from torchrec_mtrains.commands.quiet import quiet_framework_noise
from torchrec_mtrains.commands.types import Command, Group

__all__ = ["COMMANDS", "Command", "Group", "main"]


def _lazy(module: str, function: str = "main") -> Callable[[list[str]], int]:
    """A command's ``run``: imports ``torchrec_mtrains.commands.<module>`` when called (so
    that ``mtrains --help`` stays fast) and calls its ``function``."""

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(f"torchrec_mtrains.commands.{module}"), function)(argv)

    return run


COMMANDS = Group(
    help="Tiered embedding storage for TorchRec (HBM, DRAM, SCM, SSD).",
    commands={
        "plan": Command(
            help="Place a model's tables on the tiers of a hardware profile; size the cluster.",
            run=_lazy("plan"),
        ),
        "bench": Group(
            help="Run a benchmark against the baseline measured in the same run.",
            commands={
                "store": Command(
                    help="Block store vs RocksDB and the fio device limit.",
                    run=_lazy("bench", "store"),
                ),
                "kernel": Command(
                    help="TieredEmbeddingBags (SCM, SSD) vs FBGEMM all in DRAM, fio and Belady.",
                    run=_lazy("bench", "kernel"),
                ),
            },
        ),
        "probe-hw": Command(
            help="Measure this machine's tiers and compute into a hardware profile (YAML).",
            run=_lazy("probe_hw"),
        ),
        "characterize": Command(
            help="Per-table statistics of a trace: lookups, unique rows, hit rates, bandwidth.",
            run=_lazy("characterize"),
        ),
    },
)


def _dispatch(prog: str, group: Group, argv: list[str]) -> int:
    """Parses one level of the tree and hands the rest of ``argv`` down."""
    listing = "\n".join(f"  {name:<14}{cmd.help}" for name, cmd in group.commands.items())
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{group.help}\n\ncommands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if prog == "mtrains":
        parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "command", metavar="COMMAND", choices=list(group.commands), help="one of the commands above"
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not argv:
        parser.error(f"missing COMMAND (choose from {', '.join(group.commands)})")  # exits 2
    ns = parser.parse_args(argv)
    child = group.commands[ns.command]
    if isinstance(child, Group):
        return _dispatch(f"{prog} {ns.command}", child, ns.args)
    return child.run(ns.args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mtrains`` console script.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 2 for a usage error (unknown command).
    """
    quiet_framework_noise()
    return _dispatch("mtrains", COMMANDS, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
