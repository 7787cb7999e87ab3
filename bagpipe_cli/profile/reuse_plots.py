"""PNG plots of what lookahead buys (`profile/reuse.py`): the shares against the distance k,
overall and one small panel per table, and the histogram of the batches' reuse factors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FixedLocator,
    FuncFormatter,
    MaxNLocator,
    NullLocator,
    PercentFormatter,
)

from bagpipe_cli.profile.plots import DPI, _si, _subtitle

if TYPE_CHECKING:
    from bagpipe_cli.profile import ProfileResult

WINDOW = ("#08519c", "-", "in one of batches b..b+k-1 (what lookahead k keeps)")
IN_B = ("#e6550d", "--", "in batch b")
PANEL_COLUMNS = 6  # small multiples a row


def _k_axis(ax, depth: int) -> None:
    """k from 1 to K: log 2 with ticks at the powers of 2 (and K) when K >= 8."""
    if depth >= 8:
        ax.set_xscale("log", base=2)
        ticks = sorted({2**i for i in range(int(math.log2(depth)) + 1)} | {depth})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlim(1 / 1.06, depth * 1.06)  # the end points' markers whole
    else:
        ax.xaxis.set_major_locator(FixedLocator(range(1, depth + 1)))
        ax.set_xlim(0.5, depth + 0.5)
    ax.set_ylim(0, 1.04)  # a line at 100% stays clear of the frame
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.grid(True, alpha=0.3)


def _lines(ax, reuse, rows: np.ndarray, in_batch: np.ndarray, in_window: np.ndarray,
           lw: float, label: bool) -> None:
    ms = 4.5 if label else 3.0
    for (color, ls, name), part, size in ((WINDOW, in_window, ms), (IN_B, in_batch, 0.6 * ms)):
        ax.plot(reuse.ks, reuse.share(part, rows), color=color, ls=ls, lw=lw,
                marker="o" if reuse.depth <= 16 else None, ms=size,  # at k = 1 they are one
                label=name if label else None)


def plot_lookahead_reuse(result: ProfileResult, path: Path) -> None:
    """Share of batch b+k's distinct rows already read, against k: overall on top, one small
    panel per table below (same axes), so 26 tables stay legible."""
    r = result.lookahead_reuse
    names, n = r.tables, len(r.tables)
    cols = min(PANEL_COLUMNS, max(n, 1))
    grid_rows = -(-n // cols)
    fig = Figure(figsize=(max(10.0, 2.3 * cols), 4.2 + 1.75 * grid_rows), dpi=DPI)
    gs = fig.add_gridspec(1 + grid_rows, cols, height_ratios=[2.6] + [1.0] * grid_rows)
    top = fig.add_subplot(gs[0, :])
    o = r.overall()
    _lines(top, r, o["rows"], o["in_batch"], o["in_window"], 2.2, True)
    _k_axis(top, r.depth)
    top.set_xlabel("distance k (batches)")
    top.set_ylabel("share of batch b+k's\ndistinct rows")
    top.set_title("all tables", fontsize=10, loc="left")
    top.legend(fontsize=9, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False,
               title="rows of batch b+k already read:", title_fontsize=9, alignment="right")
    for i, name in enumerate(names):
        ax = fig.add_subplot(gs[1 + i // cols, i % cols])
        _lines(ax, r, r.rows[i], r.in_batch[i], r.in_window[i], 1.4, False)
        _k_axis(ax, r.depth)
        ax.tick_params(labelsize=7)
        card = result.dataset["tables"][i]["cardinality"]
        ax.set_title(f"{name} ({_si(card)} rows)", fontsize=8, pad=3)
        if not r.rows[i].any():
            ax.text(0.5, 0.5, "no accesses", transform=ax.transAxes, ha="center", fontsize=8)
        if i % cols:
            ax.tick_params(labelleft=False)
    fig.suptitle("What lookahead buys: the rows of batch b+k that batch b, or one of batches "
                 f"b..b+k-1, read too (k = 1..{r.depth})\n{_subtitle(result)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)


def plot_reuse_factor(result: ProfileResult, path: Path) -> None:
    """Histogram over batches of accesses per distinct row, with its median, p10 and p90."""
    rf = result.reuse_factor
    edges, counts = rf.histogram()
    s = rf.summary()
    fig = Figure(figsize=(8, 5), dpi=DPI)
    ax = fig.add_subplot()
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#9ecae1",
           edgecolor="#4292c6", lw=0.6, label=_batches_label(rf))
    for key, ls in (("p10", "--"), ("median", "-"), ("p90", ":")):
        ax.axvline(s[key], color="#d62728", ls=ls, lw=1.6, label=f"{key}: {s[key]:.3g}")
    ax.set_xlabel("reuse factor: accesses of a batch per distinct row it reads")
    ax.set_ylabel("batches")
    ax.set_ylim(0, 1.45 * max(int(counts.max()), 1))  # room for the legend above the bars
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper right")
    ax.set_title(f"Reuse within a batch\n{_subtitle(result)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)


def _batches_label(rf) -> str:
    n, left = int(rf.counted.sum()), int((~rf.counted).sum())
    return f"batches ({n:,}" + (", the final partial one left out)" if left else ")")
