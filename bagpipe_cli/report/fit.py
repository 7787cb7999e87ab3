"""The small-data fact (`bagpipe_cli/report/guidance.py`) beside the measurements of the same runs.

The fact that every table fits a trainer many times over says that `local` can run, never
that it wins: `local` sums every row gradient among the trainers, which can cost more than
a cache's fetches. Where the runs beside it measured `local` slower than another system,
outside the noise of the repeats (`report.noise`), the one guidance line of that dataset
says both: the fact and the measurement that disagrees with reading it as a verdict.

Definitions: a setting's groups and their samples/s (the median over repeats of each run's
`samples_per_s`: `results.config_figures`) are `report.verdict`'s; `local` is the system
whose registry role is "bound".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.registry import role
from bagpipe_cli.report.guidance import small_data_sentences
from bagpipe_cli.report.noise import NOISE_MARK, UNKNOWN_MARK, noise_mark, ratio_range
from bagpipe_cli.results.figures import percentile


def _sps(g: pd.DataFrame) -> np.ndarray:
    v = pd.to_numeric(g.get("samples_per_s", pd.Series(dtype=float)), errors="coerce")
    v = v.to_numpy(dtype=float)
    return v[~np.isnan(v)]


def _dataset(g: pd.DataFrame) -> str:
    d = g.iloc[0].get("dataset")
    return str(d) if d is not None and pd.notna(d) else ""


def local_slower(setting: str, groups: list[pd.DataFrame]) -> str | None:
    """In one setting's groups: `local` measured slower than the fastest group, outside the
    noise of the repeats, in words; None when local did not run, was fastest, or the gap is
    within the noise or unknown."""
    local = [g for g in groups if role(g.iloc[0]["system"]) == "bound" and len(_sps(g))]
    others = [g for g in groups if role(g.iloc[0]["system"]) != "bound" and len(_sps(g))]
    if not local or not others:
        return None
    best_local = max(local, key=lambda g: percentile(_sps(g), 50))
    fastest = max(others, key=lambda g: percentile(_sps(g), 50))
    a, b = _sps(best_local), _sps(fastest)
    ratio = percentile(a, 50) / percentile(b, 50)
    if not (ratio < 1) or noise_mark(ratio, *ratio_range(a, b)) in (NOISE_MARK, UNKNOWN_MARK):
        return None
    return (f"in {setting}, `{best_local.iloc[0]['variant']}` ran at {percentile(a, 50):,.0f} "
            f"samples/s, {ratio:.2f}× `{fastest.iloc[0]['variant']}`'s {percentile(b, 50):,.0f} "
            "(outside the noise of the repeats)")


def fit_guidance(runs: Any, groups: dict[str, list[pd.DataFrame]]) -> list[str]:
    """One line per dataset of `runs` whose tables fit a trainer many times over: the fact
    (`guidance.TableFit.sentence`) and, where its settings (`groups`: by setting label) measured
    `local` slower than another system outside the noise, those measurements."""
    out = []
    for dataset, fact in small_data_sentences(runs).items():
        slower = [w for setting, gs in groups.items()
                  if gs and _dataset(gs[0]) == dataset and (w := local_slower(setting, gs))]
        out.append(fact + (" Measured beside it, `local` was not the fastest: "
                           + "; ".join(slower) + "." if slower else ""))
    return out

