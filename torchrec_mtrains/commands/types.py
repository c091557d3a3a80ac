"""The shape of the ``mtrains`` command tree: groups of commands and leaf commands."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Command", "Group"]


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
