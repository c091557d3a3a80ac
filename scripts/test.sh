#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh), then runs the whole test suite,
# slow and multi-process tests included, as CI does. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q tests "$@"
