#!/usr/bin/env bash
# The project's main job: trains TorchRec's DLRM with its embedding tables on DRAM, SCM
# and SSD tiers (examples/dlrm/train.py), 2 ranks on gloo launched through torchx, on the
# defaults (200 steps of the synthetic data set). Results: metrics.json, summary.txt and
# plots in build/example-run, or in the directory given with --out.
# Usage: bash scripts/run_example.sh [--out DIR] [more train.py flags, e.g. --steps 50 --dcn]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

out="build/example-run"
args=()
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

# torchx's local_cwd scheduler starts the torchrun it finds on PATH: the one in .venv.
export PATH="$PWD/.venv/bin:$PATH"
start=$SECONDS
marker="$(mktemp)"
trap 'rm -f "$marker"' EXIT
# torchx's INFO lines (log directory, tracker, job state) are left out: the job's own output
# follows, and the line below says whether it worked. The component sets OMP_NUM_THREADS, so
# torchrun does not warn that it chose one.
torchx --log_level WARNING run -s local_cwd examples/dlrm/component.py:dlrm -- --out "$out" "${args[@]}"
[[ $out/metrics.json -nt $marker ]] || { echo "run_example: no $out/metrics.json: the run failed (see above)" >&2; exit 1; }
echo "run_example: done in $((SECONDS - start)) s; results in $(cd "$out" && pwd): metrics.json, summary.txt, loss_auc.png, hit_rate.png"
