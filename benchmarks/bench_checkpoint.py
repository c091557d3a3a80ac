#!/usr/bin/env python3
"""Differential checkpoints of the example DLRM against full saves, with the disk's limits; see --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.lib

from benchmarks.lib.checkpoints import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
