"""``mtrains bench store|kernel``: the benchmarks of a source checkout.

The benchmarks are not part of the installed package: they live in the repository's
``benchmarks/lib`` next to their configs (``benchmarks/configs``) and entry points
(``benchmarks/bench_*.py``). These commands find that checkout from the package's location
(``torchrec_mtrains/../benchmarks/lib``, as in an editable install) and run the benchmark's
``main``; without one they exit 2 saying how to run it from a checkout.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["kernel", "source_root", "store"]


def source_root() -> Optional[Path]:
    """The source checkout this package runs from (the directory holding
    ``benchmarks/lib`` and ``pyproject.toml``), or None for an installed package (whose
    parent, site-packages, may hold some other distribution's ``benchmarks``)."""
    root = Path(__file__).resolve().parents[2]
    marks = (root / "benchmarks" / "lib" / "__init__.py", root / "pyproject.toml")
    return root if all(m.is_file() for m in marks) else None


def _run(name: str, argv: Sequence[str]) -> int:
    root = source_root()
    if root is None:
        print(f"mtrains bench {name}: error: the benchmarks need a source checkout of torchrec-mtrains "
              f"(this package is installed without one); in a checkout run `python benchmarks/bench_{name}.py` "
              "(or `mtrains bench` from an editable install)", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.lib.{name}").main(list(argv))


def store(argv: Sequence[str]) -> int:
    """``mtrains bench store``: block store vs RocksDB, memmap and the fio device limit."""
    return _run("store", argv)


def kernel(argv: Sequence[str]) -> int:
    """``mtrains bench kernel``: TieredEmbeddingBags (SCM, SSD) vs FBGEMM all in DRAM."""
    return _run("kernel", argv)
