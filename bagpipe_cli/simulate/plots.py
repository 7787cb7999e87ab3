"""Plots of `bagpipe simulate` (matplotlib's object API with the Agg canvas; no global state)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from bagpipe_cli.engine.registry import REFERENCE, color, role

if TYPE_CHECKING:
    from bagpipe_cli.simulate import SimulateResult

DPI = 120


def _num(x: float, _pos: object = None) -> str:
    return f"{x:g}"


def _speedup_axes(ax: Any, with_sync: bool) -> None:
    """The speed-up panel's frame (and why it is empty when sync was not simulated)."""
    ax.axhline(1.0, color="#bbbbbb", lw=1)
    ax.set_ylabel("predicted speed-up over sync (x)")
    ax.set_ylim(bottom=0)
    ax.set_title("speed-up over sync")
    if not with_sync:
        ax.text(0.5, 0.5, "sync is not among --systems:\nno speed-up over it to show",
                transform=ax.transAxes, ha="center", va="center", fontsize=10, color="#555555")


def _plot(result: SimulateResult, path: Path, sweep: str, xcol: str, xlabel: str, log2: bool) -> None:
    df = result.sweep[result.sweep["sweep"] == sweep]
    cfg = result.config
    fig = Figure(figsize=(16, 5), dpi=DPI)
    ax_s, ax_t, ax_o = fig.subplots(1, 3)
    for system in cfg.systems:
        d = df[df["system"] == system].sort_values(xcol)
        if d.empty:
            continue
        style = {"color": color(system), "marker": "o", "ms": 4,
                 "lw": 2.5 if role(system) == "ours" else 1.5,
                 "ls": "--" if role(system) in ("reference", "bound") else "-"}
        ax_s.plot(d[xcol], d["speedup"], label=system, **style)
        ax_t.plot(d[xcol], d["mean_ms"], label=system, **style)
        # rank 0's own time per iteration (the slower of its planning and its link, two
        # stages), in the system's colour, under its iteration time
        rank0 = d[["planner_ms_per_iter", "planner_send_ms_per_iter"]].max(axis=1)
        ax_t.plot(d[xcol], rank0, color=color(system), ls=":", lw=1.2, marker="x", ms=4)
        ax_o.plot(d[xcol], 100 * rank0 / d["mean_ms"], label=system, **style)
    ax_t.plot([], [], color="#555555", ls=":", marker="x", ms=4, lw=1.2,
              label="rank 0: planning or\nsending plans")
    for ax in (ax_s, ax_t, ax_o):
        ax.set_xscale("log", base=2 if log2 else 10)
        ax.xaxis.set_major_formatter(FuncFormatter(_num))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticks(sorted(df[xcol].unique()))
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    _speedup_axes(ax_s, REFERENCE in cfg.systems)
    ax_t.set_yscale("log")
    lo, hi = ax_t.get_ylim()
    if hi / lo > 10:  # over decades: 1, 2, 5 of each, labelled; else every minor tick labelled
        ax_t.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax_t.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax_t.yaxis.set_minor_formatter(FuncFormatter(_num))
    ax_t.yaxis.set_major_formatter(FuncFormatter(_num))
    ax_t.set_ylabel("predicted time per iteration (ms, log scale)")
    ax_t.set_title("iteration time (dotted: rank 0's time)")
    ax_t.legend(loc="best", fontsize=8)
    ax_o.axhline(100.0, color="#bbbbbb", lw=1)
    ax_o.set_ylim(0, 105)
    ax_o.set_ylabel("rank 0's time / iteration time (%)")
    ax_o.set_title("rank 0's share (100%: it sets the pace)")
    cl = cfg.cluster
    net = ("no network delay" if cl.net_gbps is None and not cl.net_latency_us
           else f"{'unlimited' if cl.net_gbps is None else format(cl.net_gbps, 'g')} Gbit/s, "
                f"{cl.net_latency_us:g} us")
    if cl.trainer_gbps is not None:
        net += f"; trainers' links {cl.trainer_gbps:g} Gbit/s"
    fixed = net if sweep == "trainers" else f"{cl.trainers} trainer" + ("s" if cl.trainers != 1 else "")
    servers = f"{cl.servers} server" + ("s" if cl.servers != 1 else "")
    batch = (f"batch {cfg.batch_size:,}" if sweep != "trainers" or cfg.sweep_scaling == "strong"
             else f"batch {cfg.batch_size // cfg.trainers:,} x N")
    fig.suptitle(f"{cfg.name} ({cfg.runtime}): {batch}, L={cfg.lookahead}, "
                 f"{servers}, {fixed}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)


def plot_speedup_vs_trainers(result: SimulateResult, path: Path) -> None:
    """Speed-up over sync, iteration time and rank 0's share vs trainers (the global batch
    fixed, or the samples per trainer: `sweep_scaling`)."""
    cfg = result.config
    kept = ("global batch fixed" if cfg.sweep_scaling == "strong"
            else f"{cfg.batch_size // cfg.trainers:,} samples a trainer")
    _plot(result, path, "trainers", "trainers", f"trainers ({kept})", True)


def plot_speedup_vs_bandwidth(result: SimulateResult, path: Path) -> None:
    """Speed-up over sync, iteration time and rank 0's share vs link bandwidth."""
    label = ("embedding servers' and rank 0's link bandwidth (Gbit/s)"
             if result.config.cluster.trainer_gbps is not None else "link bandwidth (Gbit/s)")
    _plot(result, path, "net_gbps", "net_gbps", label, False)
