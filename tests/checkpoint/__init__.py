"""Tests of torchrec_mtrains.checkpoint: differential checkpoint chains, export, linked tables, power loss."""
