#!/usr/bin/env python3
"""Block-store benchmark of issue 2 (same as ``mtrains bench store``); see --help."""

import sys

from torchrec_mtrains.benchmarks.store import main

if __name__ == "__main__":
    sys.exit(main())
