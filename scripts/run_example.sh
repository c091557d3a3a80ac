#!/usr/bin/env bash
# The project's main job. Until the DLRM training example lands (a later issue),
# it runs the quick block-store benchmark: the C++ block store against RocksDB
# and the fio device limit, measured in the same run. Extra arguments go to it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/mtrains bench store --quick "$@"
