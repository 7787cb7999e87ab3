"""Report figures (matplotlib's object API with the Agg canvas; no global state).

Every function takes stored results (DataFrames from `bagpipe_cli.results` and
`bagpipe_cli.report.analysis`) and returns a `Figure`, or None when there is nothing to draw.
Colours are fixed per system (the registry's), so a system looks the same in every figure
and every report.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from bagpipe_cli.engine.registry import SYSTEMS, color, role
from bagpipe_cli.profile.plots import cdf_axes
from bagpipe_cli.report.analysis import BASELINE, TIME_COLUMNS

_FALLBACK = ["#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a"]
TIME_COLORS = {"data": "#8c564b", "prefetch_wait": "#d62728", "forward": "#1f77b4",
               "backward": "#aec7e8", "sync": "#ff7f0e", "optimizer": "#2ca02c", "other": "#d9d9d9"}
TIME_LABELS = {"data": "data", "prefetch_wait": "prefetch wait", "forward": "forward",
               "backward": "backward", "sync": "sync", "optimizer": "optimizer",
               "other": "other (untimed)"}
HATCHES = ["", "//", "..", "xx", "\\\\", "++"]
LINESTYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P"]
DPI = 120


def system_color(system: str) -> str:
    if system in SYSTEMS:
        return color(system)
    # Unknown systems get a colour from their name, so it is stable across reports.
    return _FALLBACK[sum(map(ord, system)) % len(_FALLBACK)]


_DASHES = ["-", (0, (4, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (8, 3))]


def variant_styles(variants: list[str]) -> dict[str, dict]:
    """Line style per variant ("bagpipe L=16"): the system's colour, and a dash pattern per
    variant of the same system (bagpipe always dashed, so it shows on top of sync)."""
    out, seen = {}, {}
    for v in variants:
        system = v.split()[0]
        k = seen.get(system, 0)
        seen[system] = k + 1
        dash = _DASHES[(k + (1 if role(system) == "ours" else 0)) % len(_DASHES)]
        out[v] = {"color": system_color(system), "ls": dash}
    return out


def _si(x: float, _pos: object = None) -> str:
    for div, suffix in [(1e9, "G"), (1e6, "M"), (1e3, "k")]:
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _title(ax, title: str, subtitle: str) -> None:
    """Bold title, and a smaller subtitle wrapped to the figure's width."""
    fig = ax.figure
    width = int(fig.get_figwidth() * 11)
    fig.suptitle(f"{title}\n{_wrap(subtitle, width)}" if subtitle else title, fontsize=11,
                 x=0.01, ha="left")


def _wrap(s: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(s, width)) if s else s


def plot_speedup(summary: pd.DataFrame, subtitle: str) -> Figure | None:
    """Grouped bars: speed-up over sync per setting and system, p10-p90 over repeats."""
    s = summary[(summary["system"] != BASELINE) & summary["speedup"].notna()]
    if s.empty:
        return None
    settings = list(dict.fromkeys(s["setting"]))
    variants = list(dict.fromkeys(s["variant"]))
    # Each setting's group holds the variants it has, side by side and centred (results of
    # two benches with other systems leave no empty slots).
    present = {st: [v for v in variants if ((s["variant"] == v) & (s["setting"] == st)).any()]
               for st in settings}
    n = max(len(p) for p in present.values())
    width = 0.8 / n
    fig = Figure(figsize=(max(8, 1.2 + len(settings) * (0.5 + 0.55 * n)), 5.8), dpi=DPI,
                 layout="constrained")
    ax = fig.add_subplot()
    per_system: dict[str, int] = {}
    hatch_of = {}
    for v in variants:
        sysname = s.loc[s["variant"] == v, "system"].iloc[0]
        hatch_of[v] = HATCHES[per_system.get(sysname, 0) % len(HATCHES)]
        per_system[sysname] = per_system.get(sysname, 0) + 1
    top = 1.0
    for v in variants:
        xs, ys, lo, hi = [], [], [], []
        for j, st in enumerate(settings):
            row = s[(s["variant"] == v) & (s["setting"] == st)]
            if row.empty:
                continue
            r = row.iloc[0]
            xs.append(j + width * (present[st].index(v) + 0.5 - len(present[st]) / 2))
            ys.append(r["speedup"])
            lo.append(max(r["speedup"] - r["speedup_p10"], 0) if not math.isnan(r["speedup_p10"]) else 0)
            hi.append(max(r["speedup_p90"] - r["speedup"], 0) if not math.isnan(r["speedup_p90"]) else 0)
        sysname = s.loc[s["variant"] == v, "system"].iloc[0]
        ax.bar(xs, ys, width * 0.92, color=system_color(sysname), hatch=hatch_of[v],
               edgecolor="white" if not hatch_of[v] else "black", linewidth=0.5, label=v,
               yerr=[lo, hi], capsize=3, error_kw={"elinewidth": 1, "ecolor": "black"})
        for x, y, h in zip(xs, ys, hi, strict=True):
            ax.text(x, y + h + 0.02 * max(ys + [1]), f"{y:.2f}×", ha="center", va="bottom",
                    fontsize=8 if n > 4 else 9)
            top = max(top, y + h)
    ax.axhline(1.0, color=system_color(BASELINE), lw=1.5, ls="--", label="sync = 1")
    ax.set_xticks(range(len(settings)), [_wrap(x, 28) for x in settings])
    ax.set_ylim(0, top * 1.15 + 0.05)
    ax.set_ylabel("speed-up over sync (× samples/s of sync)")
    ax.set_xlabel("setting")
    ax.legend(fontsize=9, ncols=min(4, len(variants) + 1), loc="upper left", frameon=True)
    _title(ax, "Training throughput relative to sync (median over repeats; bars: p10–p90)",
           subtitle)
    return fig


def plot_breakdown(bd: pd.DataFrame, subtitle: str) -> Figure | None:
    """Horizontal stacked bars: mean ms per measured iteration of each component."""
    if bd.empty:
        return None
    labels = [f"{r.variant} | {r.setting}" for r in bd.itertuples()]
    fig = Figure(figsize=(10, 1.6 + 0.42 * len(bd)), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(bd))[::-1]
    left = np.zeros(len(bd))
    for c in (*TIME_COLUMNS, "other"):
        vals = bd[c].fillna(0).to_numpy()
        ax.barh(y, vals, left=left, color=TIME_COLORS[c], label=TIME_LABELS[c], height=0.7,
                edgecolor="white", linewidth=0.4)
        left += vals
    ax.plot(bd["median_iter_ms"], y, "k|", ms=14, mew=2, label="median iteration time")
    for yy, tot, med in zip(y, left, bd["median_iter_ms"].fillna(0), strict=True):
        ax.text(max(tot, med), yy, f"  {tot:.1f} ms", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=9)
    for tick, sysname in zip(ax.get_yticklabels(), bd["system"], strict=True):
        tick.set_color(system_color(sysname))
    ax.set_xlim(0, max(left.max(), bd["median_iter_ms"].max()) * 1.15)
    ax.set_xlabel("time per iteration (ms, mean over measured iterations)")
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, ncols=8, loc="outside lower center",
               frameon=False, columnspacing=1.0, handlelength=1.5)
    _title(ax, "Where an iteration's time goes (mean ms per measured iteration, pooled over repeats)",
           subtitle)
    return fig


def plot_sweep(runs: pd.DataFrame, column: str, baseline: pd.DataFrame, subtitle: str) -> Figure | None:
    """samples/s against a system setting (lookahead or cache size), sync as reference."""
    if runs.empty:
        return None
    x_col = "cache_rows_used" if column == "cache_rows" and "cache_rows_used" in runs else column
    fig = Figure(figsize=(9, 5.5), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    settings = list(dict.fromkeys(runs["setting"]))
    for (setting, system), g in runs.groupby(["setting", "system"], sort=False):
        k = settings.index(setting)
        agg = g.groupby(x_col)["samples_per_s"].agg(
            med="median", lo=lambda v: np.percentile(v, 10), hi=lambda v: np.percentile(v, 90))
        ax.errorbar(agg.index, agg["med"], yerr=[agg["med"] - agg["lo"], agg["hi"] - agg["med"]],
                    color=system_color(system), ls=LINESTYLES[k % 4], marker=MARKERS[k % 6],
                    capsize=3, lw=2, label=f"{system} · {setting}")
    for setting, g in baseline.groupby("setting", sort=False):
        if setting in settings:
            k = settings.index(setting)
            ax.axhline(g["samples_per_s"].median(), color=system_color(BASELINE), ls=LINESTYLES[k % 4],
                       lw=1.5, label=f"sync · {setting}")
    ax.set_xscale("log", base=2 if column != "cache_rows" else 10)
    # A tick at every measured value, and only there (log ticks may fall between them).
    ax.set_xticks(sorted(set(runs[x_col].dropna())), minor=False)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(_si))
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_ylim(bottom=0)
    what = {"lookahead": "lookahead L (batches, log scale)",
            "cache_rows": "trainer cache capacity (rows, log scale)"}[column]
    ax.set_xlabel(what)
    ax.set_ylabel("training throughput (samples/s, median over repeats)")
    ax.legend(fontsize=8, loc="best")
    name = {"lookahead": "lookahead", "cache_rows": "cache size"}[column]
    _title(ax, f"Throughput vs {name} (error bars: p10–p90 over repeats)", subtitle)
    return fig


def _panels(curves: list[tuple[str, str, pd.DataFrame]]) -> tuple[Figure, list]:
    """One row of axes per panel of `curves`: (figure, [(ax, panel, [(variant, metrics)])])."""
    names = list(dict.fromkeys(p for p, _, _ in curves))
    fig = Figure(figsize=(9, 1.0 + 4.2 * len(names)), dpi=DPI, layout="constrained")
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    return fig, [(ax, name, [(v, m) for p, v, m in curves if p == name])
                 for ax, name in zip(axes, names, strict=True)]


def plot_loss(curves: list[tuple[str, str, pd.DataFrame]], warmup: int, subtitle: str,
              title_note: str) -> Figure | None:
    """Training loss over iterations; sync thick, the others thin (bagpipe dashed on top)."""
    if not curves:
        return None
    fig, panels = _panels(curves)
    for ax, panel, mine in panels:
        # sync first (thick, underneath), bagpipe last (thin dashed, on top).
        mine.sort(key=lambda vm: (vm[0].split()[0] != BASELINE, role(vm[0].split()[0]) == "ours"))
        styles = variant_styles([v for v, _ in mine])
        for v, m in mine:
            system = v.split()[0]
            if system == BASELINE:
                kw = {"lw": 5, "alpha": 0.45, "zorder": 2, "color": styles[v]["color"]}
            else:
                ours = role(system) == "ours"
                kw = {**styles[v], "lw": 1.4 if ours else 1.0, "zorder": 4 if ours else 3}
            ax.plot(m["iteration"], m["loss"], label=v, **kw)
        if warmup:
            ax.axvspan(-0.5, warmup - 0.5, color="#eeeeee", zorder=0,
                       label="warm-up (excluded from speed figures)")
        ax.set_xlabel("iteration")
        ax.set_ylabel("training loss (BCE, mean over the global batch)")
        ax.legend(fontsize=8, loc="upper right")
        ax.set_title(panel, fontsize=10, loc="left")
    fig.suptitle(f"Training loss per iteration — {title_note}\n{_wrap(subtitle, 108)}", fontsize=11,
                 x=0.01, ha="left")
    return fig


def plot_rows_fetched(curves: list[tuple[str, str, pd.DataFrame]], subtitle: str) -> Figure | None:
    """Rows fetched from the embedding servers per measured iteration, per system."""
    if not curves:
        return None
    fig, panels = _panels(curves)
    for ax, panel, mine in panels:
        ref = None
        styles = variant_styles([v for v, _ in mine])
        for v, m in mine:
            system = v.split()[0]
            ax.plot(m["iteration"], m["rows_fetched"], label=v, **styles[v],
                    lw=3 if system == BASELINE else 1.4, alpha=0.6 if system == BASELINE else 1.0)
            ref = m
        if ref is not None and "unique_rows" in ref:
            ax.plot(ref["iteration"], ref["unique_rows"], color="black", lw=0.8, ls=":",
                    label="unique rows of the batch")
        ax.yaxis.set_major_formatter(FuncFormatter(_si))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("iteration (warm-up excluded)")
        ax.set_ylabel("rows fetched from the servers per iteration")
        ax.legend(fontsize=8, loc="best")
        ax.set_title(panel, fontsize=10, loc="left")
    fig.suptitle(f"Embedding rows fetched per iteration\n{_wrap(subtitle, 108)}", fontsize=11, x=0.01,
                 ha="left")
    return fig


def plot_access_cdf(profiles: list[tuple[str, pd.DataFrame, dict]]) -> Figure | None:
    """Fraction of accesses taken by the most-accessed fraction of rows, per dataset."""
    if not profiles:
        return None
    fig = Figure(figsize=(9, 5.5), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    palette = ["#08519c", "#a63603", "#006d2c", "#54278f"]
    notes = []
    lo = 1.0
    for i, (name, cdf, prof) in enumerate(profiles):
        col = palette[i % len(palette)]
        tables = cdf[cdf["table"] != "(all)"]
        for k, (_, t) in enumerate(tables.groupby("table", sort=False)):
            ax.plot(t["row_fraction"], t["access_fraction"], color=col, alpha=0.25, lw=0.7,
                    label=f"{name}: one table" if k == 0 else None)
        a = cdf[cdf["table"] == "(all)"]
        ax.plot(a["row_fraction"], a["access_fraction"], color=col, lw=2.5, label=f"{name}: all tables")
        if len(a):
            lo = min(lo, float(a["row_fraction"].min()))
        skew = (prof or {}).get("skew") or {}
        for key, share in (skew.get("top_share") or {}).items():
            if share is None:  # fewer rows than 1 / fraction: not defined
                continue
            x = skew["top_rows"][key] / max(skew.get("embedding_rows", 1), 1)
            ax.plot([x], [share], "o", color=col, ms=6, zorder=5)
            notes.append(f"{name}: top {key} of rows → {share:.1%} of accesses")
    if notes:
        ax.text(0.98, 0.04, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom",
                fontsize=9, bbox={"facecolor": "white", "edgecolor": "#dddddd"})
    cdf_axes(ax, lo)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Access skew of the datasets (CDF of accesses over rows, from bagpipe profile)",
                 fontsize=11, loc="left")
    return fig


def save(fig: Figure, out: Path, name: str, formats: tuple[str, ...]) -> list[Path]:
    paths = []
    for ext in formats:
        p = out / f"{name}.{ext}"
        fig.savefig(p, format=ext)
        paths.append(p)
    return paths


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
