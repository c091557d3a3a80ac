"""Tests of torchrec_mtrains.storage and the C++ storage core (csrc/storage): the block store,
the SCM and DRAM stores, file locks, damaged files and power loss."""
