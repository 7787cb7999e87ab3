"""`bagpipe preprocess criteo|avazu|csv`: raw click logs -> a dataset directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from bagpipe_cli.cli.common import (
    InputPath,
    check_outputs,
    console,
    err_console,
    format_si,
    list_option,
    out_option,
    overwrite_option,
    progress_bar,
    translate_errors,
)
from bagpipe_cli.files.outputs import Input

if TYPE_CHECKING:
    from bagpipe_cli.data.preprocess import PreprocessResult

_PHASES = {"read": "read + count", "write": "write ids", "encode": "read + encode"}
_OPS = ">=, >, <=, <, ==, !="


def _threshold_option(column: str, implies: str) -> Callable[..., Any]:
    """--label-threshold: the label is 1 where a comparison of `column` holds, else 0."""
    return click.option("--label-threshold", default=None, metavar="EXPR",
                        help=f"Derive the 0/1 label from {column}: EXPR is COLUMN OP NUMBER (OP: "
                             f"{_OPS}), the label 1 where it holds, else 0; e.g. {implies}.")


def _common_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Options every input format shares."""
    decorators = [
        out_option("dataset"),
        click.option("--min-count", type=int, default=1, show_default=True,
                     help="Values seen fewer than K times map to id 0 (missing/rare)."),
        click.option("--max-rows-per-table", type=int, default=None,
                     help="Hash values into R ids (1..R-1, 0 = missing) instead of building a "
                          "vocabulary; one pass (like DLRM's --max-ind-range)."),
        click.option("--vocab-from", type=InputPath(), default=None,
                     help="Encode with the vocabularies of this preprocessed dataset (e.g. a test "
                          "split with the training mapping); unknown values -> 0."),
        click.option("--on-bad-line", type=click.Choice(["error", "skip"]), default="error",
                     show_default=True,
                     help="error: stop at the first bad line (FILE:LINE: problem); skip: drop bad "
                          "lines and record them in meta.json."),
        click.option("--block-mb", type=float, default=16.0, show_default=True,
                     help="Input read per block, in MiB (memory is a few blocks plus the "
                          "vocabularies)."),
        click.option("--name", default="", help="Dataset name in meta.json."),
        overwrite_option,
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


def _run(fmt: str, inputs: tuple[Path, ...], out: Path, overwrite: bool, block_mb: float,
         **kwargs: Any) -> None:
    from bagpipe_cli.data.preprocess import PreprocessConfig
    from bagpipe_cli.data.preprocess import preprocess as run_preprocess

    cfg = PreprocessConfig(format=fmt, inputs=inputs, block_size=block_mb * 2**20, **kwargs)
    check_outputs([Input("INPUTS", p) for p in inputs]
                  + ([Input("--vocab-from", kwargs["vocab_from"])] if kwargs.get("vocab_from") else []))

    def progress(phase: str, total: int | None):
        return progress_bar(_PHASES.get(phase, phase), total, unit="rows")

    result = run_preprocess(cfg, out, overwrite=overwrite, progress=progress)
    _summary(result, out)
    for w in result.warnings:
        err_console.print(f"[yellow]Warning:[/] {escape(w)}", highlight=False, soft_wrap=True)


def _summary(r: PreprocessResult, out: Path) -> None:
    meta = r.meta
    cards = [t.cardinality for t in r.tables]
    table = Table(title=f"{meta.name} -> {out}", show_header=False)
    table.add_row("rows", f"{meta.rows:,}" + (f" from {len(meta.extra['files'])} files"
                                              if len(meta.extra["files"]) > 1 else ""))
    if cards:
        table.add_row("tables", f"{len(cards)} (embedding rows in all: {sum(cards):,}; "
                      f"largest {max(cards):,}, smallest {min(cards):,})")
    else:
        table.add_row("tables", "0")
    enc = meta.extra["encoding"]
    if enc["mode"] == "hash":
        table.add_row("ids", f"hashed into {enc['max_rows_per_table']:,} per table")
    elif enc["mode"] == "vocab-from":
        table.add_row("ids", f"vocabularies of {enc['vocab_from']}")
    else:
        distinct = sum(t.distinct or 0 for t in r.tables)
        kept = sum(cards) - len(cards)
        note = f" ({distinct - kept:,} below --min-count -> 0)" if distinct != kept else ""
        table.add_row("ids", f"by popularity, vocabularies in {out}/vocab{note}")
    table.add_row("dense features", str(meta.num_dense))
    if meta.label is not None:
        rule = (meta.extra.get("label") or {}).get("rule")
        table.add_row("label", meta.label + (f" ({rule})" if rule and meta.options.get(
            "label_threshold") else ""))
    bad = meta.extra["bad_lines"]
    if bad["count"]:
        first = bad["first"][0]
        where = first.get("line", first.get("row"))
        causes = ", ".join(f"{c} ({n:,})" for c, n in (bad.get("causes") or {}).items())
        table.add_row("bad lines skipped", f"{bad['count']:,}" + (f": {causes}" if causes else "")
                      + f" (first: {first['file']}:{where}: {first['problem']})")
    table.add_row("time", f"{r.seconds:.1f} s ({format_si(r.rows_per_second)} rows/s)")
    console.print(table)


@click.group(epilog="Example: bagpipe preprocess criteo train.txt --out data/criteo")
def preprocess() -> None:
    """Turn raw click logs (Criteo, Avazu, any CSV/Parquet) into a dataset directory.

    Categorical values get contiguous ids per table in order of decreasing frequency (id 0
    = missing or unknown); dense values become log(1 + max(x, 0)). Input is streamed in
    blocks, so memory is bounded by the vocabularies, not the file size, and the output is
    written atomically.
    """


@preprocess.command(epilog="Example: bagpipe preprocess criteo day_0.gz day_1.gz --out data/tb "
                           "--max-rows-per-table 10000000")
@click.argument("inputs", nargs=-1, required=True, type=InputPath())
@click.option("--no-label", is_flag=True,
              help="The files have no label column (Kaggle's test.txt).")
@_threshold_option("the label column, 'label'", "'label>=1' for files whose first column "
                   "counts clicks")
@_common_options
@translate_errors
def criteo(inputs: tuple[Path, ...], out: Path, overwrite: bool, no_label: bool, **kw: Any) -> None:
    """Criteo TSV: label, I1..I13 (integers), C1..C26 (hex); Kaggle or Terabyte days.

    Several INPUTS (e.g. Terabyte's day_0 ... day_23, plain or .gz) are read in order into
    one dataset; meta.json records each file's row range.
    """
    _run("criteo", inputs, out, overwrite, label=None if no_label else "label", **kw)


@preprocess.command(epilog="Example: bagpipe preprocess avazu train.gz --out data/avazu --min-count 5")
@click.argument("inputs", nargs=-1, required=True, type=InputPath())
@click.option("--hour", type=click.Choice(["split", "keep"]), default="split", show_default=True,
              help="split: YYMMDDHH -> hour_of_day and day_of_week tables; keep: one raw `hour` table.")
@_threshold_option("the label column, 'click'", "'click>=1' for a file of click counts")
@_common_options
@translate_errors
def avazu(inputs: tuple[Path, ...], out: Path, overwrite: bool, **kw: Any) -> None:
    """Avazu CSV with header: label `click`, every column but `id` categorical."""
    _run("avazu", inputs, out, overwrite, **kw)


@preprocess.command(epilog="Example: bagpipe preprocess csv clicks.parquet --out data/mine --label "
                           "clicked --categorical user,item,shop --dense price,age\n\n"
                           "Example: bagpipe preprocess csv ratings.csv --out data/ml "
                           "--label-threshold 'rating>=4' --categorical user,item")
@click.argument("inputs", nargs=-1, required=True, type=InputPath())
@click.option("--label", default=None,
              help="Label column (values 0 or 1); or derive it with --label-threshold.")
@_threshold_option("a numeric column, which becomes the label column (--label may be left out)",
                   "'rating>=4' on 1..5 star ratings")
@click.option("--categorical", required=True, help="Comma-separated categorical columns.")
@click.option("--dense", default=None, help="Comma-separated numeric columns.")
@click.option("--sep", default=",", show_default=True, help="Field separator (text input).")
@_common_options
@translate_errors
def csv(inputs: tuple[Path, ...], out: Path, overwrite: bool, categorical: str, dense: str | None,
        sep: str, **kw: Any) -> None:
    """Any CSV (with a header line) or Parquet file: bring your own data."""
    if sep == "\\t":
        sep = "\t"
    cats = tuple(list_option(categorical, str, "--categorical") or [])
    dens = tuple(list_option(dense, str, "--dense") or [])
    _run("csv", inputs, out, overwrite, categorical=cats, dense=dens, sep=sep, **kw)
