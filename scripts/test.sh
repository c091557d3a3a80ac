#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh), then runs the whole test suite,
# slow and multi-process tests included, as CI does, then the C++ drivers under the
# sanitizers (scripts/sanitize.sh: plain, ASan+UBSan, TSan, and clang's thread-safety analysis;
# a few minutes on 2 cores).
# Extra arguments go to pytest (-n 0, or MTRAINS_TEST_WORKERS=0, for one process). MTRAINS_SANITIZE=0 skips the sanitizer step, saying so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# Two pytest workers (pytest-xdist), a test file's tests on one of them (module fixtures run
# once): 11 minutes on 2 cores instead of 21, the tests' subprocess start-ups and waits
# overlapping. MTRAINS_TEST_WORKERS=0 runs them in this one process.
workers=${MTRAINS_TEST_WORKERS:-2}
parallel=()
if [[ $workers != 0 ]]; then parallel=(-n "$workers" --dist loadfile); fi
.venv/bin/python -m pytest -q --durations=20 "${parallel[@]}" tests "$@"  # the 20 slowest: where CI time goes
if [[ ${MTRAINS_SANITIZE:-1} == 0 ]]; then
  echo "[test] MTRAINS_SANITIZE=0: NOT running the C++ sanitizer drivers (scripts/sanitize.sh)"
  exit 0
fi
echo "[test] pytest passed; now the C++ drivers under plain, ASan+UBSan and TSan builds and the clang thread-safety check (scripts/sanitize.sh)"
bash scripts/sanitize.sh
