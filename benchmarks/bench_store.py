#!/usr/bin/env python3
"""Block-store benchmark (same as ``mtrains bench store``); see --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.lib

from benchmarks.lib.store import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
