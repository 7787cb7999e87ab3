"""Accuracy over time, from stored runs only: the AUC curves of metrics_eval.csv, time to a
target AUC and its speed-up over sync, and whether an exact system's curve is sync's.

Definitions (`summary.json`'s, per run; `engine/trainer/evaluation.py`):
- time to target: seconds of training (evaluations left out) until the first evaluation whose
  held-out AUC reaches the run's --target-auc; not interpolated between evaluations;
- per group (setting, variant): the median over the repeats that reached it, its range
  (min–max) and how many did;
- speed-up in time to accuracy = sync's median time to target in the same setting / the
  group's; `tta_speedup_low`-`tta_speedup_high` its range over every pair of repeats, which
  holds 1 when it is within the repeats' noise (`report.noise`); next to it the throughput
  speed-up (`analysis.summary_table`'s).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.registry import SYSTEMS
from bagpipe_cli.report.analysis import BASELINE, ordered_groups
from bagpipe_cli.report.noise import noise_mark, ratio_range

ACCURACY_COLUMNS = [
    "setting", "system", "variant", "fidelity", "runs", "eval_auc", "best_eval_auc", "target_auc",
    "reached", "time_to_target_s", "time_to_target_min_s", "time_to_target_max_s",
    "iterations_to_target", "tta_speedup", "tta_speedup_low", "tta_speedup_high", "speedup",
    "speedup_low", "speedup_high",
]
ACCURACY_TEXT = (
    "Held-out AUC from the evaluations during training (`metrics_eval.csv`), medians over "
    "repeats. Time to target: seconds of training (evaluations left out) to the first "
    "evaluation whose AUC reaches the target AUC: the median and range (min–max) over the "
    "repeats that reached it, and how many did. Time-to-accuracy speed-up = sync's median "
    "time to target / the system's, in the same setting, with its range over every pair of "
    "repeats; throughput speed-up as in the summary, with its range likewise. A system that "
    "trains faster but stalls below the target has no time to target: its extra throughput "
    "is lost to accuracy. Parameters: \"= sync\" trains sync's parameters bitwise, \"= sync up "
    "to rounding\" the same sums in another order, \"approximate\" another computation (it "
    "skips work or reads stale rows): only time to target compares it fairly, and its AUC "
    "curves say (approximate).")


def _median(x: pd.Series) -> float:
    v = pd.to_numeric(x, errors="coerce").dropna()
    return float(v.median()) if len(v) else math.nan


def _col(g: pd.DataFrame, col: str) -> pd.Series:
    return g[col] if col in g else pd.Series([math.nan] * len(g), index=g.index)


def accuracy_table(runs: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per group (as the summary table), for the runs that evaluated during training
    (see the module docstring); empty when none did."""
    if "evaluations" not in runs or not (pd.to_numeric(runs["evaluations"], errors="coerce")
                                         .fillna(0) > 0).any():
        return pd.DataFrame(columns=ACCURACY_COLUMNS)
    speed = {(r.setting, r.variant): (r.speedup, r.speedup_low, r.speedup_high)
             for r in summary.itertuples()}
    rows, base = [], {}
    for _, g in ordered_groups(runs):
        r0 = g.iloc[0]
        ttt = pd.to_numeric(_col(g, "time_to_target_s"), errors="coerce")
        row = {"setting": r0["setting"], "system": r0["system"], "variant": r0["variant"],
               "fidelity": fidelity(r0), "runs": len(g), "eval_auc": _median(g["eval_auc"]),
               "best_eval_auc": _median(_col(g, "best_eval_auc")),
               "target_auc": _median(_col(g, "target_auc")),
               "reached": int(ttt.notna().sum()), "time_to_target_s": _median(ttt),
               "time_to_target_min_s": ttt.min() if ttt.notna().any() else math.nan,
               "time_to_target_max_s": ttt.max() if ttt.notna().any() else math.nan,
               "iterations_to_target": _median(_col(g, "iterations_to_target"))}
        row["speedup"], row["speedup_low"], row["speedup_high"] = speed.get(
            (r0["setting"], r0["variant"]), (math.nan,) * 3)
        if r0["system"] == BASELINE:
            base[r0["setting_key"]] = ttt
        rows.append((row, r0["setting_key"], r0["system"] == BASELINE, ttt))
    for row, key, is_base, ttt in rows:
        b = base.get(key, pd.Series(dtype=float))
        t = row["time_to_target_s"]
        row["tta_speedup"] = _median(b) / t if t and not math.isnan(t) else math.nan
        row["tta_speedup_low"], row["tta_speedup_high"] = (
            (math.nan, math.nan) if is_base else ratio_range(b, ttt))
    rows = [r for r, *_ in rows]
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS)


def auc_curves(runs: pd.DataFrame, evals: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(setting label, variant, its first repeat's metrics_eval.csv) for every variant of
    every setting whose runs evaluated during training, in the summary table's order."""
    if evals.empty:
        return []
    by_run = dict(tuple(evals.groupby("run_path", sort=False)))
    out = []
    for _, g in ordered_groups(runs):
        r = g.sort_values("repeat").iloc[0]
        e = by_run.get(r["run_path"])
        if e is not None and len(e):
            mark = " (approximate)" if fidelity(r) == "approximate" else ""
            out.append((r["setting"], r["variant"] + mark, e.sort_values("iteration")))
    return out


FIDELITY = {"exact": "= sync", "rounding": "= sync up to rounding", "approximate": "approximate"}


def fidelity(row: pd.Series) -> str:
    """What a run trains against sync (`SystemSpec.fidelity` at its settings): exact,
    rounding or approximate ("" for a system the registry does not know)."""
    s = SYSTEMS.get(row["system"])
    return s.fidelity(SimpleNamespace(**row.to_dict())) if s is not None else ""


def _exact(row: pd.Series) -> bool:
    return fidelity(row) == "exact"


def curve_notes(runs: pd.DataFrame, evals: pd.DataFrame) -> list[str]:
    """Per setting, how each exact variant's AUC curve compares with sync's (first repeats,
    the same evaluations): the same, or different, which an exact system must not be."""
    notes = []
    if evals.empty:
        return notes
    by_run = dict(tuple(evals.groupby("run_path", sort=False)))
    first = runs.sort_values("repeat", kind="stable").drop_duplicates("group")
    for _, g in first.groupby("setting_key", sort=False):
        base = g[g["system"] == BASELINE]
        if base.empty or base.iloc[0]["run_path"] not in by_run:
            continue
        ref = by_run[base.iloc[0]["run_path"]].set_index("iteration")["auc"]
        same, differ = [], []
        for _, r in g[g["system"] != BASELINE].iterrows():
            e = by_run.get(r["run_path"])
            if e is None or not _exact(r):
                continue
            mine = e.set_index("iteration")["auc"]
            common = ref.index.intersection(mine.index)
            if len(common) and np.array_equal(ref[common].to_numpy(), mine[common].to_numpy()):
                same.append(r["variant"])
            elif len(common):
                gap = float(np.nanmax(np.abs(ref[common].to_numpy() - mine[common].to_numpy())))
                differ.append(f"{r['variant']} (max |ΔAUC| {gap:.2g})")
        label = g.iloc[0]["setting"]
        if differ:
            notes.append(f"{label}: the AUC curve of {', '.join(differ)} differs from sync's, "
                         "though the registry says it trains sync's parameters: a bug to report.")
        if same:
            notes.append(f"{label}: the AUC curves of {', '.join(same)} equal sync's at every "
                         "evaluation (exact systems).")
    return notes


def display_accuracy(acc: pd.DataFrame) -> pd.DataFrame:
    """The accuracy table as strings, for the page: time to target with its range over the
    repeats that reached it, and each ratio to sync marked when it is within their noise
    (`noise.legend` of the column says what a mark means)."""
    def num(x: Any, fmt: str) -> str:
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

    def ratio(r: Any, x: float, low: float, high: float) -> str:
        if math.isnan(x):
            return "—"
        if r.system == BASELINE:
            return f"{x:.2f}×"
        spread = "" if math.isnan(low) else f" ({low:.2f}–{high:.2f})"
        return f"{x:.2f}×{spread} {noise_mark(x, low, high)}".rstrip()

    rows = []
    for r in acc.itertuples():
        ttt = num(r.time_to_target_s, ".2f")
        if r.reached > 1:
            ttt += f" ({r.time_to_target_min_s:.2f}–{r.time_to_target_max_s:.2f})"
        elif r.reached == 1:
            ttt += " (one repeat: no spread)"
        rows.append({
            "setting": r.setting, "system": r.variant,
            "parameters": FIDELITY.get(r.fidelity, "—"), "runs": str(r.runs),
            "final AUC": num(r.eval_auc, ".4f"), "best AUC": num(r.best_eval_auc, ".4f"),
            "target AUC": num(r.target_auc, ".4f"),
            "time to target (s): median (min–max)": "—" if math.isnan(r.target_auc) else ttt,
            "reached": "—" if math.isnan(r.target_auc) else f"{r.reached}/{r.runs}",
            "iterations to target": num(r.iterations_to_target, ".0f"),
            "time-to-accuracy speed-up (range)": ratio(r, r.tta_speedup, r.tta_speedup_low,
                                                       r.tta_speedup_high),
            "throughput speed-up (range)": ratio(r, r.speedup, r.speedup_low, r.speedup_high),
        })
    return pd.DataFrame(rows)
