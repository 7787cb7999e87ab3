"""The report's sections over time: the timeline of every role (runs with a trace) and the
accuracy during training (runs with metrics_eval.csv). Each `draw_*` adds its figures, notes
and tables to the report, or says why it has none.

Which run a timeline shows: per setting, the first repeat of one variant of each system (the
variant with the median throughput among the system's traced variants, so a sweep shows its
typical member; the overlap figure has every variant). Its window is a few steady-state
iterations: twice the longest round of the shown runs (at least 4, at most 8; fewer where
evaluations leave no such stretch), from the first iteration at or after --warmup where a
round starts in every shown run and no checkpoint or evaluation comes in the window (else
each run's own first such round), so every run shows the same iterations; one time axis per
setting.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.errors import DataError
from bagpipe_cli.report.accuracy import accuracy_table, auc_curves, curve_notes
from bagpipe_cli.report.analysis import ordered_groups
from bagpipe_cli.report.time_plots import TimelinePanel, plot_auc, plot_overlap, plot_timeline
from bagpipe_cli.report.timeline import (
    common_start,
    load_timeline,
    measured_overlap,
    round_starts,
    window,
)

MAX_SETTINGS = 3  # columns of the timeline figure
Figures = list[tuple[str, Any, str, str]]

TIMELINE_CAPTION = (
    "Each run's trace over a few steady-state iterations (iteration starts dotted and numbered): "
    "a row per role and thread (the planner, every server, every trainer process), one "
    "time axis per setting, so a longer panel is a slower run. Where sync's trainer waits for "
    "rows (red) its server serves the fetch (dark blue) and nothing else happens; Bagpipe's "
    "server serves the next round's prefetch while the trainer runs forward and backward "
    "(blues), and a round starts with a short wait when the prefetch was not hidden entirely. "
    "The title gives the share of transfer time hidden behind compute over the run's measured "
    "iterations (the overlap figure).")
OVERLAP_CAPTION = (
    "Overlap = |T ∩ C| / |T| over a run's measured iterations (from the first round at or after "
    "the warm-up to the end), where T is the union of the time some server spends serving a "
    "trainer's request (fetch, write-back, push; the emulated link included) and C the union of "
    "the time some trainer computes (forward, backward, optimizer); the median over traced "
    "repeats, and the transfer time it is a share of.")
AUC_CAPTION = (
    "Held-out AUC at every --eval-every evaluation, against seconds of training (evaluations "
    "left out) and against iterations. Exact systems train sync's parameters, so against "
    "iterations their curves lie on sync's (checked below); against time the faster system is "
    "left. A bounded-staleness system (het with s > 0) may run faster but reach a lower AUC at "
    "the same iteration: where its curve crosses the target later than Bagpipe's, its extra "
    "throughput is lost to accuracy.")


def _chosen(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting and system, the first repeat of the traced variant with median throughput."""
    traced = runs[runs["trace_path"].notna()] if "trace_path" in runs else runs.iloc[0:0]
    keep = []
    for _, g in traced.groupby(["setting_key", "system"], sort=False):
        per = g.groupby("variant_key", sort=False)["samples_per_s"].median().sort_values()
        variant = per.index[len(per) // 2]
        keep.append(g[g["variant_key"] == variant].sort_values("repeat").iloc[0])
    return pd.DataFrame(keep)


def _round_length(tl) -> int:
    starts = round_starts(tl)
    return int(np.median(np.diff(starts))) if len(starts) > 2 else 1


def draw_timeline(runs: pd.DataFrame, sub: str, figures: Figures, notes: list[str]
                  ) -> pd.DataFrame:
    """The timeline and overlap figures; returns the overlap of every traced run (one row per
    group: setting, system, variant, overlap, transfer_s, hidden_s)."""
    traced = runs[runs["trace_path"].notna()] if "trace_path" in runs else runs.iloc[0:0]
    if traced.empty:
        notes.append("Timeline: skipped, no run has a trace (`train --trace PATH`, or "
                      "`trace: true` in a bench file).")
        return pd.DataFrame()
    loaded, rows = {}, []
    for _, r in traced.iterrows():
        try:
            tl = load_timeline(r["trace_path"])
        except DataError as e:
            notes.append(f"Timeline: left out {r['run_id']}: {e}")
            continue
        loaded[r["run_path"]] = tl
        o = measured_overlap(tl, int(r["warmup"]))
        rows.append({"group": r["group"], "overlap": o.share, "transfer_s": o.transfer_s,
                     "hidden_s": o.hidden_s})
    table = _overlap_table(runs, pd.DataFrame(rows))
    panels = _panels(_chosen(runs[runs["run_path"].isin(loaded)]), loaded, notes)
    for name, fig, heading, caption in (
            ("timeline", plot_timeline(panels, sub), "Timeline of every role",
             TIMELINE_CAPTION),
            ("overlap", plot_overlap(table, sub), "Transfers hidden behind compute",
             OVERLAP_CAPTION)):
        if fig is not None:
            figures.append((name, fig, heading, caption))
    return table


def _overlap_table(runs: pd.DataFrame, per_run: pd.DataFrame) -> pd.DataFrame:
    out = []
    for grp, g in ordered_groups(runs):
        mine = per_run[per_run["group"] == grp] if len(per_run) else per_run
        if not len(mine):
            continue
        r0 = g.iloc[0]
        out.append({"setting": r0["setting"], "system": r0["system"], "variant": r0["variant"],
                    "overlap": float(mine["overlap"].median()),
                    "transfer_s": float(mine["transfer_s"].median()),
                    "hidden_s": float(mine["hidden_s"].median())})
    return pd.DataFrame(out, columns=["setting", "system", "variant", "overlap", "transfer_s",
                                      "hidden_s"])


def _panels(chosen: pd.DataFrame, loaded: dict, notes: list[str]) -> list[TimelinePanel]:
    if chosen.empty:
        return []
    settings = list(dict.fromkeys(chosen["setting"]))
    if len(settings) > MAX_SETTINGS:
        notes.append(f"Timeline: the first {MAX_SETTINGS} of {len(settings)} settings are drawn.")
        chosen = chosen[chosen["setting"].isin(settings[:MAX_SETTINGS])]
    count = min(8, max(4, 2 * max(_round_length(loaded[p]) for p in chosen["run_path"])))
    warmup = int(chosen["warmup"].max())
    common = None
    for n in range(count, 1, -1):  # shorter, if evaluations leave no longer quiet window
        common = common_start([loaded[p] for p in chosen["run_path"]], warmup, n)
        if common is not None:
            count = n
            break
    panels = []
    for _, r in chosen.iterrows():
        tl = loaded[r["run_path"]]
        t0, t1, its = window(tl, warmup if common is None else common, count)
        if its:
            panels.append(TimelinePanel(r["variant"], r["setting"], tl, t0, t1, its,
                                        measured_overlap(tl, int(r["warmup"]))))
    return panels


def draw_accuracy(runs: pd.DataFrame, evals: pd.DataFrame, summary: pd.DataFrame, sub: str,
                  figures: Figures, notes: list[str]) -> pd.DataFrame:
    """The AUC-over-time figure and the accuracy table (returned; empty without evaluations)."""
    acc = accuracy_table(runs, summary)
    curves = auc_curves(runs, evals)
    if not curves:
        notes.append("Accuracy over time: skipped, no run evaluated during training "
                     "(`--eval-every N`, or `eval_every` in a bench's base).")
        return acc
    targets = {}
    for r in acc.itertuples():
        if not math.isnan(r.target_auc):
            targets.setdefault(r.setting, r.target_auc)
    fig = plot_auc(curves, targets, sub)
    if fig is not None:
        figures.append(("auc", fig, "Accuracy over time", AUC_CAPTION))
    notes.extend(curve_notes(runs, evals))
    return acc
