"""`bagpipe profile`: access skew and cache-policy simulation of a dataset."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from bagpipe_cli.cli.common import (
    StageBars,
    check_outputs,
    console,
    data_argument,
    err_console,
    list_option,
    out_option,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.engine.config import EMB_OPTIMIZERS, TrainConfig
from bagpipe_cli.files.outputs import Input
from bagpipe_cli.policies.table import capacity_policy_names, policy_names

if TYPE_CHECKING:
    from bagpipe_cli.profile import ProfileResult


def _int(v: str) -> int:
    return int(v.replace("_", ""))  # "1_000_000" reads as well


@click.command(
    epilog="Example: bagpipe profile data/demo --batch-size 2048 --lookahead 16,64 "
    "--cache-rows 20000,80000 --out results/demo-profile"
)
@data_argument
@click.option("--batch-size", type=int, default=4096, show_default=True,
              help="Global batch size B (samples per batch); a final partial batch is kept.")
@click.option("--lookahead", "lookahead", default="200", show_default=True,
              help="Bagpipe lookahead(s) L in batches, comma-separated; the largest is also K, "
                   "the distances k = 1..K of what lookahead buys (at most 64 and the batches - 1).")
@click.option("--cache-rows", "cache_rows", default=None,
              help=f"Cache capacities R (rows) for {', '.join(capacity_policy_names())}, comma-separated "
                   "[default: Bagpipe's peak at every L and 2 x the largest batch's unique rows].")
@click.option("--policies", default=",".join(policy_names()), show_default=True,
              help="Policies to simulate, comma-separated.")
@click.option("--dim", type=int, default=TrainConfig.emb_dim, show_default=True,
              help="Embedding dimension, for the fp32 bytes fetched and the tables' size "
                   "(train's --emb-dim default).")
@click.option("--optimizer", type=click.Choice(EMB_OPTIMIZERS), default="sgd", show_default=True,
              help="Embedding optimizer, for the tables' size (adagrad keeps one float of "
                   "state a row).")
@out_option("profile", required=False, help="Output directory, written atomically "
                                 "[default: results/profile-<dataset directory name>].")
@overwrite_option
@translate_errors
def profile(data: Path, batch_size: int, lookahead: str, cache_rows: str | None, policies: str,
            dim: int, optimizer: str, out: Path | None, overwrite: bool) -> None:
    """Profile DATA: access skew and every cache policy simulated on the exact batch trace.

    Writes profile.json, CSV tables (profile.csv, skew_tables.csv, access_cdf.csv,
    per_batch.csv, bagpipe_vs_belady.csv, lookahead_reuse.csv, reuse_factor.csv,
    reuse_histogram.csv) and PNG plots to --out, and prints a summary: with the size of the
    embedding tables (--dim floats a row, and --optimizer's state) against this machine's
    memory, and, when they fit many times over, that `local` (every table on each trainer)
    can run (the size names no winner: `bagpipe bench` measures one, `bagpipe simulate`
    predicts one).

    What lookahead buys, for k = 1..K (K = the largest --lookahead, at most 64 and the number
    of batches - 1), per table and for all tables: the share of the distinct rows of batch
    b+k that batch b read ("in batch b") and that one of batches b..b+k-1 read ("in
    b..b+k-1": what lookahead k keeps), that is sum over b of |U_{b+k} & X| / sum over b of
    |U_{b+k}|, X = U_b or X = the union of U_b..U_{b+k-1}, over every b where batch b+k
    exists (U_b: the distinct rows of batch b). And each batch's reuse factor: its accesses
    per distinct row (median, p10, p90 and a histogram over the full batches).
    """
    from bagpipe_cli.data.format import open_dataset
    from bagpipe_cli.profile import ProfileConfig, run_profile
    from bagpipe_cli.profile.report import write_profile

    cfg = ProfileConfig(
        data=data, batch_size=batch_size,
        lookaheads=tuple(list_option(lookahead, _int, "--lookahead") or ()),
        cache_rows=(tuple(list_option(cache_rows, _int, "--cache-rows") or ())
                    if cache_rows is not None else None),
        policies=tuple(p.strip().lower() for p in policies.split(",") if p.strip()),
        dim=dim,
    )
    out = out or Path("results") / f"profile-{Path(data).resolve().name}"
    open_dataset(data)  # a DATA that is no dataset is named first
    check_outputs([Input("DATA", data)], out=out)  # fail before minutes of work, not after
    with StageBars() as progress:
        result = run_profile(cfg, progress)
    write_profile(result, out, overwrite)
    _summary(result, out, optimizer)
    for w in result.warnings:
        err_console.print(f"[yellow]Warning:[/] {w}", highlight=False, soft_wrap=True)


def _summary(result: ProfileResult, out: Path, optimizer: str) -> None:
    from bagpipe_cli.profile.skew import share_label
    from bagpipe_cli.report.guidance import table_fit

    t, s = result.trace, result.skew
    head = Table(title=f"profile of {result.dataset.get('given', result.dataset['path'])} -> {out}",
                 show_header=False)
    head.add_row("samples x tables", f"{result.dataset['rows']:,} x {len(result.dataset['tables'])} "
                 f"= {t.accesses:,} accesses")
    head.add_row("embedding rows", f"{s.embedding_rows:,} ({s.accessed_rows:,} accessed)")
    head.add_row("top rows' share", ", ".join(f"{k}: {share_label(v)}" for k, v in s.top_share.items()))
    head.add_row("batches", f"{t.batches:,} of {t.batch_size:,} (last: {t.last_batch_rows:,} samples); "
                 f"unique rows per batch: max {t.max_batch_unique_rows:,}, "
                 f"mean {t.unique_accesses / max(t.batches, 1):,.0f}")
    fit = table_fit([x["cardinality"] for x in result.dataset["tables"]], result.config.dim,
                    optimizer, dataset=str(result.dataset.get("name") or ""))
    head.add_row("tables' size", f"{_bytes(fit.table_bytes)} ({result.config.dim}-dim fp32"
                 + (f", {optimizer} state" if fit.state_dim else "") + "): "
                 + (f"1/{fit.times:,.0f} of" if fit.times >= 1 else f"{1 / fit.times:,.1f}x")
                 + f" this machine's {_bytes(fit.memory_bytes)}")
    console.print(head)
    if fit.sentence():
        console.print(fit.sentence(), soft_wrap=True, highlight=False, markup=False)
    tab = Table(title=f"rows fetched from the embedding servers ({result.config.dim}-dim fp32)")
    for col in ["policy", "L", "cache rows", "fetched rows", "hit rate", "peak resident", "fetched"]:
        tab.add_column(col, justify="left" if col == "policy" else "right")
    for p in result.policies:
        tab.add_row(
            p.policy, "" if p.lookahead is None else f"{p.lookahead:,}",
            "" if p.cache_rows is None else f"{p.cache_rows:,}", f"{p.fetched_rows:,}",
            f"{p.hit_rate:.1%}", f"{p.peak_resident_rows:,}", _bytes(p.fetched_bytes(result.config.dim)),
        )
    console.print(tab)
    _reuse_summary(result)
    for c in result.bagpipe_vs_belady:
        console.print(f"bagpipe L={c.lookahead}: {c.bagpipe_fetched_rows:,} rows fetched with a peak of "
                      f"{c.bagpipe_peak_resident_rows:,} resident; belady at that capacity: "
                      f"{c.belady_fetched_rows:,} ({c.fetched_ratio:.2f}x)")


def _reuse_summary(result: ProfileResult) -> None:
    """What lookahead buys, all tables together, at k = 1, 2, 4, ... and K; the reuse factor."""
    r = result.lookahead_reuse
    if r.depth:
        o = r.overall()
        tab = Table(title="what lookahead buys: rows of batch b+k already read",
                    caption="all tables; every k and table: lookahead_reuse.csv")
        for col in ["k", "in batch b", "in b..b+k-1", "rows of batches b+k"]:
            tab.add_column(col, justify="right")
        for k in sorted({2**i for i in range(r.depth.bit_length()) if 2**i <= r.depth} | {r.depth}):
            rows, inb, inw = (int(o[n][k - 1]) for n in ("rows", "in_batch", "in_window"))
            tab.add_row(f"{k:,}", _share(inb, rows), _share(inw, rows), f"{rows:,}")
        console.print(tab)
    else:
        console.print("what lookahead buys: n/a (one batch: no batch b+k to compare)")
    rf = result.reuse_factor
    f, n, left = rf.summary(), int(rf.counted.sum()), not rf.counted.all()
    console.print(f"reuse factor (accesses per distinct row of a batch): median {f['median']:.2f}, "
                  f"p10 {f['p10']:.2f}, p90 {f['p90']:.2f} over {n:,} batch{'es' if n > 1 else ''}"
                  + (" (the final partial one left out)" if left else ""), highlight=False)


def _share(part: int, rows: int) -> str:
    return f"{part / rows:.1%}" if rows else "n/a"


def _bytes(n: float) -> str:
    for div, suffix in [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")]:
        if n >= div:
            return f"{n / div:.1f} {suffix}"
    return f"{n:.0f} B"
