#!/usr/bin/env python3
"""Kernel benchmark of issue 3 (same as ``mtrains bench kernel``); see --help."""

import sys

from torchrec_mtrains.benchmarks.kernel import main

if __name__ == "__main__":
    sys.exit(main())
