"""PNG plots of ``mtrains characterize`` (matplotlib, headless Agg backend):

- ``hit_rate_curves.png``: LRU (solid) and LFU (dashed) hit rate over cache size (% of the
  table's rows, log scale), one colour per table;
- ``bandwidth.png``: bandwidth per table at the target QPS, all lookups vs the tier's traffic
  behind a 10% LRU cache;
- ``reuse_histogram.png``: share of lookups by the reuse bin of their row (top) and share of
  unique rows by reuse bin (bottom), dlrm_datasets' bins, per table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np

from torchrec_mtrains.stats.types import TableStats

__all__ = ["MAX_TABLES_PLOTTED", "write_plots"]

MAX_TABLES_PLOTTED = 20
"""Curves and histograms show the tables with the most lookups, at most this many."""


def write_plots(stats: Sequence[TableStats], reports: Sequence[Dict[str, Any]], directory: Path) -> List[Path]:
    """Writes the three PNGs into ``directory`` (created if missing); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    top = sorted(range(len(stats)), key=lambda i: -stats[i].lookups)[:MAX_TABLES_PLOTTED]
    shares = np.logspace(-4, 0, 60)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n, i in enumerate(top):
        s = stats[i]
        colour = f"C{n % 10}"
        ax.plot(100 * shares, 100 * s.lru.hit_rate(shares * s.table_rows), color=colour, label=s.name)
        ax.plot(100 * shares, 100 * s.lfu.hit_rate(shares * s.table_rows), color=colour, linestyle="--")
    ax.set(xscale="log", xlabel="cache size (% of table rows)", ylabel="hit rate (%)", ylim=(0, 100),
           title="Hit rate: LRU (solid), perfect LFU (dashed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    paths.append(_save(fig, directory / "hit_rate_curves.png"))

    fig, ax = plt.subplots(figsize=(max(6, 0.4 * len(reports)), 4.5))
    x = np.arange(len(reports))
    ax.bar(x - 0.2, [r["lookup_bytes_per_s"] / 1e6 for r in reports], 0.4, label="all lookups")
    ax.bar(x + 0.2, [r["tier_bytes_per_s_at_10pct_lru"] / 1e6 for r in reports], 0.4, label="tier, 10% LRU cache")
    ax.set_xticks(x, [r["table"] for r in reports], rotation=60, ha="right", fontsize="small")
    ax.set(ylabel="MB/s", title="Bandwidth per table at the target QPS")
    ax.legend()
    paths.append(_save(fig, directory / "bandwidth.png"))

    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    width = 0.8 / max(1, len(top))
    labels = stats[top[0]].reuse.labels() if top else ()
    views = (("lookup_shares", "lookups (%)", "Share of lookups by reuse bin of their row"),
             ("row_shares", "unique rows (%)", "Share of unique rows by reuse bin"))
    for ax, (attr, ylabel, title) in zip(axes, views):
        for n, i in enumerate(top):
            shares = getattr(stats[i].reuse, attr)
            ax.bar(np.arange(len(shares)) + n * width, 100 * shares, width, label=stats[i].name)
        ax.set(ylabel=ylabel, title=title)
    axes[0].legend(fontsize="small", ncol=2)
    axes[1].set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=60, ha="right", fontsize="small")
    axes[1].set(xlabel="lookups of a row over the trace")
    paths.append(_save(fig, directory / "reuse_histogram.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
