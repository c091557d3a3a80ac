"""Shared parts of the power-loss tests (test_power_loss_*.py in tests/storage and
tests/checkpoint): image counts, the nightly switch, and building and running the C++ driver
of the block store's checker.

A power cut loses what a killed process keeps: writes still in the page cache or the
device's write cache. Each test records a workload's writes and syncs, builds crash images
(the state at each sync, plus random subsets and orders of the writes in flight since,
some torn at 512-byte sectors) and checks what the store makes of each.

Image counts: ``MTRAINS_POWER_LOSS_IMAGES`` (default 1,000 per workload, a few seconds
each); the ``nightly`` tests, run with ``MTRAINS_NIGHTLY=1``, check many more.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from tests.support.paths import REPO_ROOT

NIGHTLY_IMAGES = 20_000

nightly = pytest.mark.skipif(os.environ.get("MTRAINS_NIGHTLY") != "1",
                             reason="nightly power-loss run (set MTRAINS_NIGHTLY=1)")


def images_wanted() -> int:
    """Crash images per workload in the default tests."""
    text = os.environ.get("MTRAINS_POWER_LOSS_IMAGES", "1000")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"MTRAINS_POWER_LOSS_IMAGES={text!r} must be a positive integer")
    return int(text)


# The C++ driver of csrc/tests/test_power_loss.cc and the sources it links: the storage
# core (BlockStore and its devices; without MTRAINS_HAVE_LIBURING, no io_uring) and the
# testing environments it runs the store on.
DRIVER = "csrc/tests/test_power_loss.cc"
DRIVER_SOURCES = [DRIVER] + sorted(
    str(p.relative_to(REPO_ROOT)) for d in ("common", "storage", "testing") for p in (REPO_ROOT / "csrc" / d).glob("*.cc")
)
_FLAGS = ["-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Icsrc", "-pthread"]


def build_driver() -> Path:
    """Builds the power-loss driver (plain, -O1) under build/power_loss, once per version of
    its sources and the headers they may include; returns the executable."""
    inputs = sorted({REPO_ROOT / s for s in DRIVER_SOURCES} | set((REPO_ROOT / "csrc").glob("**/*.h")))
    digest = hashlib.sha256()
    for p in inputs:
        digest.update(str(p.relative_to(REPO_ROOT)).encode() + b"\0" + p.read_bytes())
    out_dir = REPO_ROOT / "build" / "power_loss" / digest.hexdigest()[:16]
    exe = out_dir / "test_power_loss"
    if exe.exists():
        return exe
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise OSError(f"the C++ compiler {cxx!r} (environment CXX) is not on PATH: the power-loss driver needs it")
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)

    def compile_one(src: str) -> Path:
        obj = tmp / (src.replace("/", "_") + ".o")
        _run([cxx, *_FLAGS, "-c", src, "-o", str(obj)])
        return obj

    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        objects = list(pool.map(compile_one, DRIVER_SOURCES))
    _run([cxx, *_FLAGS, *map(str, objects), "-o", str(tmp / "test_power_loss")])
    try:
        tmp.rename(out_dir)
    except OSError:  # another run built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return exe


def _run(cmd: Sequence[str]) -> None:
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def run_driver(images: int, seed: int) -> Dict[str, int]:
    """Runs the driver; returns its summary's counters. Fails the test, with the driver's
    output, when it exits non-zero."""
    exe = build_driver()
    env = dict(os.environ, POWER_LOSS_IMAGES=str(images), POWER_LOSS_SEED=str(seed))
    done = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"test_power_loss exited {done.returncode}:\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}")
    lines: List[str] = [ln for ln in done.stdout.splitlines() if ln.startswith("power-loss: block_store ")]
    if len(lines) != 1:
        pytest.fail(f"no summary line in the driver's output:\n{done.stdout[-3000:]}")
    fields = dict(item.split("=") for item in lines[0].split()[2:])
    return {k: int(v) for k, v in fields.items()}
