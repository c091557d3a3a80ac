"""Loads the compiled extension (``torchrec_mtrains._C``) into torch, once.

The extension registers TorchScript classes and ops (``torch.classes.mtrains.*``) through
``TORCH_LIBRARY``; it is not a Python module, so it is loaded with
``torch.ops.load_library`` rather than imported.
"""

from __future__ import annotations

import functools
import importlib.machinery
from pathlib import Path

import torch

__all__ = ["load_extension"]


@functools.lru_cache(maxsize=None)
def load_extension() -> None:
    """Loads ``_C`` (built by ``pip install -e .`` / ``scripts/setup.sh``).

    Raises:
        ImportError: the extension was not built; the message says how to build it.
    """
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_C{suffix}"
        if candidate.exists():
            torch.ops.load_library(str(candidate))
            return
    raise ImportError(
        f"torchrec_mtrains C++ extension not found in {here}; build it with "
        "`bash scripts/setup.sh` (or `pip install --no-build-isolation -e .`)"
    )
