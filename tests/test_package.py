"""The package imports cheaply and the `mtrains` console script dispatches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchrec_mtrains
from torchrec_mtrains import Tier

# The console script installed next to the interpreter running the tests (.venv/bin).
MTRAINS = Path(sys.executable).with_name("mtrains")


def test_public_surface() -> None:
    assert torchrec_mtrains.__all__ == ["Tier", "__version__"]
    assert torchrec_mtrains.__version__ == "0.1.0"
    assert [t.name for t in Tier] == ["HBM", "DRAM", "SCM", "SSD"]


def _mtrains(*args: str) -> subprocess.CompletedProcess[str]:
    assert MTRAINS.exists(), f"{MTRAINS} missing: run scripts/setup.sh"
    return subprocess.run([str(MTRAINS), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"]])
def test_help_exits_zero(args: list[str]) -> None:
    result = _mtrains(*args)
    assert result.returncode == 0, result.stderr
    assert "usage: mtrains" in result.stdout


def test_bench_help_lists_store() -> None:
    assert "store" in _mtrains("bench", "--help").stdout


@pytest.mark.parametrize("args", [[], ["no-such-command"], ["bench", "no-such-benchmark"]])
def test_usage_errors_exit_two(args: list[str]) -> None:
    result = _mtrains(*args)
    assert result.returncode == 2
    assert "error:" in result.stderr


def test_bench_without_a_source_checkout_exits_two(tmp_path: Path) -> None:
    # The package as installed: no benchmarks/lib next to it.
    shutil.copytree(Path(torchrec_mtrains.__file__).parent, tmp_path / "site" / "torchrec_mtrains",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = "import sys; from torchrec_mtrains.cli import main; sys.exit(main(['bench', 'store']))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    assert "source checkout" in result.stderr and "python benchmarks/bench_store.py" in result.stderr
