"""Tests of the mtrains command line (torchrec_mtrains.cli and commands/)."""
