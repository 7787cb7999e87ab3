"""A configuration's speed figures: the one definition `bench`'s closing table and `report` share.

A configuration is the repeats of one run (a bench's run id without its `-r<N>`; a report's
group: one setting and one variant). Its figures come from each repeat's own summary.json
figures (or a bench's index rows, which copy them):

- samples/s: the median over repeats of each run's `samples_per_s` (its batch over its mean
  iteration); p10 and p90: their 10th and 90th percentiles over the repeats. The one
  statistic `bench`'s table and the verdict rank configurations by;
- mean iteration ms (`iter_ms_mean`): that median as a time, 1 / the median over repeats of
  1 / each run's `mean_iter_ms` (so batch / samples/s exactly: it ranks as samples/s does);
- iteration ms: the median over repeats of each run's `median_iter_ms` (the median
  iteration: the iterations' spread, not a rank: a system whose cost falls on few
  iterations, such as a round's first, has a low median and a high mean); p10 and p90: the median over repeats of each run's `p10_iter_ms` and
  `p90_iter_ms` (the spread of one run's iterations, as a typical repeat saw it).

Not the median of every iteration of every repeat pooled: that weighs a repeat by its
iterations, and it is not what the bench's table shows for the same runs. Values that are
not numbers (a run that recorded none) are left out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

# Forward + backward of one model on one batch, measured by two systems further apart than
# this ratio: more than run-to-run noise (a loaded machine, oversubscribed threads). `report`
# flags such a setting; `simulate --calibrate` warns and uses the median.
COMPUTE_SPREAD = 1.5

# What the tables that rank configurations (bench's closing table, report's console) say of it.
RANK_CAPTION = ("ranked by one statistic: samples/s, each run's batch / its mean iteration, "
                "median over repeats; mean ms is the same median as a time")
FIGURES = ("samples_per_s_median", "samples_per_s_p10", "samples_per_s_p90", "iter_ms_mean",
           "iter_ms_median", "iter_ms_p10", "iter_ms_p90")


def _values(repeats: pd.DataFrame, column: str) -> np.ndarray:
    if column not in repeats:
        return np.array([])
    v = pd.to_numeric(repeats[column], errors="coerce").to_numpy(dtype=float)
    return v[~np.isnan(v)]


def percentile(values: Any, q: float) -> float:
    """The q-th percentile of the numbers among `values` (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, q)) if len(v) else math.nan


def _mean_ms(repeats: pd.DataFrame) -> np.ndarray:
    """Each run's mean iteration ms: its `mean_iter_ms`, else (runs written before it) its
    batch over its samples/s; the positive numbers only."""
    def col(name: str) -> pd.Series:
        return pd.to_numeric(repeats.get(name, pd.Series(math.nan, index=repeats.index)),
                             errors="coerce")

    mean = col("mean_iter_ms").fillna(1e3 * col("batch_size") / col("samples_per_s"))
    v = mean.to_numpy(dtype=float)
    return v[v > 0]


def config_figures(repeats: pd.DataFrame) -> dict[str, float]:
    """The FIGURES of one configuration from its repeats' rows (columns `samples_per_s`,
    `mean_iter_ms`, `median_iter_ms`, `p10_iter_ms`, `p90_iter_ms`; see the module
    docstring)."""
    sps = _values(repeats, "samples_per_s")
    mean = _mean_ms(repeats)
    return {
        "samples_per_s_median": percentile(sps, 50), "samples_per_s_p10": percentile(sps, 10),
        "samples_per_s_p90": percentile(sps, 90),
        "iter_ms_mean": 1 / percentile(1 / mean, 50) if len(mean) else math.nan,
        "iter_ms_median": percentile(_values(repeats, "median_iter_ms"), 50),
        "iter_ms_p10": percentile(_values(repeats, "p10_iter_ms"), 50),
        "iter_ms_p90": percentile(_values(repeats, "p90_iter_ms"), 50),
    }
