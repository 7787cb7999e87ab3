"""The verdict of `bagpipe advise`: which system is fastest on the user's cluster, by how
much, how far to trust it, and why, from a `simulate` result and its validation.

- fastest: the least predicted mean iteration at the configured trainers and network (the
  one statistic every figure here ranks by); its margin over the best other system and its
  speed-up over sync, the means' ratios;
- within the model's error: a margin below the validation's median |error| is said in words,
  with no headline multiplier;
- confidence: the share of the measured runs the model predicts within ±20% (high: at least
  80%, medium: at least half, low: less; unknown: no run validated);
- why: the winner's and sync's mean iteration split into compute, the waits for rows, for
  the sums and for the plans;
- where the answer changes: the fastest system at each trainer count of the sweep (at the
  configured network) and at each bandwidth (at the configured trainers), as ranges.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

HIGH, MEDIUM = 0.8, 0.5  # shares of validated runs within tolerance: high / medium confidence
SPLIT = (("compute_ms", "compute"), ("exposed_fetch_ms", "waiting for rows"),
         ("exposed_sync_ms", "waiting for sums"), ("exposed_plan_ms", "waiting for plans"))


@dataclass
class Verdict:
    """See the module docstring; `lines` is the verdict in words."""

    fastest: str
    speedup_over_sync: float
    runner_up: str | None
    margin: float  # the runner-up's mean iteration / the fastest's
    within_error: bool
    confidence: str
    validated: dict[str, Any]
    split: dict[str, dict[str, float]]
    by_trainers: list[dict[str, Any]]
    by_gbps: list[dict[str, Any]]
    changes: dict[str, str]
    lines: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def confidence(errors: list[float], tolerance: float) -> tuple[str, dict[str, Any]]:
    """(high/medium/low/unknown, the figures) from the validated runs' relative errors."""
    ok = [e for e in errors if not math.isnan(e)]
    if not ok:
        return "unknown", {"runs": 0}
    within = sum(abs(e) <= tolerance for e in ok) / len(ok)
    level = "high" if within >= HIGH else "medium" if within >= MEDIUM else "low"
    med = sorted(abs(e) for e in ok)[len(ok) // 2]
    return level, {"runs": len(ok), "within": within, "tolerance": tolerance,
                   "median_abs_error": med}


def ranges(points: list[tuple[float, str]], unit: str, every: str) -> str:
    """'a up to 2 trainers, b from 4' from (x, fastest) sorted by x; one system: 'a at every
    trainer count from 1 to 64'."""
    if not points:
        return ""
    runs: list[list[Any]] = []
    for x, s in points:
        if runs and runs[-1][0] == s:
            runs[-1][2] = x
        else:
            runs.append([s, x, x])
    if len(runs) == 1:
        return f"{runs[0][0]} at every {every} from {points[0][0]:g} to {points[-1][0]:g} {unit}"
    parts = []
    for i, (s, a, b) in enumerate(runs):
        if i == 0:
            parts.append(f"{s} at {b:g} {unit.rstrip('s') if unit == 'trainers' else unit}" if a == b == 1
                         else f"{s} up to {b:g} {unit}")
        elif i == len(runs) - 1:
            parts.append(f"{s} from {a:g}")
        else:
            parts.append(f"{s} from {a:g} to {b:g}")
    return ", ".join(parts)


def _fastest_by(sweep, kind: str, col: str) -> list[dict[str, Any]]:
    rows = sweep[sweep["sweep"] == kind]
    out = []
    for x, g in rows.groupby(col):
        best = g.loc[g["mean_ms"].idxmin()]
        out.append({col: float(x), "fastest": str(best["system"]),
                    "speedup_over_sync": float(best["speedup"])})
    return out


def verdict(preds: list[Any], sweep, errors: list[float], tolerance: float,
            trainers: int, net_gbps: float, measured: str = "") -> Verdict:
    """The verdict (module docstring) from the predictions at the user's cluster, the sweeps
    and the validated runs' relative errors (`measured`: what those runs were, in words)."""
    ranked = sorted((p for p in preds if p.mean_ms > 0), key=lambda p: p.mean_ms)
    best = ranked[0]
    other = ranked[1] if len(ranked) > 1 else None
    by_name = {p.system: p for p in preds}
    sync = by_name.get("sync")
    level, validated = confidence(errors, tolerance)
    validated["measured"] = measured
    margin = other.mean_ms / best.mean_ms if other else math.inf
    err = validated.get("median_abs_error", 0.0)
    within = other is not None and margin - 1 < err
    split = {p.system: {k: float(getattr(p, k)) for k, _ in SPLIT} | {"mean_ms": float(p.mean_ms)}
             for p in ([best] + ([sync] if sync is not None and sync is not best else []))}
    by_n = _fastest_by(sweep, "trainers", "trainers")
    by_g = _fastest_by(sweep, "net_gbps", "net_gbps")
    changes = {"trainers": ranges([(d["trainers"], d["fastest"]) for d in by_n], "trainers",
                                  "trainer count"),
               "net_gbps": ranges([(d["net_gbps"], d["fastest"]) for d in by_g], "Gbit/s", "bandwidth")}
    v = Verdict(best.system, float(best.speedup), other.system if other else None, float(margin),
                within, level, validated, split, by_n, by_g, changes)
    v.lines = _lines(v, trainers, net_gbps)
    return v


def _lines(v: Verdict, trainers: int, net_gbps: float) -> list[str]:
    where = f"{trainers} trainer{'s' if trainers != 1 else ''} at {net_gbps:g} Gbit/s"
    if v.runner_up is None:
        head = f"On {where}: {v.fastest} is the only system predicted."
    elif v.within_error:
        head = (f"On {where}: {v.fastest} and {v.runner_up} are within the model's error of each "
                f"other ({v.margin:.2f}x apart; the model's median error on your runs is "
                f"{100 * v.validated['median_abs_error']:.0f}%): either is the answer.")
    else:
        sync = "" if math.isnan(v.speedup_over_sync) else f" and {v.speedup_over_sync:.2f}x sync"
        head = f"On {where}: {v.fastest} is fastest, {v.margin:.2f}x the best other ({v.runner_up}){sync}."
    lines = [head]
    if v.validated.get("runs"):
        what = f": {v.validated['measured']}" if v.validated.get("measured") else ""
        lines.append(f"Confidence: {v.confidence} ({100 * v.validated['within']:.0f}% of "
                     f"{v.validated['runs']} measured runs predicted within "
                     f"±{100 * v.validated['tolerance']:.0f}%{what}).")
    else:
        lines.append("Confidence: unknown (no measured run could be compared with the model).")
    for system, s in v.split.items():
        parts = ", ".join(f"{name} {s[k]:.2f}" for k, name in SPLIT if s[k] >= 0.005)
        lines.append(f"Why: {system}'s iteration is {s['mean_ms']:.2f} ms: {parts} ms.")
    for key, text in v.changes.items():
        if text:
            lines.append(f"Across {'trainer counts' if key == 'trainers' else 'networks'}: {text}.")
    return lines
