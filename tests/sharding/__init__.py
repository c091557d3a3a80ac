"""Tests of torchrec_mtrains.sharding: TorchRec integration, in this process and in spawned gloo processes."""
