"""One size convention everywhere: GB = 10^9 bytes, GiB = 2^30 bytes (KB/KiB, MB/MiB, TB/TiB
alike), through one parser -- checked at every entry point that reads a size, and every
shipped YAML file loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict

import pytest
import yaml

from tests.support.paths import REPO_ROOT, add_example_to_path
from torchrec_mtrains import Tier
from torchrec_mtrains.planner.hardware.topology import PROFILE_DIR, load_topology, parse_topology, shipped_profiles
from torchrec_mtrains.planner.hardware.units import parse_quantity, parse_size
from torchrec_mtrains.planner.model.model_spec import load_model_spec

add_example_to_path()
from placement import parse_bytes  # noqa: E402  (examples/dlrm is not a package)

_TOPOLOGY = """
name: box
compute_device: cpu
ranks_per_node: 1
compute: {tbe_bandwidth: 1GB/s}
tiers:
  dram: {capacity: 8GiB, read_bandwidth: 10GB/s, write_bandwidth: 8GB/s}
  ssd: {capacity: CAPACITY, read_bandwidth: 2GB/s, write_bandwidth: 1GB/s, access_size: 4KiB}
"""


def _profile_capacity(text: str, flag: str) -> float:
    """A hardware profile's size field, as the YAML loader reads it."""
    return parse_topology(_TOPOLOGY.replace("CAPACITY", json.dumps(text))).tiers[Tier.SSD].capacity_bytes


def _train_flag(text: str, flag: str) -> float:
    """The example's --dram-budget as train.py parses it."""
    import train

    return train.parse_args(["--dram-budget", text]).dram_budget_bytes


# Every entry point that reads a size a user writes: (value, what is named in errors) -> bytes.
FLAG_PARSERS: Dict[str, Callable[[str, str], float]] = {
    "parse_size(bare_bytes=True)": lambda s, flag: parse_size(s, flag, bare_bytes=True),
    "parse_quantity(byte_count)": lambda s, flag: parse_quantity(s, "byte_count", flag),
    "examples placement.parse_bytes": parse_bytes,
}
"""Size flags: a plain number is bytes."""

YAML_PARSERS: Dict[str, Callable[[str, str], float]] = {
    "parse_size": parse_size,
    "parse_quantity(size)": lambda s, flag: parse_quantity(s, "size", flag),
    "hardware profile capacity": _profile_capacity,
}
"""Sizes in YAML files: the unit is required."""

ALL_PARSERS = {**FLAG_PARSERS, **YAML_PARSERS}

WITH_UNIT = [
    ("1.5GB", 1_500_000_000),
    ("1.5GiB", 1.5 * 2**30),
    ("64MiB", 64 * 2**20),
    ("64MB", 64_000_000),
    ("512KiB", 512 * 1024),
    ("8KB", 8000),
    ("2TB", 2e12),
    ("1TiB", 2**40),
    ("100B", 100),
    (" 2 GiB ", 2 * 2**30),
]
BAD = ["64Q", "1.5gb", "64m", "1G", "GB", "", "-1GB", "1.5GB/s", "one GB", "1e999GB"]


@pytest.mark.parametrize("name", sorted(ALL_PARSERS))
@pytest.mark.parametrize("text,expected", WITH_UNIT)
def test_every_parser_reads_si_and_iec_units_alike(name: str, text: str, expected: float) -> None:
    assert ALL_PARSERS[name](text, "--size") == expected


@pytest.mark.parametrize("name", sorted(FLAG_PARSERS))
def test_size_flags_read_a_plain_number_as_bytes(name: str) -> None:
    assert FLAG_PARSERS[name]("4096", "--size") == 4096


@pytest.mark.parametrize("name", sorted(YAML_PARSERS))
def test_yaml_sizes_need_their_unit(name: str) -> None:
    with pytest.raises(ValueError, match="'4096' has no unit"):
        YAML_PARSERS[name]("4096", "tiers.ssd.capacity")


@pytest.mark.parametrize("name", sorted(ALL_PARSERS))
@pytest.mark.parametrize("text", BAD)
def test_bad_sizes_name_the_string(name: str, text: str) -> None:
    with pytest.raises(ValueError) as e:
        ALL_PARSERS[name](text, "--dram-budget")
    assert repr(text) in str(e.value)


@pytest.mark.parametrize("name", sorted(set(ALL_PARSERS) - {"hardware profile capacity"}))
def test_bad_sizes_name_the_flag(name: str) -> None:
    with pytest.raises(ValueError, match="^--dram-budget: .*'64Q'"):
        ALL_PARSERS[name]("64Q", "--dram-budget")


def test_profile_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="tiers.ssd.capacity.*'64Q'"):
        _profile_capacity("64Q", "")


@pytest.mark.parametrize("text,expected", [("1.5GB", 1_500_000_000), ("1.5GiB", 1.5 * 2**30), ("4096", 4096)])
def test_example_flag_parses_the_same(text: str, expected: float) -> None:
    assert _train_flag(text, "--dram-budget") == expected


def test_example_flag_error_names_flag_and_string(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _train_flag("1.5 gigs", "--dram-budget")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--dram-budget" in err and "'1.5 gigs'" in err


# Shipped YAML files -------------------------------------------------------------------------

def _load_profile(path: Path) -> None:
    load_topology(path)


def _load_model(path: Path) -> None:
    assert load_model_spec(str(path)).tables


def _load_bench_config(path: Path) -> None:
    from benchmarks.lib import kernel, store

    loader = {"store.yaml": store, "kernel.yaml": kernel}[path.name]
    for argv in ([], ["--quick"]):
        loader.build_config(argv)  # the config dataclass checks every value


def _load_stats_config(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["rows"] > 0 and doc["batch"] > 0


def _load_example_config(path: Path) -> None:
    import train
    from run_config import load_run_config

    defaults, tables = load_run_config(str(path), vars(train.parse_args([])))
    assert tables
    if "dram_budget" in defaults:
        parse_bytes(str(defaults["dram_budget"]), "args.dram_budget")
    args = train.parse_args(["--config", str(path)])
    assert args.dram_budget_bytes > 0


LOADERS: Dict[str, Callable[[Path], None]] = {
    "torchrec_mtrains/planner/hardware/profiles": _load_profile,
    "benchmarks/configs/models": _load_model,
    "benchmarks/configs/store.yaml": _load_bench_config,
    "benchmarks/configs/kernel.yaml": _load_bench_config,
    "benchmarks/configs/stats.yaml": _load_stats_config,
    "examples/dlrm/configs": _load_example_config,
}
"""Each shipped YAML file (or directory of them) and the loader that reads it in use."""

SHIPPED_YAML = sorted(
    p.relative_to(REPO_ROOT).as_posix()
    for d in ("torchrec_mtrains", "benchmarks", "examples")
    for p in (REPO_ROOT / d).rglob("*.yaml")
)


def _loader_of(rel: str) -> Callable[[Path], None]:
    for key, loader in LOADERS.items():
        if rel == key or rel.startswith(key + "/"):
            return loader
    raise ValueError(f"{rel}: a shipped YAML file no loader in tests/package/test_sizes.py reads; add it to LOADERS")


def test_shipped_yaml_files_are_found() -> None:
    assert len(SHIPPED_YAML) >= 11 and {f"{PROFILE_DIR.relative_to(REPO_ROOT).as_posix()}/{n}.yaml"
                                         for n in shipped_profiles()} <= set(SHIPPED_YAML)


SLOW_YAML = {"benchmarks/configs/models/thousand_tables_23tb.yaml"}
"""Locality curves of 1,000 tables: tens of seconds to load."""


@pytest.mark.parametrize("rel", [pytest.param(r, marks=pytest.mark.slow) if r in SLOW_YAML else r
                                 for r in SHIPPED_YAML])
def test_every_shipped_yaml_loads(rel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)
    _loader_of(rel)(REPO_ROOT / rel)
