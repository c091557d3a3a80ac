"""Test support that ships with the package: fault points for crash tests and device
faults for block-store tests."""

from torchrec_mtrains.testing.device_faults import enable_device_faults, inject_device_fault
from torchrec_mtrains.testing.faults import PHASES, fault_point

__all__ = ["PHASES", "enable_device_faults", "fault_point", "inject_device_fault"]
