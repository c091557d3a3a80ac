"""The hardware a plan targets: quantities with units, hardware profiles (YAML, shipped ones
under ``profiles/``), and measuring this machine into one (``probe``, with fio for the
device limit)."""

from torchrec_mtrains.planner.hardware.fio import FioJob, FioResult, FioUnavailable, run_fio
from torchrec_mtrains.planner.hardware.probe import ProbeConfig, ProbeResult, probe
from torchrec_mtrains.planner.hardware.topology import (
    PROFILE_DIR,
    load_topology,
    parse_topology,
    shipped_profiles,
    topology_to_yaml,
)
from torchrec_mtrains.planner.hardware.units import format_quantity, parse_quantity, parse_size

__all__ = [
    "PROFILE_DIR",
    "FioJob",
    "FioResult",
    "FioUnavailable",
    "ProbeConfig",
    "ProbeResult",
    "format_quantity",
    "load_topology",
    "parse_quantity",
    "parse_size",
    "parse_topology",
    "probe",
    "run_fio",
    "shipped_profiles",
    "topology_to_yaml",
]
