"""Tables larger than RAM, end to end: the example DLRM's ``--preset beyond-ram`` trained on
2 ranks (torchrun, DMP, the planner on the ``local`` profile), with everything the run costs
measured beside it in the same run:

- fio's limits of the disk under the storage directory (4 KiB random reads at QD 32, 1 MiB
  sequential writes), measured first;
- the tiered run: QPS in steady state (the last half of the steps), hit rate per tier and
  table (predicted by the planner vs measured on warm caches), SSD I/O per second and MB/s
  (the stores' counters over the run, and the device's over time), the step against the
  roofline max(compute, device time of the measured misses), the perf model's predicted
  step against the measured one, RSS and disk bytes over time (sampled every 2 s: a plot),
  rows materialised per tier, DRAM bytes per SSD-resident row;
- the baseline: the same model with every table's ids hashed down into ``--baseline-rows``
  rows, so that all of it fits in DRAM, trained by FBGEMM's fused kernel alone (the
  planner places every table in DRAM); the QPS ratio.

    .venv/bin/python benchmarks/bench_beyond_ram.py [--steps 3000] [--table-scale 1.0] [--memory-limit 8GiB]

``--memory-limit`` runs the tiered job (and its resume) in a memory cgroup of that size
(memory_cgroup.py: RSS and page cache capped, as on a node with that much RAM); the
baseline runs without it. The report then measures against the limit, not the machine's RAM.
``--sweep 0.5,1,2,4,8`` then trains the tiered job again at each ratio of rows written (the
first run's) to memory limit (beyond_ram_sweep.py): the curve of speed against memory.
Every run gets ``MALLOC_ARENA_MAX=2`` unless the caller's environment sets it: glibc gives
each thread that allocates an arena of its own (up to 8 a core), and the kernel's worker,
I/O and collective threads held 0.3-0.8 GB of them over a 1,000-step run, at the same QPS
(docs/beyond-ram.md, "Memory").

Results: ``--out``/beyond_ram.json, summary.txt, memory_disk.png; the tiered run's own
metrics.json beside them. Figures and their reading: docs/results/beyond-ram.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from torchrec_mtrains.planner.hardware.probe import meminfo_bytes

from benchmarks.lib.beyond_ram_report import RSS_LIMIT_SHARE, figures, steady_step_seconds, summary
from benchmarks.lib.beyond_ram_roofline import (belady_reads_by_rank, fio_cpu_seconds_per_read, roofline_figures,
                                                ssd_trace)
from benchmarks.lib.beyond_ram_sweep import parse_ratios, plot_sweep, sweep_lines, sweep_point
from benchmarks.lib.memory_cgroup import MemoryCgroup, MemoryCgroupUnavailable
from benchmarks.lib.process_monitor import Sample, run_monitored

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "dlrm" / "train.py"
SSD_SHARE_OF_FREE = 0.8  # of the storage directory's free space, for the SSD tier...
SCM_SHARE_OF_FREE = 0.1  # ...and for the SCM tier (the two share the disk)


def fio_limits(directory: Path, seconds: float) -> Dict[str, float]:
    """4 KiB random-read IOPS at QD 32 and 1 MiB sequential-write bytes/s of the disk."""
    from torchrec_mtrains.planner.hardware.fio import FioJob, FioUnavailable, run_fio

    jobs = [FioJob("randread", "randread", 4096, 32), FioJob("write", "write", 1 << 20, 8)]
    try:
        res = run_fio(directory, jobs, size_mb=2048, runtime_s=seconds)
    except FioUnavailable as e:
        print(f"bench_beyond_ram: fio unavailable ({e}): no device limits", file=sys.stderr)
        return {}
    r = res["randread"]
    return {"randread_iops": r.iops, "randread_bytes_per_s": r.bytes_per_s,
            "randread_cpu_s_per_read": fio_cpu_seconds_per_read(r.usr_cpu_pct, r.sys_cpu_pct, r.seconds, r.ios),
            "write_bytes_per_s": res["write"].bytes_per_s}


def local_profile_for(directory: Path, nproc: int, path: Path) -> Path:
    """The ``local`` profile with the SSD and SCM capacities of ``directory``'s free space now
    (the shipped profile's are 0.4 x the free space when it was probed, for each of the two
    tiers that share the disk; this model's bytes go to the SSD tier). Written to ``path``."""
    import yaml

    from torchrec_mtrains.planner.hardware import topology

    shipped = Path(topology.__file__).parent / "profiles" / "local.yaml"
    doc = yaml.safe_load(shipped.read_text())
    free = shutil.disk_usage(directory).free
    doc["tiers"]["ssd"]["capacity"] = f"{int(SSD_SHARE_OF_FREE * free / nproc)}B"
    doc["tiers"]["scm"]["capacity"] = f"{int(SCM_SHARE_OF_FREE * free / nproc)}B"
    doc["source"] = (f"{doc.get('source', '')}; SSD/SCM capacities {SSD_SHARE_OF_FREE}/{SCM_SHARE_OF_FREE} x free "
                     f"space of {directory}")
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def train(nproc: int, out: Path, workdir: Path, extra: List[str], interval: float, timeout_s: float,
          memory_limit: Optional[int] = None):
    """Runs train.py under torchrun while sampling its process tree, in a memory cgroup of
    ``memory_limit`` bytes when given; (metrics, samples, peaks). With a limit, the metrics
    get ``memory_cgroup``: the group's peak, its page cache and RSS at the end, how often the
    limit was hit and the processes killed for memory."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(TRAIN), "--preset", "beyond-ram", "--scm-budget", "none", "--out", str(out), *extra]
    who = f"bench_beyond_ram: {' '.join(cmd)}"
    group = _memory_cgroup(memory_limit) if memory_limit else None
    env = {"MALLOC_ARENA_MAX": "2", **os.environ}
    try:
        try:
            monitor = run_monitored(cmd, out.parent / f"{out.name}.log", str(workdir), interval, timeout_s,
                                    who + (f" (in {group.path}, limit {memory_limit:,} B)" if group else ""),
                                    cwd=ROOT, env=env, **({"preexec_fn": group.enter} if group else {}))
        except SystemExit as e:
            if group is None:
                raise
            raise SystemExit(f"{e}\nmemory cgroup then: {json.dumps(group.usage())}") from None
        usage = group.usage() if group else None
    finally:
        if group is not None:
            group.close()
    with open(out / "metrics.json") as f:
        metrics = json.load(f)
    if usage is not None:  # kept with the run's metrics, for --report-only
        metrics["memory_cgroup"] = usage
        (out / "metrics.json").write_text(json.dumps(metrics))
    return metrics, monitor.samples, monitor.peaks()


def _memory_cgroup(limit: int) -> MemoryCgroup:
    try:
        return MemoryCgroup(limit)
    except MemoryCgroupUnavailable as e:
        raise SystemExit(f"bench_beyond_ram: --memory-limit needs a cgroup v1 memory controller it can "
                         f"write: {e}") from None


def crashed_after(ckpt: Path, step: int) -> None:
    """Leaves ``ckpt`` as a crash right after the save of ``step`` would: the later steps
    are gone and ``latest`` names it. (Their links would otherwise keep the rows the
    first run wrote after ``step`` on disk while the resumed run writes its own.)"""
    from torchrec_mtrains.checkpoint.chain import step_name, step_of, write_atomic

    for name in os.listdir(ckpt):
        later = step_of(name)
        if later is not None and later > step:
            shutil.rmtree(ckpt / name)
    write_atomic(str(ckpt / "latest"), step_name(step))


def resume_check(first: Dict, resumed: Dict, from_step: int, peaks: Dict[str, int]) -> Dict[str, object]:
    """Whether the run resumed at ``from_step`` trained exactly as the uninterrupted one:
    the losses of every step after it and the final AUC, bit for bit."""
    ours, theirs = resumed["losses"][from_step:], first["losses"][from_step:]
    return {"from_step": from_step, "steps_compared": len(ours), "losses_identical": ours == theirs and bool(ours),
            "auc_identical": resumed["auc"] == first["auc"], "auc": resumed["auc"],
            "wall_seconds": resumed["wall_seconds"],
            "train_seconds": resumed["step_times"][-1] if resumed["step_times"] else 0.0,
            "peak_rss_bytes": peaks["rss"], "peak_disk_bytes": peaks["disk_bytes"]}


def plot(samples: List[Sample], ram: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(t, [s.rss / 2**30 for s in samples], label="RSS, all processes")
    ax.plot(t, [s.rss_anon / 2**30 for s in samples], label="of which anonymous")
    ax.plot(t, [s.rss_max_process / 2**30 for s in samples], label="RSS, largest process")
    ax.plot(t, [s.disk_bytes / 2**30 for s in samples], label="disk used by the tiers")
    ax.axhline(ram / 2**30, color="k", ls=":", label="RAM")
    ax.axhline(RSS_LIMIT_SHARE * ram / 2**30, color="r", ls=":", label="RSS limit (50% of RAM)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("GiB")
    ax.set_title("beyond-RAM run: memory and disk over time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    p.add_argument("--table-scale", type=float, default=1.0, help="the preset's tables at this fraction of their rows")
    p.add_argument("--nproc", type=int, default=2, help="ranks")
    p.add_argument("--dir", default=None, help="storage directory (default: a temp dir; removed after)")
    p.add_argument("--out", default="build/beyond-ram", help="results directory")
    p.add_argument("--baseline-rows", type=int, default=1_000_000,
                   help="rows each table's ids are hashed into for the all-DRAM baseline")
    p.add_argument("--baseline-steps", type=int, default=300, help="steps of the baseline run (0: no baseline)")
    p.add_argument("--fio-seconds", type=float, default=10.0, help="seconds per fio job (0: no fio)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between memory/disk samples")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    p.add_argument("--checkpoint-every", type=int, default=1500,
                   help="save a checkpoint every N steps (0: none); SSD tables are linked, not copied")
    p.add_argument("--no-resume", action="store_true",
                   help="skip the resume check (a second run from the next-to-last checkpoint to the end, "
                        "whose losses must equal the first run's)")
    p.add_argument("--memory-limit", default=None,
                   help="run the tiered job in a memory cgroup of this size (e.g. 8GiB): RAM as on a smaller node")
    p.add_argument("--dram-budget", default=None,
                   help="the tiered runs' DRAM budget per rank, e.g. 2GiB (default: the preset's; in a memory "
                        "cgroup, a share of its limit: see budget_within)")
    p.add_argument("--sweep", default=None, metavar="RATIOS",
                   help="after the run, train the tiered job again in a memory cgroup at each ratio of rows "
                        "written (the first run's) to memory limit, e.g. 0.5,1,2,4,8")
    p.add_argument("--lookahead", type=int, default=None,
                   help="the tiered runs' look-ahead window (train.py --lookahead; default: the planner's)")
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the ceiling (Belady's reads over the run's own trace, regenerated: minutes at full scale)")
    p.add_argument("--report-only", action="store_true",
                   help="no runs: recompute the figures and summary from the results already in --out")
    return p.parse_args(argv)


def _saved_run(out: Path):
    """(tiered metrics, samples, peaks, fio limits, baseline metrics or None) saved in ``out``."""
    from benchmarks.lib.process_monitor import DiskCounters

    saved = json.loads((out / "beyond_ram.json").read_text())
    tiered = json.loads((out / "tiered" / "metrics.json").read_text())
    base_path = out / "baseline" / "metrics.json"
    baseline = json.loads(base_path.read_text()) if "baseline" in saved and base_path.exists() else None
    samples = [Sample(s["t"], s["rss"], s["rss_anon"], s.get("rss_file", 0), s["rss_max_process"], 0,
                      s["disk_bytes"], DiskCounters(*s.get("disk", (0, 0, 0, 0)))) for s in saved["samples"]]
    peaks = {"rss": saved["peak_rss_bytes"], "rss_anon": saved["peak_rss_anon_bytes"],
             "rss_max_process": saved["peak_rss_one_process_bytes"], "disk_bytes": saved["peak_disk_bytes"]}
    return tiered, samples, peaks, saved["fio"], baseline


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    out = (ROOT / args.out) if not os.path.isabs(args.out) else Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mtrains-beyond-ram-"))
    work.mkdir(parents=True, exist_ok=True)
    ram = meminfo_bytes()
    limit = _memory_limit(args.memory_limit)
    try:
        ratios = parse_ratios(args.sweep)
    except ValueError as e:
        raise SystemExit(f"bench_beyond_ram: {e}") from None
    if limit or ratios:
        _memory_cgroup(limit or 1 << 30).close()  # fails here, before any run, where no group can be made
    if limit:
        ram = min(ram, limit)  # what the tiered run may hold: the figures measure against it
    if args.report_only:
        tiered, samples, peaks, limits, baseline = _saved_run(out)
        if "memory_cgroup" in tiered:
            ram = min(ram, tiered["memory_cgroup"]["limit_bytes"])
        f = figures(tiered, samples, peaks, ram, limits, baseline)
        saved_sweep = json.loads((out / "beyond_ram.json").read_text()).get("sweep")
        if saved_sweep:
            f["sweep"] = saved_sweep
        if not any(s.disk.reads for s in samples):  # saved without the device's counters: keep its rates
            f["device"] = json.loads((out / "beyond_ram.json").read_text())["device"]
        if baseline is not None and limits.get("randread_cpu_s_per_read"):
            steps = ["--steps", str(len(tiered["step_times"]))]
            scale = ["--table-scale", str(args.table_scale)] if args.table_scale != 1.0 else []
            trace = None if args.no_ceiling else _run_trace(tiered, [*steps, *scale], args.nproc)
            f["cpu_roofline"] = _roofline(tiered, baseline, limits, args.nproc, trace)
        return _report(out, f, samples, ram, summary)
    scale = ["--table-scale", str(args.table_scale)] if args.table_scale != 1.0 else []
    given = ["--dram-budget", args.dram_budget] if args.dram_budget else []
    budget = given or (["--dram-budget", str(budget_within(limit, args.nproc))] if limit else [])
    steps = ["--steps", str(args.steps)] if args.steps else []
    window = ["--lookahead", str(args.lookahead)] if args.lookahead is not None else []
    try:
        limits = fio_limits(work, args.fio_seconds) if args.fio_seconds > 0 else {}
        store = work / "store"
        hardware = local_profile_for(work, args.nproc, out / "hardware.yaml")
        ckpt = work / "ckpt"
        # Two chains kept: the next-to-last save stays for the resume check even when the
        # last one starts a chain.
        saving = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(args.checkpoint_every),
                  "--keep-chains", "2"]
        common = [*steps, *scale, *budget, *window, "--storage-dir", str(store), "--hardware", str(hardware)]
        tiered, samples, peaks = train(args.nproc, out / "tiered", work,
                                       [*common, *(saving if args.checkpoint_every else [])],
                                       args.interval, args.timeout, limit)
        saves = [c["step"] for c in tiered["checkpoints"]]
        if len(saves) >= 2 and not args.no_resume:
            # As after a crash past the next-to-last save: the store files went on changing
            # after it, and the resumed run must still train exactly as the first did.
            crashed_after(ckpt, saves[-2])
            resumed, resumed_samples, resumed_peaks = train(
                args.nproc, out / "resumed", work,
                [*common, "--resume-from", str(ckpt / f"step_{saves[-2]:08d}")], args.interval, args.timeout, limit)
            tiered["resume_check"] = resume_check(tiered, resumed, saves[-2], resumed_peaks)
        shutil.rmtree(ckpt, ignore_errors=True)
        # The sweep's points write stores of their own, and the baseline's disk use starts
        # from nothing: the first run's store goes first (at full scale two do not fit).
        shutil.rmtree(store, ignore_errors=True)
        # Without --dram-budget each point gets a budget within its own limit.
        runs = _sweep(args, ratios, tiered, out, work, [*steps, *scale, *given, "--hardware", str(hardware)])
        baseline = None
        if args.baseline_steps > 0:
            budget = str(4 << 30)  # per rank: the hashed model fits whole
            baseline, _, _ = train(args.nproc, out / "baseline", work,
                                   ["--steps", str(args.baseline_steps), *scale, "--max-rows", str(args.baseline_rows),
                                    "--dram-budget", budget, "--storage-dir", str(store)], args.interval, args.timeout)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    f = figures(tiered, samples, peaks, ram, limits, baseline)
    with_roofline = baseline is not None and bool(limits.get("randread_cpu_s_per_read"))
    trace = _run_trace(tiered, [*steps, *scale], args.nproc) if with_roofline and not args.no_ceiling else None
    if with_roofline:
        f["cpu_roofline"] = _roofline(tiered, baseline, limits, args.nproc, trace)
    if runs:
        f["sweep"] = [sweep_point(r, lim, m, err, limits, baseline) for r, lim, m, err in runs]
        for point, (_, _, m, _) in zip(f["sweep"], runs):
            if m is not None and with_roofline:
                point["cpu_roofline"] = _roofline(m, baseline, limits, args.nproc, trace)
    return _report(out, f, samples, ram, summary)


def _run_trace(tiered: Dict, train_flags: List[str], nproc: int):
    """The run's SSD tables' ids, regenerated (beyond_ram_roofline.ssd_trace)."""
    ssd = sorted({n.split(".r", 1)[0] for n, s in tiered["tiers"]["shards"].items() if s["tier"] == "SSD"})
    if not ssd:
        return None
    print(f"bench_beyond_ram: regenerating the run's trace of {', '.join(ssd)} for Belady's reads ...", flush=True)
    return ssd_trace(["--preset", "beyond-ram", *train_flags], ssd, len(tiered["step_times"]), nproc)


def _roofline(metrics: Dict, baseline: Dict, limits: Dict[str, float], nproc: int, trace) -> Dict[str, object]:
    """The run's CPU roofline and ceiling (beyond_ram_roofline.py), the baseline's step as its compute."""
    belady = belady_reads_by_rank(metrics, trace) if trace is not None else None
    return roofline_figures(metrics, steady_step_seconds(metrics), steady_step_seconds(baseline),
                            limits["randread_cpu_s_per_read"], (os.cpu_count() or 1) / nproc, belady)


RANK_BASE_BYTES = 5 << 28
"""What one rank of the example holds beside its DRAM cache (1.25 GiB): torch, FBGEMM and
TorchRec, the dense model, batches, the allocator's slack. Measured: two ranks with 512 MiB
caches peaked at 3.34 GB in a 4 GiB memory group, 4.33 GB in a 4.7 GB one."""
MIN_BUDGET_BYTES = 32 << 20


def budget_within(limit: int, nproc: int) -> int:
    """The DRAM budget per rank (bytes) of ``nproc`` ranks in a memory cgroup of ``limit``
    bytes: half of what the ranks leave beside their base (the rest for the page cache the
    group also counts, the SSD tier's buffers and the planner's estimates), at least 32 MiB.
    As on a node with less memory, a smaller limit gets a smaller cache."""
    return max(MIN_BUDGET_BYTES, (limit - nproc * RANK_BASE_BYTES) // (2 * nproc) >> 20 << 20)


def _sweep(args: argparse.Namespace, ratios: List[float], tiered: Dict, out: Path, work: Path,
           common: List[str]) -> List[tuple]:
    """Trains the tiered job at each ``rows written / limit`` ratio (a store of its own,
    removed after; without ``--dram-budget`` a budget within the point's limit); (ratio,
    limit, metrics or None, why it did not finish) per point."""
    written = sum(tiered["tiers"]["materialised_bytes"].values())
    if ratios and written <= 0:
        why = "the first run wrote no rows to SSD or SCM (every table fit in DRAM): no limit to set by rows written"
        return [(ratio, 0, None, why) for ratio in ratios]
    runs = []
    for ratio in ratios:
        limit = int(written / ratio)
        point_store = work / "sweep-store"
        try:
            budget = [] if args.dram_budget else ["--dram-budget", str(budget_within(limit, args.nproc))]
            metrics, _, _ = train(args.nproc, out / f"sweep_{ratio:g}", work,
                                  [*common, *budget, "--storage-dir", str(point_store)], args.interval, args.timeout,
                                  limit)
            runs.append((ratio, limit, metrics, ""))
        except (SystemExit, ValueError) as e:  # stopped for memory, or a limit too small to set: a point all the same
            runs.append((ratio, limit, None, str(e)[-2000:]))
        finally:
            shutil.rmtree(point_store, ignore_errors=True)
    return runs


def _memory_limit(text: Optional[str]) -> Optional[int]:
    """``--memory-limit`` in bytes (None when not given)."""
    if text is None:
        return None
    from torchrec_mtrains.planner.hardware.units import parse_size

    try:
        return int(parse_size(text, "--memory-limit", bare_bytes=True))
    except ValueError as e:
        raise SystemExit(f"bench_beyond_ram: {e}") from None


def _report(out: Path, f: Dict, samples: List[Sample], ram: int, summary) -> int:
    text = summary(f)
    (out / "beyond_ram.json").write_text(json.dumps(
        {**f, "samples": [{"t": s.t, "rss": s.rss, "rss_anon": s.rss_anon, "rss_file": s.rss_file,
                           "rss_max_process": s.rss_max_process, "disk_bytes": s.disk_bytes,
                           "disk": [s.disk.reads, s.disk.read_bytes, s.disk.writes, s.disk.write_bytes]}
                          for s in samples]}, indent=1))
    if f.get("sweep"):
        text += "\n" + "\n".join(sweep_lines(f["sweep"]))
        plot_sweep(f["sweep"], out / "sweep.png")
    (out / "summary.txt").write_text(text + "\n")
    plot(samples, ram, out / "memory_disk.png")
    print(text)
    print(f"results in {out}")
    return 0
