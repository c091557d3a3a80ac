#!/usr/bin/env bash
# Builds the standalone C++ test drivers of csrc/tests (no torch, no Python) three times --
# plain, AddressSanitizer + UndefinedBehaviorSanitizer, ThreadSanitizer -- and runs each;
# then (build `tsa`) checks the core sources and the drivers with clang's thread-safety
# analysis (clang++ -fsyntax-only -Wthread-safety: every GUARDED_BY member accessed and
# every REQUIRES function called with its lock held; common/thread_annotations.h).
# Exits non-zero on any failed check, sanitizer report (halt_on_error=1), build error or
# (tsa) compiler warning; a compiler without a sanitizer's runtime, a missing liburing or
# a missing clang++ fails the script rather than skipping that build.
# Environment: CXX (default g++), CLANGXX (the tsa build's compiler, default clang++),
#              JOBS (parallel compiles, default 2),
#              SANITIZE_BUILDS (default "plain asan tsan tsa"), SANITIZE_DIR (default build/sanitize),
#              FUZZ_ITERS (header-parser fuzz iterations per build, default 200000),
#              POWER_LOSS_IMAGES (test_power_loss's crash images per build, default 1000).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CXX="${CXX:-g++}"
CLANGXX="${CLANGXX:-clang++}"
JOBS="${JOBS:-2}"
OUT="${SANITIZE_DIR:-$ROOT/build/sanitize}"
BUILDS=(${SANITIZE_BUILDS:-plain asan tsan tsa})
export FUZZ_ITERS="${FUZZ_ITERS:-200000}"
export POWER_LOSS_IMAGES="${POWER_LOSS_IMAGES:-1000}"

log() { printf '[sanitize] %s\n' "$*"; }
die() { printf '[sanitize] error: %s\n' "$*" >&2; exit 1; }

# MTRAINS_HAVE_LIBURING: the io_uring engine is built (setup.py defines it when liburing is
# present; here the preflight below requires liburing).
COMMON=(-std=c++17 -O1 -g -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter -Icsrc -pthread
        -DMTRAINS_HAVE_LIBURING)
flags_of() {
  case "$1" in
    plain) echo "" ;;
    asan) echo "-fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
    tsan) echo "-fsanitize=thread" ;;
    *) die "unknown build '$1' (plain, asan, tsan, tsa)" ;;
  esac
}
# The tsa build only compiles (no objects, nothing to run): any warning fails it.
TSA_FLAGS=(-std=c++17 -fsyntax-only -Wall -Wextra -Wno-unused-parameter -Wthread-safety -Werror
           -Icsrc -pthread -DMTRAINS_HAVE_LIBURING)
RUN_BUILDS=()
TSA=0
for b in "${BUILDS[@]}"; do
  if [[ $b == tsa ]]; then TSA=1; else flags_of "$b" >/dev/null; RUN_BUILDS+=("$b"); fi
done

# The core sources the drivers link (everything in csrc/ except the torch bindings).
mapfile -t CORE < <(find csrc/common csrc/storage csrc/cache csrc/kernel csrc/testing -name '*.cc' | sort)
mapfile -t DRIVERS < <(find csrc/tests -name 'test_*.cc' | sort)
((${#DRIVERS[@]})) || die "no drivers in csrc/tests"

# Preflight: liburing and each sanitizer runtime must link and run.
probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
printf '#include <liburing.h>\nint main(){io_uring r; if(io_uring_queue_init(4,&r,0)==0) io_uring_queue_exit(&r); return 0;}\n' >"$probe/p.cc"
for b in "${RUN_BUILDS[@]}"; do
  # shellcheck disable=SC2046
  "$CXX" $(flags_of "$b") "$probe/p.cc" -o "$probe/p" -luring 2>"$probe/err" ||
    die "$CXX cannot build a '$b' program with liburing: $(head -3 "$probe/err") (install liburing-dev and the compiler's sanitizer runtimes, e.g. libasan8 libubsan1 libtsan2)"
  "$probe/p" || die "a '$b' test program does not run on this machine"
done
# The analysis must be live: a guarded read without the lock has to fail the tsa flags
# (a compiler that ignored the annotations would pass every file).
if ((TSA)); then
  command -v "$CLANGXX" >/dev/null ||
    die "$CLANGXX not found: the tsa build needs clang (apt-get install clang)"
  guarded='#include "common/mutex.h"
struct S { mtrains::Mutex mu; int v GUARDED_BY(mu) = 0; };'
  printf '%s\nint Get(S& s) { mtrains::MutexLock l(&s.mu); return s.v; }\n' "$guarded" >"$probe/ok.cc"
  printf '%s\nint Get(S& s) { return s.v; }\n' "$guarded" >"$probe/bad.cc"
  "$CLANGXX" "${TSA_FLAGS[@]}" "$probe/ok.cc" 2>"$probe/err" ||
    die "$CLANGXX rejects a correctly locked access: $(head -3 "$probe/err")"
  if "$CLANGXX" "${TSA_FLAGS[@]}" "$probe/bad.cc" 2>"$probe/err" ||
     ! grep -q 'thread-safety' "$probe/err"; then
    die "$CLANGXX does not report an unlocked access with ${TSA_FLAGS[*]}: the analysis is not active"
  fi
fi

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/mtrains-sanitize.XXXXXX")"
trap 'rm -rf "$probe" "$scratch"' EXIT

start_all=$SECONDS
for b in "${RUN_BUILDS[@]}"; do
  dir="$OUT/$b"
  mkdir -p "$dir"
  t0=$SECONDS
  # shellcheck disable=SC2046
  read -r -a extra <<<"$(flags_of "$b")"
  # Objects are rebuilt only when their source or any header changed (simple and safe).
  newest_header="$(find csrc -name '*.h' -newer "$dir/.stamp" 2>/dev/null | head -1 || true)"
  [[ -f $dir/.stamp && -z $newest_header ]] || rm -f "$dir"/*.o
  printf '%s\n' "${CORE[@]}" "${DRIVERS[@]}" | xargs -P "$JOBS" -I{} bash -c '
    src="$1"; shift; dir="$1"; shift
    obj="$dir/$(echo "$src" | tr / _).o"
    [[ -f $obj && $obj -nt $src ]] || exec "$@" -c "$src" -o "$obj"' _ {} "$dir" "$CXX" "${COMMON[@]}" "${extra[@]}" ||
    die "compiling the '$b' build failed"
  touch "$dir/.stamp"
  core_objs=()
  for src in "${CORE[@]}"; do core_objs+=("$dir/$(echo "$src" | tr / _).o"); done
  for drv in "${DRIVERS[@]}"; do
    name="$(basename "$drv" .cc)"
    "$CXX" "${COMMON[@]}" "${extra[@]}" "$dir/$(echo "$drv" | tr / _).o" "${core_objs[@]}" -o "$dir/$name" -luring ||
      die "linking $name ($b) failed"
  done
  log "$b: built in $((SECONDS - t0)) s"
  for drv in "${DRIVERS[@]}"; do
    name="$(basename "$drv" .cc)"
    t1=$SECONDS
    # TSan looks for races, not parser bugs: a tenth of the fuzz iterations there, and a
    # fifth of the (single-threaded) power-loss driver's crash images.
    iters=$FUZZ_ITERS
    images=$POWER_LOSS_IMAGES
    [[ $b == tsan ]] && iters=$((FUZZ_ITERS / 10)) && images=$((POWER_LOSS_IMAGES / 5))
    # A driver that hangs fails here (DRIVER_TIMEOUT_S, default 600) instead of running into CI's limit.
    if ! FUZZ_ITERS=$iters POWER_LOSS_IMAGES=$images timeout "${DRIVER_TIMEOUT_S:-600}" "$dir/$name" "$scratch" >"$dir/$name.log" 2>&1; then
      tail -40 "$dir/$name.log" >&2
      die "$name failed under the '$b' build (full log: $dir/$name.log)"
    fi
    if grep -q -E 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:' "$dir/$name.log"; then
      grep -m5 -A20 -E 'ERROR: |WARNING: ThreadSanitizer|runtime error:' "$dir/$name.log" >&2
      die "$name: sanitizer report under the '$b' build (full log: $dir/$name.log)"
    fi
    log "$b: $name passed in $((SECONDS - t1)) s"
  done
done
if ((TSA)); then
  dir="$OUT/tsa"
  mkdir -p "$dir"
  t0=$SECONDS
  printf '%s\n' "${CORE[@]}" "${DRIVERS[@]}" | xargs -P "$JOBS" -I{} "$CLANGXX" "${TSA_FLAGS[@]}" {} \
    >"$dir/tsa.log" 2>&1 || {
    grep -m20 -E 'warning|error' "$dir/tsa.log" >&2 || tail -20 "$dir/tsa.log" >&2
    die "the thread-safety analysis (tsa) failed (full log: $dir/tsa.log)"
  }
  log "tsa: ${#CORE[@]} sources and ${#DRIVERS[@]} drivers pass the thread-safety analysis in $((SECONDS - t0)) s"
fi
log "all builds passed (${BUILDS[*]}) in $((SECONDS - start_all)) s"
