"""The ``mtrains`` commands, one module each (``plan``, ``probe_hw``, ``characterize``,
``bench``): argument parsing and printing over the library's modules, which do the work.
``torchrec_mtrains.cli`` holds the command table; ``quiet`` silences the framework warnings
a user cannot act on (for every entry point)."""

from torchrec_mtrains.commands.types import Command, Group

__all__ = ["Command", "Group"]
