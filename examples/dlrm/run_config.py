"""Run configurations: a YAML file of flag defaults and synthetic tables (``--config FILE``),
or a shipped one by name (``--preset NAME``: ``configs/NAME.yaml``, dashes as underscores).

Schema::

    args:                 # defaults for train.py's flags (flags given on the command line win)
      steps: 3000
      embedding_dim: 128
      dram_budget: 1GiB
    tables:               # the synthetic tables (default: data.DEFAULT_TABLES)
      - {name: z0, num_rows: 300000000, pooling_factor: 8, zipf_alpha: 0.9}
      - {name: h0, num_rows: 20000000, pooling_factor: 4}    # the reuse histogram

Every key is checked: an unknown one is an error naming it and the file.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import yaml

from data import SyntheticTableSpec

__all__ = ["CONFIG_DIR", "load_run_config", "preset_path"]

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
_TABLE_KEYS = {"name", "num_rows", "pooling_factor", "zipf_alpha"}


def preset_path(name: str) -> str:
    """The shipped config of ``--preset name``; ValueError listing the presets if unknown."""
    path = os.path.join(CONFIG_DIR, name.replace("-", "_") + ".yaml")
    if not os.path.isfile(path):
        known = sorted(f[:-5].replace("_", "-") for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
        raise ValueError(f"--preset {name!r} is not one of {known}")
    return path


def load_run_config(path: str, flags: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[List[SyntheticTableSpec]]]:
    """(flag defaults by dest name, tables or None) from the YAML file at ``path``.

    Args:
        flags: the parser's flags by dest name (their defaults), to check ``args`` keys.

    Raises:
        ValueError: unreadable file, unknown keys, bad table entries (naming file and key).
    """
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--config {path}: cannot read it: {e}") from None
    if not isinstance(doc, dict) or set(doc) - {"args", "tables"}:
        raise ValueError(f"--config {path}: expected a mapping with keys 'args' and 'tables'")
    args = doc.get("args") or {}
    if not isinstance(args, dict):
        raise ValueError(f"--config {path}: 'args' must be a mapping of flag names to values")
    defaults = {}
    for key, value in args.items():
        dest = str(key).replace("-", "_")
        if dest not in flags or dest in ("config", "preset"):
            raise ValueError(f"--config {path}: args.{key} is not a flag of train.py")
        defaults[dest] = value
    tables = doc.get("tables")
    return defaults, None if tables is None else [_table(path, i, t) for i, t in enumerate(tables)]


def _table(path: str, index: int, entry: Any) -> SyntheticTableSpec:
    where = f"--config {path}: tables[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping")
    unknown = sorted(set(entry) - _TABLE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(_TABLE_KEYS)})")
    name, rows = entry.get("name"), entry.get("num_rows")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name={name!r} must be a non-empty string")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"{where}.num_rows={rows!r} must be a positive integer")
    pooling = entry.get("pooling_factor", 1.0)
    if isinstance(pooling, bool) or not isinstance(pooling, (int, float)) or not pooling >= 1:
        raise ValueError(f"{where}.pooling_factor={pooling!r} must be a number >= 1")
    alpha = entry.get("zipf_alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0):
        raise ValueError(f"{where}.zipf_alpha={alpha!r} must be a number >= 0")
    return SyntheticTableSpec(name, rows, float(pooling), None if alpha is None else float(alpha))
