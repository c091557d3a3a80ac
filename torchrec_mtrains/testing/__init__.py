"""Test support that ships with the package (fault injection for crash tests)."""

from torchrec_mtrains.testing.faults import PHASES, fault_point

__all__ = ["PHASES", "fault_point"]
