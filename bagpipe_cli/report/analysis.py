"""The numbers a report shows, computed from stored runs only (pure pandas, no plotting).

Definitions:
- *setting*: everything a run was configured with except the system and the system's own
  settings (`lookahead`, `round`, `cache_rows`, `staleness`, `hot_sample`): dataset, model, batch size, network,
  trainers... Systems are compared within one setting.
- *variant*: a system with its own settings (e.g. `bagpipe L=16`); a setting a system does
  not read is not part of its variant (sync has one variant).
- *group*: the repeats of one (setting, variant).
- speed-up of a group = median samples/s of the group / median samples/s of `sync` in the
  same setting; its spread is the p10-p90 of (each repeat's samples/s / that sync median);
  `speedup_low`-`speedup_high`: its range over every pair of repeats of the two systems,
  which holds 1 when it is within their noise (`report.noise`).
- samples/s and iteration time of a group: `results.config_figures`, the one definition
  `bench`'s closing table shares: medians over repeats of each run's `samples_per_s` (the
  rank: its mean iteration, `iter_ms_mean`, ranks alike) and `median_iter_ms` (p10/p90: of samples/s over repeats; of iteration time, the median over
  repeats of each run's `p10_iter_ms`/`p90_iter_ms`).
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import pandas as pd

from bagpipe_cli.bench.plan import SHORT, SYSTEM_OWN_SETTINGS, ignored_settings, train_fields
from bagpipe_cli.engine.comm.traffic import KINDS
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.records.metrics import TIME_KEYS
from bagpipe_cli.engine.registry import REFERENCE
from bagpipe_cli.report.noise import ratio_range
from bagpipe_cli.results.figures import config_figures, percentile

BASELINE = REFERENCE
TIME_COLUMNS = TIME_KEYS
# Columns of a run row that are not part of its setting: the system and its own settings,
# and what is recorded of a run (the output section: warm-up, trace, evaluations).
_NOT_SETTING = {"system", "data", "dataset_path", "dataset_rows", "dataset_tables",
                "embedding_rows", *SYSTEM_OWN_SETTINGS,
                *(f.name for f in fields(TrainConfig) if f.metadata["section"] == "output")}
SUMMARY_COLUMNS = [
    "setting", "system", "variant", "runs", "iter_ms_mean", "iter_ms_median", "iter_ms_p10", "iter_ms_p90",
    "samples_per_s_median", "samples_per_s_p10", "samples_per_s_p90", "speedup",
    "speedup_p10", "speedup_p90", "speedup_low", "speedup_high", "final_loss", "eval_auc",
]


def setting_columns(runs: pd.DataFrame) -> list[str]:
    """The config columns that define a run's setting (present in `runs`)."""
    cols = ["dataset", "model", *[k for k in train_fields() if k not in _NOT_SETTING and k != "model"]]
    return [c for c in cols if c in runs.columns]


UNSET = "none"  # how _fmt shows a setting left to its default (None)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return UNSET
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _network_label(gbps: Any, lat: Any) -> str:
    if gbps is None or (isinstance(gbps, float) and math.isnan(gbps)):
        return "no network emulation"
    return f"net {_fmt(gbps)} Gbit/s, {_fmt(lat)} µs"


def annotate(runs: pd.DataFrame) -> pd.DataFrame:
    """Add `setting_key`, `setting` (label), `variant_key`, `variant` (label) and `group`."""
    runs = runs.copy()
    cols = setting_columns(runs)
    keyed = runs[cols].astype(object).where(runs[cols].notna(), None)
    varying = [c for c in cols if keyed[c].map(_fmt).nunique() > 1]
    runs["setting_key"] = keyed.apply(lambda r: "|".join(f"{c}={_fmt(r[c])}" for c in cols), axis=1)

    def setting_label(r: pd.Series) -> str:
        parts = []
        for c in varying:
            if c == "net_latency_us" and "net_gbps" in varying:
                continue
            if c in ("net_gbps", "net_latency_us"):
                parts.append(_network_label(r.get("net_gbps"), r.get("net_latency_us")))
            else:
                parts.append(f"{c}={_fmt(r[c])}")
        return ", ".join(parts) or "all runs"

    runs["setting"] = keyed.apply(setting_label, axis=1)
    # The own settings a system reads, and which of them vary among its runs.
    own_vary: dict[str, list[str]] = {}
    def reads(r: pd.Series) -> list[str]:
        cache = r.get("cache_rows")
        cache = None if cache is None or (isinstance(cache, float) and math.isnan(cache)) else cache
        return [c for c in SYSTEM_OWN_SETTINGS
                if c in r.index and c not in ignored_settings(r["system"], cache)]

    runs["variant_key"] = runs.apply(
        lambda r: "|".join([r["system"], *[f"{c}={_fmt(r[c])}" for c in reads(r)]]), axis=1)
    for system, g in runs.groupby("system", sort=False):
        read = {c for _, r in g.iterrows() for c in reads(r)}
        own_vary[system] = [c for c in SYSTEM_OWN_SETTINGS
                            if c in read and g[c].map(_fmt).nunique() > 1]

    def variant(r: pd.Series) -> str:
        parts = [r["system"]]
        for c in own_vary[r["system"]]:
            if c in reads(r):
                v = _fmt(r[c])
                short = SHORT.get(c, c.replace("_", "-"))
                parts.append(f"{short}={'auto' if v == UNSET else v}")
        return " ".join(parts)

    runs["variant"] = runs.apply(variant, axis=1)
    runs["group"] = runs["setting_key"] + "||" + runs["variant_key"]
    return runs


def ordered_groups(runs: pd.DataFrame):
    """Groups by setting (in order of appearance), then sync first, then the other variants."""
    settings = list(dict.fromkeys(runs["setting_key"]))
    variants = list(dict.fromkeys(runs["variant_key"]))
    groups = list(runs.groupby("group", sort=False))

    def key(item):
        g = item[1].iloc[0]
        return (settings.index(g["setting_key"]), g["system"] != BASELINE,
                variants.index(g["variant_key"]))

    return sorted(groups, key=key)


def speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: `speedup` = its samples/s / the median samples/s of sync in its setting."""
    runs = runs.copy()
    base = runs[runs["system"] == BASELINE].groupby("setting_key")["samples_per_s"].median()
    runs["sync_samples_per_s"] = runs["setting_key"].map(base)
    runs["speedup"] = runs["samples_per_s"] / runs["sync_samples_per_s"]
    return runs


def summary_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per group (setting, variant), in the order the runs were made (see module doc)."""
    runs = speedups(runs)
    sync_sps = runs[runs["system"] == BASELINE].groupby("setting_key")["samples_per_s"]
    rows = []
    for _, g in ordered_groups(runs):
        r0 = g.iloc[0]
        fig = config_figures(g)
        sps = g["samples_per_s"].to_numpy(dtype=float)
        sp = g["speedup"].to_numpy(dtype=float)
        base = r0["sync_samples_per_s"]
        low, high = (ratio_range(sps, sync_sps.get_group(r0["setting_key"]))
                     if r0["system"] != BASELINE and r0["setting_key"] in sync_sps.groups
                     else (math.nan, math.nan))
        rows.append({
            "setting": r0["setting"], "system": r0["system"], "variant": r0["variant"],
            "runs": len(g), **fig,
            "speedup": (fig["samples_per_s_median"] / base if base and not math.isnan(base)
                        else math.nan),
            "speedup_p10": percentile(sp, 10), "speedup_p90": percentile(sp, 90),
            "speedup_low": low, "speedup_high": high,
            "final_loss": percentile(g["final_loss"].to_numpy(dtype=float), 50),
            "eval_auc": percentile(g["eval_auc"].to_numpy(dtype=float), 50) if "eval_auc" in g else math.nan,
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def time_breakdown(runs: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """Mean ms per measured iteration of each time component, per group, plus `other`
    (iteration time not in any component) and the median iteration time.

    Means, not medians: Bagpipe's data and prefetch wait fall on a round's first iteration
    only, and a median would hide them; the means add up to the mean iteration time. The
    median iteration is the group's `results.config_figures` (the summary table's and the
    bench's: the median over repeats of each run's median), not the pooled iterations'.
    """
    m = metrics[metrics["measured"]].merge(runs[["run_path", "group"]], on="run_path")
    rows = []
    for grp, g in ordered_groups(runs):
        mm = m[m["group"] == grp]
        row = {"setting": g.iloc[0]["setting"], "system": g.iloc[0]["system"],
               "variant": g.iloc[0]["variant"]}
        for c in TIME_COLUMNS:
            row[c] = 1e3 * float(mm[c].mean()) if c in mm and len(mm) else math.nan
        total = 1e3 * float(mm["time"].mean()) if len(mm) else math.nan
        row["other"] = max(total - sum(row[c] for c in TIME_COLUMNS if not math.isnan(row[c])), 0.0)
        row["mean_iter_ms"] = total
        row["median_iter_ms"] = config_figures(g)["iter_ms_median"]
        rows.append(row)
    return pd.DataFrame(rows)


def swept(runs: pd.DataFrame, column: str) -> pd.DataFrame:
    """Runs of systems that read `column` (an own setting) whose values of it vary within a
    setting; empty when the results do not sweep it."""
    keep = []
    for (_setting, system), g in runs.groupby(["setting_key", "system"], sort=False):
        if column in ignored_settings(system) or column not in g:
            continue
        if g[column].map(_fmt).nunique() > 1:
            keep.append(g)
    return pd.concat(keep) if keep else runs.iloc[0:0]


def context(runs: pd.DataFrame) -> str:
    """What every run shares, for figure subtitles: dataset, model, batch, iterations, machine."""
    def one(col: str, fmt=str) -> str | None:
        if col not in runs:
            return None
        vals = runs[col].dropna().unique()
        return fmt(vals[0]) if len(vals) == 1 else None

    parts = [one("dataset"), one("model"), one("batch_size", lambda v: f"batch {int(v):,}")]
    mi = one("measured_iterations", lambda v: f"{int(v)} measured iterations")
    wu = one("warmup", lambda v: f"{int(v)} warm-up excluded")
    if mi:
        parts.append(f"{mi}" + (f" ({wu})" if wu else ""))
    reps = runs.groupby("group")["repeat"].nunique().max() if "group" in runs else None
    if reps:
        parts.append(f"{reps} repeat{'s' if reps > 1 else ''}")
    cpu = one("env_cpu")
    thr = one("env_torch_threads", lambda v: f"{int(v)} thread" + ("s" if int(v) != 1 else ""))
    if cpu:
        parts.append(f"{cpu}" + (f", {thr}" if thr else ""))
    gpu = one("trainer_gpu")
    if gpu:
        parts.append(f"trainers on {gpu}")
    return " · ".join(p for p in parts if p)


_ROLE_GROUPS = (("planner", "rank 0 (planner)"), ("trainer", "trainer (busiest)"),
                ("server", "server (busiest)"))
TRAFFIC_TEXT = (
    "Megabytes per iteration each role sent (by kind) and received, from the runs' own "
    "counts (`summary.json`'s `roles.*.traffic`), for the distributed runs. For the trainers "
    "and the servers, the busiest rank of the role (the most bytes sent); medians over "
    "repeats. Kinds: plan (rank 0's plans; trainers pass them down the relay tree), rows "
    "(fetches and write-backs, with their requests), gradients (pushes to the servers), "
    "collective (the trainers' sums), control (start-up, checkpoints, evaluations).")


def traffic_table(runs: pd.DataFrame, traffic: pd.DataFrame) -> pd.DataFrame:
    """Per setting, system and role group: MB per iteration the busiest rank sent, by kind,
    and received (medians over repeats); empty without distributed runs."""
    if traffic.empty:
        return pd.DataFrame()
    t = traffic.merge(runs[["run_path", "setting", "variant", "group"]], on="run_path")
    t["role_group"] = None
    for prefix, label in _ROLE_GROUPS:
        t.loc[t["role"].str.startswith(prefix), "role_group"] = label
    t = t.dropna(subset=["role_group"])
    per_rank = t.pivot_table(index=["run_path", "group", "setting", "variant", "role_group", "role"],
                             columns=["direction", "kind"], values="bytes_per_iteration",
                             aggfunc="sum", fill_value=0.0) / 1e6
    sent = per_rank["sent"] if "sent" in per_rank.columns.get_level_values(0) else pd.DataFrame()
    received = per_rank["received"] if "received" in per_rank.columns.get_level_values(0) else None
    kinds = [k for k in KINDS if k in sent.columns and sent[k].any()]
    flat = pd.DataFrame({"sent_mb": sent.sum(axis=1), **{f"{k}_mb": sent[k] for k in kinds},
                         "received_mb": received.sum(axis=1) if received is not None else 0.0})
    flat = flat.reset_index()
    busiest = flat.loc[flat.groupby(["run_path", "role_group"])["sent_mb"].idxmax()]
    order = {label: i for i, (_, label) in enumerate(_ROLE_GROUPS)}
    out = (busiest.drop(columns=["run_path", "role"])
           .groupby(["group", "setting", "variant", "role_group"], sort=False).median()
           .reset_index())
    groups = {g: i for i, g in enumerate(runs["group"].drop_duplicates())}  # the runs' order
    out["_g"], out["_o"] = out["group"].map(groups), out["role_group"].map(order)
    out = out.sort_values(["_g", "_o"], kind="stable").drop(columns=["group", "_g", "_o"])
    return out.rename(columns={"variant": "system", "role_group": "role"}).reset_index(drop=True)
