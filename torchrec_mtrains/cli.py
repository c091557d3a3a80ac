"""The ``mtrains`` command line.

Commands form a tree: a :class:`Group` maps names to sub-commands, a
:class:`Command` is a leaf that receives every argument after its name and
parses them itself (so ``mtrains bench store --help`` shows the benchmark's own
options). Add a command by adding an entry to :data:`COMMANDS`; handlers import
their implementation lazily so that ``mtrains --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torchrec_mtrains import __version__

__all__ = ["COMMANDS", "Command", "Group", "main"]


@dataclass(frozen=True)
class Command:
    """A leaf command.

    Attributes:
        help: One line shown in the parent's command list.
        run: Called with the arguments after the command name; returns the exit code.
    """

    help: str
    run: Callable[[list[str]], int]


@dataclass(frozen=True)
class Group:
    """A command that only selects one of its sub-commands.

    Attributes:
        help: One line shown in the parent's command list.
        commands: Sub-command name -> sub-command.
    """

    help: str
    commands: Mapping[str, Command | Group]


def _bench_store(argv: list[str]) -> int:
    from torchrec_mtrains.benchmarks import store

    return store.main(argv)


def _bench_kernel(argv: list[str]) -> int:
    from torchrec_mtrains.benchmarks import kernel

    return kernel.main(argv)


def _plan(argv: list[str]) -> int:
    from torchrec_mtrains.planner import plan_command

    return plan_command.main(argv)


def _probe_hw(argv: list[str]) -> int:
    from torchrec_mtrains.planner import probe

    return probe.main(argv)


def _characterize(argv: list[str]) -> int:
    from torchrec_mtrains.stats import characterize

    return characterize.main(argv)


COMMANDS = Group(
    help="Tiered embedding storage for TorchRec (HBM, DRAM, SCM, SSD).",
    commands={
        "plan": Command(
            help="Place a model's tables on the tiers of a hardware profile; size the cluster.",
            run=_plan,
        ),
        "bench": Group(
            help="Run a benchmark against the baseline measured in the same run.",
            commands={
                "store": Command(
                    help="Block store vs RocksDB and the fio device limit.",
                    run=_bench_store,
                ),
                "kernel": Command(
                    help="TieredEmbeddingBags (SCM, SSD) vs FBGEMM all in DRAM, fio and Belady.",
                    run=_bench_kernel,
                ),
            },
        ),
        "probe-hw": Command(
            help="Measure this machine's tiers and compute into a hardware profile (YAML).",
            run=_probe_hw,
        ),
        "characterize": Command(
            help="Per-table statistics of a trace: lookups, unique rows, hit rates, bandwidth.",
            run=_characterize,
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
    return _dispatch("mtrains", COMMANDS, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
