#!/usr/bin/env bash
# The project's main job. Until the DLRM training example lands (a later issue),
# it runs the two quick benchmarks, each against its baseline measured in the same
# run: the C++ block store (vs RocksDB, memmap, fio) and training steps of FBGEMM's
# TBE over a row cache on the SCM and SSD tiers (vs FBGEMM all-DRAM).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/mtrains bench store --quick
exec .venv/bin/mtrains bench kernel --quick
