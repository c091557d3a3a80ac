#!/usr/bin/env python3
"""Tables larger than RAM, end to end (the example's --preset beyond-ram); see --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks.lib

from benchmarks.lib.beyond_ram import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
