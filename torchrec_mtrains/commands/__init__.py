"""The ``mtrains`` commands, one module each (``plan``, ``probe_hw``, ``characterize``,
``bench``): argument parsing and printing over the library's modules, which do the work.
``torchrec_mtrains.cli`` holds the command table."""

from torchrec_mtrains.commands.types import Command, Group

__all__ = ["Command", "Group"]
