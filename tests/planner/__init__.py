"""Tests of torchrec_mtrains.planner: the perf model, placement, constraints, hardware profiles."""
