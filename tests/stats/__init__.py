"""Tests of torchrec_mtrains.stats: reuse curves, traces, synthetic and large-table ids."""
