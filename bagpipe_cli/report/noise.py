"""Whether a ratio between two systems is a result or the noise of their repeats.

A report's ratios (throughput speed-up, time-to-accuracy speed-up) divide one system's
median over repeats by sync's. Repeats of one system differ, too; a ratio is *within the
noise* when the two systems' ranges over repeats (min–max) overlap: some repeat of one is
as good as some repeat of the other, so the repeats do not say which is better. That is
the case exactly when the ratio's range over every pair of repeats, [min(a)/max(b),
max(a)/min(b)], holds 1. With one repeat (reached) on either side no spread is known, so
neither is the noise. (Overlapping ranges as the test: asv's `compare` refuses to call a
difference significant when the intervals overlap.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

NOISE_MARK = "†"
UNKNOWN_MARK = "‡"
NOISE_LEGEND = {
    NOISE_MARK: "within the noise: the two systems' ranges over repeats (min–max) overlap, so "
                "the repeats do not show which is better",
    UNKNOWN_MARK: "from one repeat (for time to target: one that reached it): no spread is "
                  "known, so neither is the noise (a bench's --repeat gives more)",
}


def ratio_range(num: Iterable[float], den: Iterable[float]) -> tuple[float, float]:
    """The range of num_i / den_j over every pair of repeats (NaNs left out): (min(num) /
    max(den), max(num) / min(den)); (nan, nan) when either side has fewer than two values."""
    a = _values(num)
    b = _values(den)
    if len(a) < 2 or len(b) < 2 or b.min() <= 0:
        return math.nan, math.nan
    return float(a.min() / b.max()), float(a.max() / b.min())


def noise_mark(ratio: float, low: float, high: float) -> str:
    """NOISE_MARK when [low, high] holds 1, UNKNOWN_MARK when no range is known, else ""
    (and "" for a ratio that is not there)."""
    if ratio is None or math.isnan(ratio):
        return ""
    if math.isnan(low) or math.isnan(high):
        return UNKNOWN_MARK
    return NOISE_MARK if low <= 1.0 <= high else ""


def legend(cells: Iterable[str]) -> str:
    """The legend of the marks that `cells` (a table's column) use; "" when none does."""
    used = [m for m in NOISE_LEGEND if any(m in str(c) for c in cells)]
    return " ".join(f"{m} {NOISE_LEGEND[m]}." for m in used)


def _values(x: Iterable[float]) -> np.ndarray:
    v = np.asarray(list(x), dtype=float)
    return v[~np.isnan(v)]
