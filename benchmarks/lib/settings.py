"""Settings plumbing shared by the benchmarks: YAML config + ``quick:`` overlay + CLI flags.

Every benchmark has a frozen config dataclass and a checked-in YAML file whose keys are
that dataclass's fields; precedence is dataclass defaults < config file < the file's
``quick:`` section (with ``--quick``) < CLI flags. Also: the progress-bar factory and the
tool versions printed in the headers.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, TypeVar

import yaml

__all__ = ["Progress", "REPO_ROOT", "build_config", "default_data_dir", "load_config",
           "progress_factory", "tool_versions"]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The repository root (this file is benchmarks/lib/settings.py)."""

Progress = Callable[[str, int], Callable[[int], None]]
"""``progress(description, total)`` returns ``update(n)``; a no-op without tqdm."""

C = TypeVar("C")


def load_config(path: Optional[Path], default_path: Path, quick: bool, config_cls: type) -> dict[str, Any]:
    """Reads a YAML config (top level, then its ``quick:`` section when ``quick``).

    Args:
        path: The file given with ``--config``, or None for ``default_path``.
        default_path: The checked-in config; a missing one means "dataclass defaults".
        quick: Apply the ``quick:`` overlay.
        config_cls: The config dataclass; its fields are the known keys.

    Raises:
        ValueError: unknown keys or a malformed file.
    """
    if path is None:
        if not default_path.is_file():
            return {}
        path = default_path
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"config {path}: expected a mapping, got {type(doc).__name__}")
    overlay = doc.pop("quick", {}) or {}
    known = {f.name for f in dataclasses.fields(config_cls)}
    for section in (doc, overlay):
        unknown = set(section) - known
        if unknown:
            raise ValueError(f"config {path}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    merged = dict(doc)
    if quick:
        merged.update(overlay)
    return merged


def default_data_dir() -> Path:
    """``<repo>/build/bench-data`` in a checkout, else ``$TMPDIR``."""
    if (REPO_ROOT / "benchmarks").is_dir():
        return REPO_ROOT / "build" / "bench-data"
    return Path(os.environ.get("TMPDIR", tempfile.gettempdir()))


def build_config(ns: argparse.Namespace, default_path: Path, config_cls: type[C]) -> C:
    """Dataclass defaults < config file < config's quick overlay < CLI flags.

    Args:
        ns: Parsed flags, options not given absent (``argument_default=SUPPRESS``);
            ``config`` names the YAML file, ``quick`` selects the overlay.
        default_path: The checked-in config.
        config_cls: The config dataclass (with ``dir`` and ``json_path`` fields).

    Raises:
        ValueError: a bad config file or value (from the dataclass's checks).
    """
    flags = vars(ns)
    config_path = flags.pop("config", None)
    settings = load_config(config_path, default_path, bool(flags.get("quick", False)), config_cls)
    settings.update(flags)
    for key in ("dir", "json_path"):
        if settings.get(key) is not None:
            settings[key] = Path(settings[key])
    if settings.get("dir") is None:
        settings["dir"] = default_data_dir()
    return config_cls(**settings)


def progress_factory() -> Progress:
    """A tqdm progress-bar factory on stderr (no-op bars without tqdm or a terminal)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda desc, total: (lambda n: None)

    def factory(desc: str, total: int) -> Callable[[int], None]:
        bar = tqdm(total=total, desc=desc, leave=False, disable=None, file=sys.stderr)

        def update(n: int) -> None:
            bar.update(n)
            if bar.n >= total:
                bar.close()

        return update

    return factory


def tool_versions() -> dict[str, str]:
    """Python, OS kernel, CPU count, fio and (if its headers are installed) RocksDB versions."""
    out: dict[str, str] = {"python": platform.python_version(), "kernel": platform.release(),
                           "cpus": str(os.cpu_count())}
    if shutil.which("fio"):
        out["fio"] = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    ver = Path("/usr/include/rocksdb/version.h")
    if ver.is_file():
        nums = {k: line.split()[-1] for line in ver.read_text().splitlines()
                for k in ("MAJOR", "MINOR", "PATCH") if line.startswith(f"#define ROCKSDB_{k} ")}
        out["rocksdb"] = ".".join(nums.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH"))
    return out
