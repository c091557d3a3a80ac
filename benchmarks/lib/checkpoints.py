"""Differential checkpoints, end to end: the example DLRM (examples/dlrm/train.py, torchrun,
2 ranks) trained twice on the same seed -- so the same training -- saving every
``--checkpoint-every`` steps with ``--keep-chains 1``:

- the baseline, ``--full-every 1``: every save a full checkpoint;
- the measured run, ``--full-every K``: chains of a full save and deltas;
- the async run: the measured one saving in the background (``--async-checkpoint``);
- one run per ``--quantize`` kind: the measured one with lossy deltas
  (``--checkpoint-quantize``);
- the same training without saves (what each run's saves cost in wall time);

then, from the last step of the measured run and of each quantized one, a resume that
trains ``--resume-steps`` more steps: the restore's seconds and the AUC after it
(quantized deltas against exact ones);

with the sequential write and read bandwidth of the checkpoint directory's filesystem
measured first, in the same run (fio, or a Python loop without it). The checkpoint
directory's disk use is sampled during each run. Figures, targets and their reading:
``checkpoints_report.py``.

    .venv/bin/python benchmarks/bench_checkpoint.py [--steps 400] [--checkpoint-every 50] [--full-every 8]

Results: ``--out`` (JSON: the raw figures of both runs, the figures and the targets); the
runs' own metrics.json under ``--workdir``, removed after the run unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.lib.process_monitor import run_monitored

__all__ = ["RUNS", "main", "parse_args", "run_example", "saved_steps"]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "dlrm" / "train.py"
KEEP_CHAINS = 1  # both runs: the disk-use figures compare one kept chain against one kept full save
RUNS = ("baseline", "measured", "async")  # --full-every 1, --full-every K, K in the background
NO_SAVES = "no_saves"  # the same training without checkpoints: the time the saves cost


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400, help="training steps of each run")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between saves")
    p.add_argument("--full-every", type=int, default=8, help="the measured run's --full-every (saves per chain)")
    p.add_argument("--link-ssd-tables", action="store_true",
                   help="save SSD tables by linking their store files (the example's default); without it both "
                        "runs copy their rows (--copy-ssd-tables), which is what the targets compare")
    p.add_argument("--nproc", type=int, default=2, help="ranks")
    p.add_argument("--quantize", default="int8,fp16",
                   help="comma-separated lossy delta kinds to run too (fp16, int8; empty: none)")
    p.add_argument("--skip", default="",
                   help="comma-separated runs to leave out: async, no_saves (their figures are then not "
                        "reported; for long runs, e.g. the beyond-RAM preset)")
    p.add_argument("--resume-steps", type=int, default=50,
                   help="steps each resume trains after restoring (its AUC compares quantized deltas with exact)")
    p.add_argument("--workdir", default=None,
                   help="checkpoints, tier files and the runs' outputs (default: a temp dir); its checkpoint "
                        "and storage directories are removed after the run unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints and tier files under --workdir")
    p.add_argument("--example-args", default="",
                   help="more train.py flags for both runs, one string (e.g. \"--table-scale 0.1\")")
    p.add_argument("--disk-method", choices=("auto", "fio", "python"), default="auto",
                   help="how sequential bandwidth is measured: fio (io_uring, O_DIRECT), a Python loop, or fio "
                        "when it runs here")
    p.add_argument("--disk-mb", type=int, default=1024, help="size of the bandwidth test file, MiB")
    p.add_argument("--fio-seconds", type=float, default=5.0, help="seconds per fio job")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between samples of the checkpoint dir's size")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is killed")
    p.add_argument("--out", default="build/bench-checkpoint.json", help="results JSON")
    p.add_argument("--report-only", metavar="RESULTS.json", default=None,
                   help="no runs: recompute and print the figures and targets of a results file")
    args = p.parse_args(argv)
    for name in ("steps", "checkpoint_every", "full_every", "nproc", "disk_mb"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps < 2 * args.checkpoint_every:
        p.error(f"--steps {args.steps} gives fewer than 2 saves at --checkpoint-every {args.checkpoint_every}")
    if not args.fio_seconds > 0 or not args.interval > 0:
        p.error("--fio-seconds and --interval must be > 0")
    banned = {"--checkpoint-dir", "--checkpoint-every", "--full-every", "--keep-chains", "--steps", "--out",
              "--storage-dir", "--resume", "--async-checkpoint", "--checkpoint-quantize"}
    args.example = shlex.split(args.example_args)
    args.quantize_kinds = [k for k in args.quantize.split(",") if k]
    args.skipped = sorted({k for k in args.skip.split(",") if k})
    if set(args.skipped) - {"async", NO_SAVES}:
        p.error(f"--skip {args.skip!r}: runs that may be skipped are async and {NO_SAVES}")
    if any(k not in ("fp16", "int8") for k in args.quantize_kinds):
        p.error(f"--quantize {args.quantize!r}: kinds are fp16 and int8")
    clash = sorted(banned & {a.split("=")[0] for a in args.example})
    if clash:
        p.error(f"--example-args must not set {', '.join(clash)}: the bench sets them")
    return args


def saved_steps(directory: Path) -> Dict[int, int]:
    """Checkpoint steps in ``directory`` -> bytes of their files (``trainer.json`` and the
    ``links/`` of SSD tables' store files not counted, as in the saves' own ``bytes``)."""
    from torchrec_mtrains.checkpoint.chain import step_of

    out: Dict[int, int] = {}
    for name in sorted(os.listdir(directory)) if directory.is_dir() else []:
        step = step_of(name)
        if step is not None:
            files = [f for f in (directory / name).iterdir() if f.name != "trainer.json" and f.is_file()]
            out[step] = sum(f.stat().st_size for f in files)
    return out


def run_example(args: argparse.Namespace, name: str, full_every: int, work: Path, outputs: Path,
                extra: Sequence[str] = (), resume: bool = False) -> Dict:
    """Trains one run under torchrun while sampling its checkpoint directory; its raw figures:
    the saves, wall seconds, losses, step times, sampled disk use and the steps left on disk.
    ``resume``: continues from the run ``name``'s last checkpoint for ``--resume-steps`` (no
    saves; its own tier files), for the restore's time and the AUC after it."""
    ckpt, store, out = work / name / "ckpt", work / name / ("store_resumed" if resume else "store"), outputs / name
    if resume:
        out = outputs / f"{name}_resumed"
    for d in (store,) if resume else (ckpt, store):
        shutil.rmtree(d, ignore_errors=True)
    ckpt.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps + args.resume_steps if resume else args.steps
    every = 0 if name == NO_SAVES else args.checkpoint_every
    saves = ["--resume", "--checkpoint-every", "0"] if resume else ["--checkpoint-every", str(every)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           str(TRAIN), *args.example, "--steps", str(steps), *saves,
           "--checkpoint-dir", str(ckpt), "--full-every", str(full_every), "--keep-chains", str(KEEP_CHAINS),
           "--storage-dir", str(store), "--out", str(out), *([] if args.link_ssd_tables else ["--copy-ssd-tables"]),
           *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"bench_checkpoint: {name} run: {shlex.join(cmd)}", flush=True)
    monitor = run_monitored(cmd, outputs / f"{name}.log", str(ckpt), args.interval, args.timeout,
                            f"bench_checkpoint: the {name} run", cwd=ROOT, env=env)
    metrics = json.loads((out / "metrics.json").read_text())
    samples = monitor.samples
    if resume:
        return {"command": shlex.join(cmd), "restore_seconds": metrics["restore_seconds"], "auc": metrics["auc"],
                "resumed_from": metrics["resumed_from"], "losses": metrics["losses"]}
    if name == NO_SAVES:
        return {"command": shlex.join(cmd), "wall_seconds": metrics["wall_seconds"], "step_times": metrics["step_times"],
                "losses": metrics["losses"]}
    return {
        "full_every": full_every, "keep_chains": KEEP_CHAINS, "command": shlex.join(cmd),
        "checkpoints": metrics["checkpoints"], "wall_seconds": metrics["wall_seconds"],
        "losses": metrics["losses"], "placement": metrics["placement"], "step_times": metrics["step_times"],
        "auc": metrics["auc"],
        "peak_sampled_disk_bytes": max((s.disk_bytes for s in samples), default=0),
        "disk_samples": len(samples),
        "on_disk_at_end": {str(k): v for k, v in saved_steps(ckpt).items()},
    }


def _drop_files(args: argparse.Namespace, work: Path, name: str) -> None:
    """Removes a run's checkpoints and tier files, unless ``--keep``."""
    if not args.keep:
        for sub in ("ckpt", "store", "store_resumed"):
            shutil.rmtree(work / name / sub, ignore_errors=True)


def main(argv: Optional[List[str]] = None) -> int:
    from benchmarks.lib.checkpoints_report import evaluate, summary
    from benchmarks.lib.seq_bandwidth import measure

    args = parse_args(argv)
    if args.report_only:
        raw = json.loads(Path(args.report_only).read_text())["raw"]
        print(summary(raw, *evaluate(raw)))
        return 0
    out = Path(args.out) if os.path.isabs(args.out) else ROOT / args.out
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="mtrains-bench-ckpt-"))
    work.mkdir(parents=True, exist_ok=True)
    raw: Dict = {"config": {k: v for k, v in vars(args).items() if k not in ("example", "report_only")},
                 "checkpoint_fs": str(work)}
    try:
        raw["disk"] = measure(work, args.disk_method, args.disk_mb, args.fio_seconds).as_dict()
        outputs = work / "outputs"
        extras = {"baseline": [], "measured": [], "async": ["--async-checkpoint"],
                  **{kind: ["--checkpoint-quantize", kind] for kind in args.quantize_kinds}}
        extras = {name: extra for name, extra in extras.items() if name not in args.skipped}
        resumed = ["measured", *args.quantize_kinds] if args.resume_steps else []
        raw["runs"] = {}
        for name, extra in extras.items():
            raw["runs"][name] = run_example(args, name, 1 if name == "baseline" else args.full_every, work, outputs,
                                            extra)
            if name not in resumed:
                _drop_files(args, work, name)  # bounds the disk a long run (beyond RAM) needs
        if NO_SAVES not in args.skipped:
            raw["no_saves"] = run_example(args, NO_SAVES, 1, work, outputs)
            _drop_files(args, work, NO_SAVES)
        raw["resumed"] = {name: run_example(args, name, args.full_every, work, outputs, resume=True)
                          for name in ["measured", *args.quantize_kinds] if args.resume_steps}
    finally:
        for name in [*RUNS, *args.quantize_kinds, NO_SAVES]:
            _drop_files(args, work, name)
        if not args.workdir and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures, targets = evaluate(raw)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"raw": raw, "figures": figures, "targets": [t.__dict__ for t in targets]},
                              indent=1) + "\n")
    print(summary(raw, figures, targets))
    print(f"results in {out}")
    return 0
