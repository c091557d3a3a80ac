#!/usr/bin/env python3
"""Kernel benchmark (same as ``mtrains bench kernel``); see --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.lib

from benchmarks.lib.kernel import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
