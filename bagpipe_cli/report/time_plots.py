"""The report's figures over time: the timeline of every role (a Gantt chart of traced runs),
the overlap of transfers with compute, and held-out AUC against training time and iteration.

Like `report/plots.py`: matplotlib's object API, stored results in, a `Figure` (or None) out.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bagpipe_cli.engine.registry import role
from bagpipe_cli.report.analysis import BASELINE
from bagpipe_cli.report.plots import DPI, system_color, variant_styles
from bagpipe_cli.report.timeline import CONTAINER_CATS, Overlap, Timeline

# What a slice looks like: by its category (and, on a server, by its request).
SLICE_STYLE = {
    "plan": ("#8c564b", "oracle: read and plan a round"),
    "planning": ("#8c564b", "oracle: read and plan a round"),
    "send": ("#c49c94", "oracle: send a round"),
    "queue": ("#e7e7e7", "oracle: ahead, queue full"),
    "data": ("#c49c94", "trainer: data wait"),
    "wait": ("#d62728", "trainer: wait for rows (fetch, prefetch landing)"),
    "request": ("#9467bd", "trainer: prefetch issued"),
    "insert": ("#c5b0d5", "trainer: insert rows into the cache"),
    "read": ("#f7b6d2", "trainer: read rows"),
    "forward": ("#1f77b4", "forward"),
    "backward": ("#6baed6", "backward"),
    "optimizer": ("#2ca02c", "optimizer (row updates, write-backs queued)"),
    "sync": ("#fdd0a2", "synchronise"),
    "collective": ("#ff7f0e", "collective (all-reduce, sums)"),
    "sum": ("#ff7f0e", "collective (all-reduce, sums)"),
    "settle": ("#ffbb78", "settle sync_later sums"),
    "evict": ("#969696", "evict"),
    "checkpoint": ("#252525", "checkpoint / evaluation"),
    "eval": ("#252525", "checkpoint / evaluation"),
    "serve:fetch": ("#17375e", "server: serve a fetch"),
    "serve:write-back": ("#7f7f7f", "server: write-back"),
    "serve:push": ("#bcbd22", "server: gradient push"),
    "apply": ("#dbdb8d", "server: apply pushed gradients"),
}


@dataclass
class TimelinePanel:
    """One run's steady-state window: where it is drawn (`row` label, `column` label), its
    slices, the window and the overlap of transfers with compute over its measured iterations."""

    row: str
    column: str
    timeline: Timeline
    t0: float
    t1: float
    iterations: list[int]
    overlap: Overlap


def _style_key(cat: str, name: str) -> str:
    return f"serve:{name}" if cat == "serve" else cat


def _track_label(role: str, thread: str, threads_of_role: int) -> str:
    return f"{role} · {thread}" if threads_of_role > 1 else role


def _draw_panel(ax, p: TimelinePanel, width: float, used: set[str]) -> None:
    ev = p.timeline.events
    ev = ev[(ev["end"] > p.t0) & (ev["start"] < p.t1) & ~ev["cat"].isin(CONTAINER_CATS)]
    tracks = [t for t in p.timeline.tracks if ((ev["role"] == t[0]) & (ev["thread"] == t[1])).any()]
    per_role = pd.Series([r for r, _ in tracks]).value_counts().to_dict()
    for y, (who, thread) in enumerate(tracks):
        mine = ev[(ev["role"] == who) & (ev["thread"] == thread)]
        mine = mine.assign(d=mine["end"] - mine["start"]).sort_values("d", ascending=False)
        for r in mine.itertuples():  # longest first: nested slices are drawn over their parent
            key = _style_key(r.cat, r.name)
            colour = SLICE_STYLE.get(key, ("#dddddd", key))[0]
            used.add(key)
            x0 = (max(r.start, p.t0) - p.t0) * 1e3
            x1 = (min(r.end, p.t1) - p.t0) * 1e3
            ax.broken_barh([(x0, max(x1 - x0, 0.02))], (y - 0.38, 0.76), facecolors=colour,
                           edgecolor="none")
    its = p.timeline.events
    its = its[(its["cat"] == "iteration") & its["iteration"].isin(p.iterations)
              & its["role"].str.startswith("trainer")].drop_duplicates("iteration")
    for r in its.itertuples():
        x = (r.start - p.t0) * 1e3
        ax.axvline(x, color="black", lw=0.5, ls=":", zorder=0)
        ax.text(x, len(tracks) - 0.45, f" {r.iteration}", fontsize=7, va="bottom", ha="left")
    ax.set_yticks(range(len(tracks)), [_track_label(r, t, per_role[r]) for r, t in tracks],
                  fontsize=8)
    ax.set_ylim(len(tracks) - 0.4, -0.6)
    ax.set_xlim(0, width)
    share = p.overlap.share
    hidden = "no transfers" if math.isnan(share) else f"{share:.0%} of transfer time hidden"
    ax.set_title(f"{p.row}: iterations {p.iterations[0]}–{p.iterations[-1]} in "
                 f"{(p.t1 - p.t0) * 1e3:.0f} ms; {hidden}", fontsize=9, loc="left",
                 color=system_color(p.row.split()[0]))


def plot_timeline(panels: list[TimelinePanel], subtitle: str) -> Figure | None:
    """A Gantt chart per run: one row per role and thread, rows of runs, a column per setting
    on one time axis (ms from the window's start), iteration starts dotted and numbered."""
    if not panels:
        return None
    columns = list(dict.fromkeys(p.column for p in panels))
    rows = list(dict.fromkeys(p.row for p in panels))
    n_tracks = {r: max(len(p.timeline.tracks) for p in panels if p.row == r) for r in rows}
    height = 1.6 + sum(0.34 * n + 0.55 for n in n_tracks.values())
    fig = Figure(figsize=(7.5 * len(columns) + 1.5, height), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(len(rows), len(columns),
                            height_ratios=[n + 1.2 for n in n_tracks.values()])
    used: set[str] = set()
    for j, col in enumerate(columns):
        mine = [p for p in panels if p.column == col]
        width = max((p.t1 - p.t0) * 1e3 for p in mine) * 1.02
        for p in mine:
            ax = fig.add_subplot(grid[rows.index(p.row), j])
            _draw_panel(ax, p, width, used)
            if rows.index(p.row) == len(rows) - 1 or p is mine[-1]:
                ax.set_xlabel(f"ms from the window's start ({col})", fontsize=8)
    colours = {}  # legend entry -> colour, for the kinds of slice drawn
    for k in SLICE_STYLE:
        if k in used:
            colours.setdefault(SLICE_STYLE[k][1], SLICE_STYLE[k][0])
    handles = [Patch(color=c, label=label) for label, c in colours.items()]
    fig.legend(handles=handles, fontsize=8, ncols=2 if len(columns) == 1 else 4,
               loc="outside lower center", frameon=False)
    sub = textwrap.fill(subtitle, int(fig.get_figwidth() * 11))
    fig.suptitle("Timeline of every role over a few steady-state iterations (from each run's "
                 f"trace)\n{sub}", fontsize=11, x=0.01, ha="left")
    return fig


def plot_overlap(table: pd.DataFrame, subtitle: str) -> Figure | None:
    """Horizontal bars: the share of transfer time hidden behind compute, per variant and
    setting (median over traced repeats), with the seconds behind it."""
    t = table.dropna(subset=["overlap"])
    if t.empty:
        return None
    fig = Figure(figsize=(10, 1.4 + 0.36 * len(t)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(t))[::-1]
    ax.barh(y, 100 * t["overlap"], color=[system_color(s) for s in t["system"]], height=0.7)
    for yy, r in zip(y, t.itertuples(), strict=True):
        ax.text(100 * r.overlap + 1, yy, f"{r.overlap:.0%} of {r.transfer_s * 1e3:.0f} ms",
                va="center", fontsize=8)
    ax.set_yticks(y, [f"{r.variant} | {r.setting}" for r in t.itertuples()], fontsize=8)
    ax.set_xlim(0, 118)
    ax.set_xlabel("transfer time hidden behind compute, % (|transfers ∩ compute| / |transfers|, "
                  "measured iterations)")
    ax.set_title("Overlap of server transfers with trainer compute (a system without transfers "
                 f"has no bar)\n{textwrap.fill(subtitle, 100)}", fontsize=10, loc="left")
    return fig


def plot_auc(curves: list[tuple[str, str, pd.DataFrame]], targets: dict[str, float],
             subtitle: str) -> Figure | None:
    """Held-out AUC against seconds of training (left) and iterations (right), a row per
    setting; the target AUC dashed, where each variant first reached it marked."""
    if not curves:
        return None
    settings = list(dict.fromkeys(s for s, _, _ in curves))
    fig = Figure(figsize=(13, 1.2 + 4.0 * len(settings)), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(settings), 2, squeeze=False)
    for (ax_t, ax_i), setting in zip(axes, settings, strict=True):
        # sync first, thick and translucent: curves equal to it lie on it, thin, on top,
        # Bagpipe's last.
        def order(ve: tuple[str, pd.DataFrame]) -> tuple[bool, bool]:
            system = ve[0].split()[0]
            return system != BASELINE, role(system) == "ours"

        mine = sorted(((v, e) for s, v, e in curves if s == setting), key=order)
        styles = variant_styles([v for v, _ in mine])
        target = targets.get(setting, math.nan)
        for v, e in mine:
            base = v.split()[0] == BASELINE
            kw = ({"lw": 5, "alpha": 0.45, "color": styles[v]["color"]} if base
                  else {**styles[v], "lw": 1.4, "marker": "o", "ms": 3})
            for ax, x in ((ax_t, "wall_s"), (ax_i, "iteration")):
                ax.plot(e[x], e["auc"], label=v, **kw)
            if not math.isnan(target) and (e["auc"] >= target).any():
                hit = e[e["auc"] >= target].iloc[0]
                ax_t.plot([hit["wall_s"]], [hit["auc"]], "*", ms=11, color=styles[v]["color"],
                          markeredgecolor="black", zorder=5)
        for ax, label in ((ax_t, "seconds of training (evaluations left out)"),
                          (ax_i, "iterations trained")):
            if not math.isnan(target):
                ax.axhline(target, color="black", lw=1, ls="--", label=f"target AUC {target:g}")
            ax.set_xlabel(label)
            ax.set_ylabel("held-out AUC")
            ax.grid(alpha=0.3)
        ax_t.set_title(f"{setting}: AUC against training time (★ first reached the target)",
                       fontsize=9, loc="left")
        ax_i.set_title(f"{setting}: AUC against iteration (sync thick: exact systems lie on it)",
                       fontsize=9, loc="left")
        ax_i.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Held-out AUC during training (--eval-every; first repeat of each "
                 f"variant)\n{subtitle}", fontsize=11, x=0.01, ha="left")
    return fig
