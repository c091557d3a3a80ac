#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh), then runs the whole test suite,
# slow and multi-process tests included, as CI does, then the C++ drivers under the
# sanitizers (scripts/sanitize.sh: plain, ASan+UBSan, TSan, and clang's thread-safety analysis;
# a few minutes on 2 cores).
# Extra arguments go to pytest. MTRAINS_SANITIZE=0 skips the sanitizer step, saying so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q --durations=20 tests "$@"  # the 20 slowest: where CI time goes
if [[ ${MTRAINS_SANITIZE:-1} == 0 ]]; then
  echo "[test] MTRAINS_SANITIZE=0: NOT running the C++ sanitizer drivers (scripts/sanitize.sh)"
  exit 0
fi
echo "[test] pytest passed; now the C++ drivers under plain, ASan+UBSan and TSan builds and the clang thread-safety check (scripts/sanitize.sh)"
bash scripts/sanitize.sh
