"""Tests of benchmarks/: test_bench_<name>.py for benchmarks/bench_<name>.py and its benchmarks/lib parts."""
