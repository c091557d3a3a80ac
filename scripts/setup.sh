#!/usr/bin/env bash
# Prepares the repository for development, tests and benchmarks:
#   1. system packages (liburing-dev, librocksdb-dev, fio, and clang for the thread-safety
#      check of scripts/sanitize.sh) via apt-get, if missing;
#   2. a Python 3.11 virtual environment in .venv;
#   3. the pinned Python dependencies (requirements/pinned.txt), in the order that works;
#   4. the package itself, editable, with its C++ extension torchrec_mtrains._C: the same
#      `pip install --no-build-isolation .` (setup.py) a user runs, with -e for development.
# Idempotent: steps 3 and 4 are skipped when stamp files in .venv match the hash of
# their inputs, so a second run takes a second or two.
# Environment: PYTHON (interpreter for a new .venv, default python3.11),
#              MAX_JOBS (parallel C++ compile jobs, default 2),
#              MTRAINS_NO_LIBURING=1 (build without the io_uring engine; see setup.py),
#              MTRAINS_DEBUG=1 (the extension with debug info, for gdb and perf; see setup.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
LOCK="requirements/pinned.txt"
APT_PACKAGES=(liburing-dev librocksdb-dev fio clang)

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
vpip() { "$PY" -m pip --disable-pip-version-check "$@"; }
hash_of() { sha256sum | cut -d' ' -f1; }

install_system_packages() {
  if ! command -v dpkg-query >/dev/null; then
    log "not a Debian-like system: make sure liburing, RocksDB, fio and clang are installed"
    return
  fi
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || { log "system packages present: ${APT_PACKAGES[*]}"; return; }
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
    die "missing system packages: ${missing[*]} (install them: sudo apt-get install ${missing[*]})"
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Refresh the package lists only when apt knows no candidate for a package.
  for p in "${missing[@]}"; do
    if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      log "apt-get update"
      apt-get update -q >/dev/null
      break
    fi
  done
  log "installing system packages: ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

create_venv() {
  if [[ ! -x $PY ]]; then
    local python="${PYTHON:-python3.11}"
    command -v "$python" >/dev/null || die "$python not found (set PYTHON=/path/to/python3.11)"
    log "creating .venv with $("$python" --version)"
    "$python" -m venv "$VENV"
  fi
  local version
  version="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  [[ $version == 3.11 ]] || die ".venv has Python $version, the pins need 3.11: remove .venv and run again"
}

install_dependencies() {
  local stamp="$VENV/.mtrains-deps" want
  want="$({ cat "$LOCK"; "$PY" -VV; } | hash_of)"
  if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
    log "Python dependencies up to date ($LOCK)"
    return
  fi
  # See the header of $LOCK for why the order matters.
  log "installing Python dependencies from $LOCK (a few minutes on a new machine)"
  log "  1/5 pip, setuptools";        vpip install -qq -c "$LOCK" pip setuptools
  log "  2/5 torch (CPU build)";      vpip install -qq -c "$LOCK" torch
  log "  3/5 fbgemm-gpu-cpu";         vpip install -qq -c "$LOCK" fbgemm-gpu-cpu
  log "  4/5 torchrec (--no-deps)";   vpip install -qq -c "$LOCK" --no-deps torchrec
  log "  5/5 the rest (--no-deps)";   vpip install -qq --no-deps -r "$LOCK"
  local problems
  problems="$(vpip check 2>&1 | grep -v -e '^torchrec .* requires fbgemm-gpu' -e '^No broken requirements' || true)"
  [[ -z $problems ]] || die "inconsistent Python dependencies (is $LOCK complete?): $problems"
  printf '%s\n' "$want" >"$stamp"
}

build_package() {
  [[ -d csrc ]] || die "csrc/ not found: nothing to build"
  local stamp="$VENV/.mtrains-build" want
  want="$({ cat "$VENV/.mtrains-deps" setup.py pyproject.toml; echo "MTRAINS_NO_LIBURING=${MTRAINS_NO_LIBURING:-} MTRAINS_DEBUG=${MTRAINS_DEBUG:-}"
            find csrc -type f -print0 | sort -z | xargs -0 sha256sum; } | hash_of)"
  if [[ -f $stamp && $(<"$stamp") == "$want" && -x $VENV/bin/mtrains ]] &&
     compgen -G 'torchrec_mtrains/_C*.so' >/dev/null; then
    log "C++ extension up to date"
    return
  fi
  log "building torchrec_mtrains and its C++ extension (objects in build/ext; ninja rebuilds only changed files)"
  # The warning silenced here is setuptools' generic banner about editable installs.
  MAX_JOBS="${MAX_JOBS:-2}" PYTHONWARNINGS="ignore:Editable installation" \
    vpip install -qq --no-build-isolation --no-deps -e .
  compgen -G 'torchrec_mtrains/_C*.so' >/dev/null || die "the build produced no torchrec_mtrains/_C*.so"
  printf '%s\n' "$want" >"$stamp"
}

install_system_packages
create_venv
install_dependencies
build_package
log "ready: $("$PY" --version), torch $("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))'), mtrains $("$VENV/bin/mtrains" --version | cut -d' ' -f2)"
