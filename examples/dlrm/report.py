"""Outputs of the example: AUC, the placement table, metrics.json and plots, written atomically."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = ["auc", "format_table", "write_outputs"]


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties counted half); NaN without both classes."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels) > 0.5
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # average rank per group of tied scores (1-based)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def format_table(rows: Sequence[Dict[str, object]]) -> str:
    """A plain-text table of dicts with equal keys."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [[str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths)))
    return "\n".join([line(keys), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _plots(out: str, metrics: Dict) -> Optional[str]:
    """Writes loss_auc.png and hit_rate.png; returns a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plots"
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(metrics["losses"]) + 1), metrics["losses"], lw=0.8, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("BCE loss")
    curve = metrics.get("auc_curve", [])
    if curve:
        ax2 = ax.twinx()
        ax2.plot([c["step"] for c in curve], [c["auc"] for c in curve], "o-", color="C1", label="AUC (window)")
        ax2.set_ylabel("AUC")
        ax2.legend(loc="lower right")
    ax.legend(loc="upper right")
    ax.set_title("DLRM on tiered tables")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss_auc.png"), dpi=100)
    plt.close(fig)
    hit = metrics["hit_rate"]
    if hit:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = sorted(hit)
        ax.bar(names, [hit[n] for n in names],
               color=[{"SSD": "C3", "SCM": "C2"}.get(metrics["placement"].get(n), "C0") for n in names])
        ax.set_ylim(0, 1)
        ax.set_ylabel("cache hit rate (unique rows per step)")
        ax.set_title("row-cache hit rate per tiered table (red SSD, green SCM)")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "hit_rate.png"), dpi=100)
        plt.close(fig)
    return None


def write_outputs(out: str, metrics: Dict, text: str) -> List[str]:
    """Writes metrics.json, summary.txt and plots into a temporary sibling of ``out`` and
    renames it to ``out`` at the end (a previous ``out`` is replaced only then).
    Returns notes (e.g. no plots)."""
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(os.path.abspath(out)) + "-", dir=parent)
    notes: List[str] = []
    try:
        with open(os.path.join(tmp, "metrics.json"), "w") as f:
            json.dump(metrics, f, indent=1)
        note = _plots(tmp, metrics)
        if note:
            notes.append(note)
        with open(os.path.join(tmp, "summary.txt"), "w") as f:
            f.write(text + "".join(f"\nnote: {n}" for n in notes) + "\n")
        old = None
        if os.path.exists(out):
            old = tmp + ".old"
            os.rename(out, old)
        os.rename(tmp, out)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return notes
