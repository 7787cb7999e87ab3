"""`bagpipe report`: figures and a Markdown/HTML page from stored results."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from bagpipe_cli.cli.common import (
    InputPath,
    OutputPath,
    check_outputs,
    console,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.files.outputs import Input, check_inputs_free

if TYPE_CHECKING:
    from bagpipe_cli.report.verdict import Verdict
    from bagpipe_cli.results import SkippedRun

# Files that make a folder stored results (a run, a bench, a dataset): an --out holding one
# would replace it.
RESULT_FILES = ("summary.json", "bench.json", "meta.json", "profile.json")


@click.command(epilog="""\b
Examples:
  bagpipe report results/successors
  bagpipe report results/bench-demo results/successors --out results/compare --format png,svg,html,md""")
@click.argument("results", nargs=-1, required=True, type=InputPath())
@click.option("--out", type=OutputPath("report"), default=None,
              help="Report folder [default: <first RESULTS>/report]; an earlier report there is "
                   "replaced with --overwrite.")
@click.option("--format", "formats", default="png,html,md", show_default=True,
              help="Comma-separated outputs: png, svg (figures), html, md (pages).")
@overwrite_option
@translate_errors
def report(results: tuple[Path, ...], out: Path | None, formats: str, overwrite: bool) -> None:
    """Draw the figures and write a report page from stored RESULTS (bench folders, run folders
    or their parents); nothing is re-run. A run inside a folder given that cannot be read
    (damaged or truncated files, another schema_version) is left out with a warning; a run
    folder given itself must be readable.

    Figures: speed-up of every system over sync, per-iteration time breakdown, samples/s vs
    lookahead and vs cache size (when the results vary them), loss curves, rows fetched per
    iteration, the timeline and the overlap of communication with compute (when runs carry
    a trace), held-out AUC over time (when runs evaluated during training) and the dataset's
    access-skew CDF, with a summary table (median, p10-p90) and time to the target AUC.

    The page and this output lead with the verdict in words: per setting, the fastest system,
    its lead over the best other system and over sync and whether each is outside the noise
    of the repeats; warnings first when runs ran under load or systems computed the same
    model at very different speeds; and, when the tables fit a trainer many times over, that
    `local` can run there (with `local`'s measurements where they were slower).
    """
    from bagpipe_cli.report import ReportConfig, build_report
    from bagpipe_cli.report.noise import legend
    from bagpipe_cli.report.page import display_summary
    from bagpipe_cli.results import find_runs
    from bagpipe_cli.results.figures import RANK_CAPTION

    cfg = ReportConfig(results=results, out=out, formats=tuple(formats.split(",")), overwrite=overwrite)
    # A bench still running (it may have no runs yet) is named before its runs are looked for.
    check_inputs_free([Input("RESULTS", r) for r in cfg.results], then=_when_written)
    find_runs(*cfg.results)  # a RESULTS that is not there is named before --out is made
    check_outputs(_inputs(cfg.results, cfg.out_dir), out=cfg.out_dir)
    res = build_report(cfg)
    warn_skipped(res.skipped)
    print_verdict(res.verdict)
    s = res.summary
    t = Table(title=f"{len(res.runs)} runs: median over repeats", title_justify="left",
              caption=RANK_CAPTION, caption_justify="left")
    for col in ("setting", "system", "runs", "mean ms", "samples/s", "speed-up vs sync"):
        t.add_column(col, justify="left" if col in ("setting", "system") else "right")
    speedups = display_summary(s)["speed-up vs sync: median (p10–p90)"] if len(s) else []
    for r, sp in zip(s.itertuples(), speedups, strict=True):
        t.add_row(r.setting, r.variant, str(r.runs), f"{r.iter_ms_mean:.1f}",
                  f"{r.samples_per_s_median:,.0f}", sp)
    console.print(t)
    key = legend(speedups)
    if key:
        console.print(key, soft_wrap=True, highlight=False)
    for n in res.notes:
        console.print(f"[yellow]note:[/yellow] {n}", soft_wrap=True)
    pages = [p for p in res.files if p.suffix in (".html", ".md")]
    console.print(f"{len(res.figures)} figures; report: {', '.join(map(str, pages)) or res.out}",
                  soft_wrap=True)


def print_verdict(verdict: Verdict) -> None:
    """The verdict's words on the console (`report.verdict.Verdict`): the flags as warnings
    first, then per setting the fastest system, Bagpipe's line and the small-data guidance."""
    for f in verdict.flags:
        console.print(f"[yellow]warning:[/yellow] {escape(f.text)}", soft_wrap=True,
                      highlight=False)
    for line in [s for v in verdict.settings for s in v.sentences] + (
            [verdict.bagpipe] if verdict.bagpipe else []) + verdict.guidance:
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def _when_written(folder: Path) -> str:
    """What to do about a RESULTS folder another process is writing (a bench running)."""
    runs = folder / "runs"
    done = len(list(runs.glob("*/summary.json"))) if runs.is_dir() else 0
    if not done:
        return "wait for it to end, then report it (it has finished no run yet)"
    return (f"wait for it to end, then report it; the {done} run{'s' if done != 1 else ''} it "
            f"has finished are in {runs} (report a copy of them to see those now)")


def _inputs(results: tuple[Path, ...], out: Path) -> list[Input]:
    """What a report reads: the folders given (a report may go inside one, as by default) and
    any stored results inside --out itself (which the report would replace)."""
    inputs = [Input("RESULTS", r, may_hold_out=True) for r in results]
    if out.is_dir():
        for name in RESULT_FILES:
            found = next(out.rglob(name), None)
            if found is not None:
                inputs.append(Input("RESULTS", found.parent))
    return inputs


def warn_skipped(skipped: Iterable[SkippedRun | dict[str, str]]) -> None:
    """One `Warning: skipped RUN: reason` line on stderr per run left out as unreadable
    (`SkippedRun`s, or their `to_dict()` as stored in a result's JSON)."""
    from bagpipe_cli.results import SkippedRun

    for s in skipped:
        if isinstance(s, dict):
            s = SkippedRun(Path(s["path"]), s["reason"])
        click.echo(f"Warning: skipped {s}", err=True)
