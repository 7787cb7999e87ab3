"""Writing a profile: profile.json, CSV tables and PNG plots, into one directory (atomically).

Files:
- `profile.json`: the whole result (`ProfileResult.to_json()`, schema_version 1).
- `profile.csv`: one row per (policy, setting): fetched rows, hit rate, peak, bytes.
- `skew_tables.csv`: per-table skew (accesses, accessed rows, top shares, Zipf exponent).
- `access_cdf.csv`: the access CDF (overall and per table) at log-spaced points.
- `bagpipe_vs_belady.csv`: Bagpipe against Belady at Bagpipe's peak (if both ran).
- `per_batch.csv`: rows fetched in every batch, one column per (policy, setting).
- `lookahead_reuse.csv`: what lookahead buys (`profile/reuse.py`), one row per (table, k),
  all tables first (table "(all)").
- `reuse_factor.csv` (accesses, distinct rows and their ratio in every batch) and
  `reuse_histogram.csv` (that ratio's histogram over the batches).
- `access_cdf.png`, `table_top_share.png`, `fetched_vs_lookahead.png`,
  `fetched_vs_cache.png` (the last two when the policies they show ran),
  `lookahead_reuse.png` (when there are two batches or more), `reuse_factor.png`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bagpipe_cli.files.atomic import atomic_dir, write_json
from bagpipe_cli.profile import ProfileResult
from bagpipe_cli.profile.plots import (
    plot_access_cdf,
    plot_fetched_vs_cache,
    plot_fetched_vs_lookahead,
    plot_table_top_share,
)
from bagpipe_cli.profile.reuse_plots import plot_lookahead_reuse, plot_reuse_factor


def skew_frame(result: ProfileResult) -> pd.DataFrame:
    """One row per table (and a first row for all tables together)."""
    s = result.skew
    rows = [{"table": "(all)", "cardinality": s.embedding_rows, "accesses": s.accesses,
             "accessed_rows": s.accessed_rows,
             **{f"top_{k}": v for k, v in s.top_share.items()}, "zipf_exponent": None}]
    for t in s.tables:
        rows.append({"table": t.name, "cardinality": t.cardinality, "accesses": t.accesses,
                     "accessed_rows": t.accessed_rows,
                     **{f"top_{k}": v for k, v in t.top_share.items()},
                     "zipf_exponent": t.zipf_exponent})
    return pd.DataFrame(rows)


def cdf_frame(result: ProfileResult) -> pd.DataFrame:
    s = result.skew
    parts = [pd.DataFrame({"table": "(all)", "row_fraction": s.cdf_rows, "access_fraction": s.cdf_accesses})]
    for t in s.tables:
        parts.append(pd.DataFrame({"table": t.name, "row_fraction": t.cdf_rows,
                                   "access_fraction": t.cdf_accesses}))
    return pd.concat(parts, ignore_index=True)


def per_batch_frame(result: ProfileResult) -> pd.DataFrame:
    cols = {}
    for p in result.policies:
        name = p.policy + (f"_L{p.lookahead}" if p.lookahead is not None else "") + (
            f"_R{p.cache_rows}" if p.cache_rows is not None else "")
        cols[name] = p.fetched_per_batch
    df = pd.DataFrame(cols)
    df.index.name = "batch"
    return df


def write_profile(result: ProfileResult, out: Path, overwrite: bool = False) -> list[Path]:
    """Write every output file of `result` into `out` (atomically); returns their paths."""
    with atomic_dir(out, overwrite) as tmp:
        write_json(tmp / "profile.json", result.to_json())
        result.policies_frame().to_csv(tmp / "profile.csv", index=False)
        skew_frame(result).to_csv(tmp / "skew_tables.csv", index=False)
        cdf_frame(result).to_csv(tmp / "access_cdf.csv", index=False)
        per_batch_frame(result).to_csv(tmp / "per_batch.csv")
        if result.bagpipe_vs_belady:
            pd.DataFrame([c.to_json() for c in result.bagpipe_vs_belady]).to_csv(
                tmp / "bagpipe_vs_belady.csv", index=False)
        result.lookahead_reuse.frame().to_csv(tmp / "lookahead_reuse.csv", index=False)
        result.reuse_factor.frame().to_csv(tmp / "reuse_factor.csv", index=False)
        result.reuse_factor.histogram_frame().to_csv(tmp / "reuse_histogram.csv", index=False)
        plot_access_cdf(result, tmp / "access_cdf.png")
        plot_table_top_share(result, tmp / "table_top_share.png")
        if any(p.lookahead is not None for p in result.policies):
            plot_fetched_vs_lookahead(result, tmp / "fetched_vs_lookahead.png")
        if any(p.cache_rows is not None for p in result.policies):
            plot_fetched_vs_cache(result, tmp / "fetched_vs_cache.png")
        if result.lookahead_reuse.depth:
            plot_lookahead_reuse(result, tmp / "lookahead_reuse.png")
        plot_reuse_factor(result, tmp / "reuse_factor.png")
        names = sorted(p.name for p in tmp.iterdir())
    return [Path(out) / n for n in names]
