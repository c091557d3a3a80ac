"""Tests of torchrec_mtrains.kernels and the row cache (csrc/cache): the tiered embedding bags
against FBGEMM, prefetch, a process ending with prefetches in flight."""
