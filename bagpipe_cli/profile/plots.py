"""PNG plots of a profile (matplotlib's object API with the Agg canvas; no global state)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, PercentFormatter

from bagpipe_cli.policies.table import policies, policy, with_role

if TYPE_CHECKING:
    from bagpipe_cli.profile import ProfileResult

DPI = 120


def _si(x: float, _pos: object = None) -> str:
    for div, suffix in [(1e9, "G"), (1e6, "M"), (1e3, "k")]:
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _subtitle(result: ProfileResult) -> str:
    d, t = result.dataset, result.trace
    return (f"{d['name'] or Path(d['path']).name}: {d['rows']:,} samples, {len(d['tables'])} tables, "
            f"{d['embedding_rows']:,} rows; batch {t.batch_size:,} ({t.batches:,} batches)")


def cdf_axes(ax, xmin: float) -> None:
    """Axes of an access CDF: fraction of rows (log x, from `xmin`) vs fraction of accesses."""
    ax.set_xscale("log")
    ax.set_xlim(max(xmin, 1e-9), 1.0)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _: np.format_float_positional(x * 100, precision=8, trim="-") + "%"))
    ax.set_xlabel("most-accessed embedding rows, as a fraction of all rows (log scale)")
    ax.set_ylabel("fraction of all accesses")


def plot_access_cdf(result: ProfileResult, path: Path) -> None:
    """Fraction of accesses taken by the most-accessed fraction of rows (log x)."""
    s = result.skew
    fig = Figure(figsize=(8, 5.5), dpi=DPI)
    ax = fig.add_subplot()
    for i, t in enumerate(s.tables):
        if t.cdf_rows is not None and len(t.cdf_rows):
            ax.plot(t.cdf_rows, t.cdf_accesses, color="#9ecae1", lw=0.8,
                    label="one table (fraction of its rows)" if i == 0 else None)
    if s.cdf_rows is not None and len(s.cdf_rows):
        ax.plot(s.cdf_rows, s.cdf_accesses, color="#08519c", lw=2.5, label="all tables")
    lines = []
    for key, share in s.top_share.items():
        if share is None:
            lines.append(f"top {key} of rows: n/a (fewer than {_one_in(key)} rows)")
            continue
        x = s.top_rows[key] / max(s.embedding_rows, 1)
        ax.plot([x], [share], "o", color="#d62728", ms=6, zorder=5,
                label=None if lines else "top 0.1% / 1% / 10% of rows")
        lines.append(f"top {key} of rows ({s.top_rows[key]:,}): {share:.1%} of accesses")
    ax.text(0.98, 0.04, "\n".join(lines), transform=ax.transAxes, ha="right", va="bottom",
            fontsize=9, color="#d62728", bbox={"facecolor": "white", "edgecolor": "#dddddd"})
    cdf_axes(ax, 1.0 / max(s.embedding_rows, 1))
    ax.set_title(f"Access CDF\n{_subtitle(result)}", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def plot_table_top_share(result: ProfileResult, path: Path) -> None:
    """Per table: share of its accesses taken by its top 0.1% / 1% / 10% of rows."""
    tables = result.skew.tables
    keys = list(result.skew.top_share)
    n = len(tables)
    fig = Figure(figsize=(max(9.0, 0.45 * n + 2.5), 5.5), dpi=DPI)
    ax = fig.add_subplot()
    x = np.arange(n)
    w = 0.8 / max(len(keys), 1)
    shades = ["#c6dbef", "#4292c6", "#08306b"]
    na = []
    for j, k in enumerate(keys):
        at = x + (j - (len(keys) - 1) / 2) * w
        shares = [t.top_share[k] for t in tables]
        ax.bar(at, [np.nan if v is None else v for v in shares], w,
               color=shades[j % len(shades)], label=f"top {k} of the table's rows")
        for xi, v in zip(at, shares, strict=True):
            if v is None:  # too few rows for this fraction: no bar, a mark
                ax.text(xi, 0.01, "n/a", rotation=90, ha="center", va="bottom", fontsize=6,
                        color="#666666")
        na += [k for v in shares if v is None][:1]
    if na:
        ax.text(0.99, 0.87, "n/a: a table of fewer than 1/p rows has no top p "
                f"({', '.join(f'{k}: fewer than {_one_in(k)} rows' for k in na)})",
                transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#666666")
    ax.set_xticks(x, [f"{t.name}\n{_si(t.cardinality)}" for t in tables], fontsize=8,
                  rotation=90 if n > 30 else 0)
    ax.set_ylim(0, 1.15)  # room for the legend above the bars
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("share of the table's accesses")
    ax.set_xlabel("table (cardinality below the name)")
    ax.set_title(f"Access share of each table's most-accessed rows\n{_subtitle(result)}", fontsize=11)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=9, loc="upper center", ncol=len(keys), frameon=False)
    fig.tight_layout()
    fig.savefig(path)


def _one_in(key: str) -> str:
    """'0.1%' -> '1,000': the rows a table needs for its top share to be defined."""
    return f"{round(100 / float(key.rstrip('%'))):,}"


def _log_if_wide(ax, values: list[float], axis: str = "x") -> None:
    v = [x for x in values if x > 0]
    if v and max(v) / min(v) > 20:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def plot_fetched_vs_lookahead(result: ProfileResult, path: Path) -> None:
    """Bagpipe's fetched rows and peak cache size against the lookahead L."""
    ours, best, ref = with_role("ours"), with_role("optimum"), with_role("reference")
    bag = sorted((p for p in result.policies if p.policy == ours.name), key=lambda p: p.lookahead)
    none = next((p for p in result.policies if p.policy == ref.name), None)
    comp = sorted(result.bagpipe_vs_belady, key=lambda c: c.lookahead)
    ls = [p.lookahead for p in bag]
    fig = Figure(figsize=(11, 4.8), dpi=DPI)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(ls, [p.fetched_rows for p in bag], "o-", color=ours.color, label=ours.label)
    if comp:
        ax1.plot([c.lookahead for c in comp], [c.belady_fetched_rows for c in comp], "s",
                 ls=best.line, color=best.color, label=f"{best.label}, capacity = {ours.label}'s peak")
    if none is not None:
        ax1.axhline(none.fetched_rows, color=ref.color, ls=ref.line, label=ref.label)
    ax1.set_xlabel("lookahead L (batches)")
    ax1.set_ylabel("rows fetched from the embedding servers")
    ax1.set_title("Rows fetched")
    ax1.set_ylim(bottom=0)
    ax2.plot(ls, [p.peak_resident_rows for p in bag], "o-", color=ours.color, label=ours.label)
    ax2.axhline(result.trace.max_batch_unique_rows, color=ref.color, ls=ref.line,
                label="largest batch's unique rows")
    ax2.set_xlabel("lookahead L (batches)")
    ax2.set_ylabel("peak rows resident in the trainer cache")
    ax2.set_title("Cache size Bagpipe needs")
    ax2.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        _log_if_wide(ax, ls)
        ax.xaxis.set_major_formatter(FuncFormatter(_si))
        ax.yaxis.set_major_formatter(FuncFormatter(_si))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle(f"Bagpipe vs lookahead\n{_subtitle(result)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)


def plot_fetched_vs_cache(result: ProfileResult, path: Path) -> None:
    """Fetched rows of every fixed-capacity policy against the cache size; Bagpipe as points."""
    fig = Figure(figsize=(8, 5.5), dpi=DPI)
    ax = fig.add_subplot()
    xs: list[float] = []
    for pol in (p for p in policies() if p.setting == "cache_rows"):
        pts = sorted((p.cache_rows, p.fetched_rows) for p in result.policies
                     if p.policy == pol.name and p.cache_rows is not None)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", color=pol.color, label=pol.label, ls=pol.line)
            xs += [x for x, _ in pts]
    named: set[str] = set()
    for p in result.policies:
        pol = policy(p.policy)
        if p.lookahead is not None:  # a lookahead policy: a point at its peak cache size
            ax.plot([p.peak_resident_rows], [p.fetched_rows], "*", ms=14, color=pol.color,
                    label=f"{pol.label} (at its peak cache size)" if pol.name not in named else None)
            if pol.setting == "lookahead":  # L is the policy's setting (else fixed: in its label)
                ax.annotate(f"L={p.lookahead}", (p.peak_resident_rows, p.fetched_rows),
                            textcoords="offset points", xytext=(8, 4), fontsize=9, color=pol.color)
            xs.append(p.peak_resident_rows)
            named.add(pol.name)
        elif pol.role == "reference":
            ax.axhline(p.fetched_rows, color=pol.color, ls=pol.line, label=pol.label)
    _log_if_wide(ax, xs)
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_formatter(FuncFormatter(_si))
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.set_xlabel("cache capacity (embedding rows)")
    ax.set_ylabel("rows fetched from the embedding servers")
    ax.set_title(f"Rows fetched vs cache size\n{_subtitle(result)}", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
