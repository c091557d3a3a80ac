"""Where the parts of the repository are, for tests that run its scripts or read its files.

The root is the directory holding pyproject.toml, found by walking up from here: a test
module's depth in tests/ is not part of any path.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["BENCHMARKS", "DOCS", "EXAMPLE_DLRM", "MODEL_CONFIGS", "REPO_ROOT", "TEST_PROFILES",
           "add_example_to_path"]


def _repo_root() -> Path:
    here = Path(__file__).resolve()
    for directory in here.parents:
        if (directory / "pyproject.toml").is_file():
            return directory
    raise OSError(f"no pyproject.toml above {here}: the tests run from a source checkout")


REPO_ROOT = _repo_root()
BENCHMARKS = REPO_ROOT / "benchmarks"
MODEL_CONFIGS = BENCHMARKS / "configs" / "models"
DOCS = REPO_ROOT / "docs"
EXAMPLE_DLRM = REPO_ROOT / "examples" / "dlrm"
TEST_PROFILES = Path(__file__).resolve().parent / "profiles"
"""Hardware profiles frozen for the tests (support/planner_nodes.py's PINNED_PROFILE)."""


def add_example_to_path() -> None:
    """Makes the example's modules (``train``, ``data``, ``checkpoint``, ``placement``, ...)
    importable by name: examples/dlrm is a directory of scripts, not a package."""
    if str(EXAMPLE_DLRM) not in sys.path:
        sys.path.insert(0, str(EXAMPLE_DLRM))
