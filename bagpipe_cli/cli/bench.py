"""`bagpipe bench`: run a benchmark matrix and store every run in one bench folder."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bagpipe_cli.bench import (
    default_out,
    find_bench_file,
    load_bench_config,
    parse_bench_config,
    read_bench_config,
    run_bench,
)
from bagpipe_cli.cli.common import OneLineError, console, err_console, translate_errors

LIVE_ROWS = 12  # finished runs shown in the live table (all are in index.csv)


@click.command(epilog="""\b
Examples:
  bagpipe bench --quick                      # benchmarks/quick.yaml, ~2 minutes
  bagpipe bench benchmarks/paper.yaml --repeat 5 --out results/paper
  bagpipe bench --resume --out results/paper  # continue an interrupted bench
  bagpipe report results/paper""")
@click.argument("config", type=click.Path(path_type=Path), required=False)
@click.option("--quick", is_flag=True,
              help="Run benchmarks/quick.yaml (the default when no CONFIG is given).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Bench folder [default: results/bench-<name>-<timestamp>].")
@click.option("--repeat", type=int, default=None, help="Repeats of every run [default: the config's].")
@click.option("--resume", is_flag=True,
              help="Continue the bench in --out: skip runs already complete there (CONFIG "
                   "defaults to the one stored in that folder).")
@translate_errors
def bench(config: Path | None, quick: bool, out: Path | None, repeat: int | None, resume: bool) -> None:
    """Run a benchmark matrix (systems x models x datasets x settings) from a YAML/TOML CONFIG.

    Every run is stored in <out>/runs/<run-id>/ (config.json, metrics.csv, summary.json) and
    listed in <out>/index.json and index.csv as soon as it finishes, so an interrupted bench
    keeps its finished runs; --resume skips them. Repeats are interleaved. Missing synthetic
    datasets are generated first, and each dataset is profiled into <out>/profiles/.
    """
    if quick and config is not None:
        raise click.UsageError("give a CONFIG file or --quick, not both")
    if resume and out is None:
        raise click.UsageError("--resume needs --out: the bench folder to continue")
    if config is not None:
        cfg = load_bench_config(config)
    elif resume and not quick:
        cfg = parse_bench_config(read_bench_config(out), str(out / "bench.json"))
    else:
        cfg = load_bench_config(find_bench_file("quick"))
    cfg = cfg.with_repeat(repeat)
    out = out or default_out(cfg)
    display = _Display(cfg.name, out)
    try:
        with display:
            result = run_bench(cfg, out, resume=resume, progress=display)
    except KeyboardInterrupt:
        n = display.finished
        raise OneLineError(f"interrupted; {n} finished run{'s' if n != 1 else ''} kept in {out}; "
                           f"continue with: bagpipe bench --resume --out {out}", 130) from None
    console.print(_summary_table(result.index, cfg.name, out))
    console.print(f"{result.ran} runs done, {result.skipped} kept from before; bench folder: {out}",
                  soft_wrap=True)
    console.print(f"next: bagpipe report {out}", soft_wrap=True)


class _Display:
    """A live table of finished runs and a bar for the run in progress (terminal), or one
    printed line per finished run (pipes, logs)."""

    def __init__(self, name: str, out: Path):
        self.name, self.out = name, out
        self.rows: list[dict] = []
        self.finished = 0
        self.live_mode = err_console.is_terminal
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("[cyan]{task.fields[info]}"), TimeElapsedColumn(),
                            console=err_console)
        self.runs_task = self.bar.add_task("runs", total=None, info="")
        self.iter_task = self.bar.add_task("run", total=None, info="", visible=False)
        self.live = Live(Group(self._table(), self.bar), console=err_console, refresh_per_second=4,
                         transient=False) if self.live_mode else None

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def _table(self) -> Table:
        t = Table(title=f"bench {self.name} -> {self.out}", title_justify="left")
        for col in ("run id", "system", "setting", "samples/s", "median ms", ""):
            t.add_column(col, justify="right" if col in ("samples/s", "median ms") else "left")
        hidden = len(self.rows) - LIVE_ROWS
        if hidden > 0:
            t.add_row(f"... {hidden} earlier runs (index.csv)", "", "", "", "", "")
        for r in self.rows[-LIVE_ROWS:]:
            t.add_row(*_cells(r))
        return t

    def __call__(self, e) -> None:
        if e.kind in ("dataset", "profile"):
            err_console.print(f"[dim]{e.message}[/dim]")
            return
        self.bar.update(self.runs_task, total=e.total, completed=e.done)
        if e.kind == "start":
            c = e.run.config
            self.bar.update(self.iter_task, description=e.run.run_id(e.repeat), total=c.iterations,
                            completed=0, info="", visible=True)
        elif e.kind == "iteration":
            rec = e.record
            planned = rec["time"] != rec["time"]  # NaN: rank 0 of a distributed run planned it
            self.bar.update(self.iter_task, completed=e.iteration + 1,
                            info="" if planned else
                            f"{e.run.config.batch_size / max(rec['time'], 1e-9):,.0f} samples/s")
        elif e.kind in ("done", "skipped"):
            self.finished += 1
            self.rows.append(e.row)
            self.bar.update(self.iter_task, visible=False)
            if self.live:
                self.live.update(Group(self._table(), self.bar))
            else:
                cells = _cells(e.row)
                err_console.print(f"[{e.done}/{e.total}] {cells[0]}  {cells[1]}  {cells[2]}  "
                                  f"{cells[3]} samples/s  {cells[4]} ms  {cells[5]}", highlight=False,
                                  soft_wrap=True)


def _cells(r: dict) -> list[str]:
    sps, ms = r.get("samples_per_s"), r.get("median_iter_ms")
    setting = ", ".join(x for x in (r.get("variant"), r.get("setting")) if x and x != "-") or "-"
    return [r["run_id"], r["system"], setting, f"{sps:,.0f}" if sps is not None else "-",
            f"{ms:.1f}" if ms is not None else "-", "kept" if r.get("status") == "kept" else ""]


def _summary_table(index, name: str, out: Path) -> Table:
    """Median over repeats of samples/s and iteration time, per configuration."""
    t = Table(title=f"bench {name}: median over repeats", title_justify="left")
    for col in ("system", "setting", "repeats", "samples/s", "median ms"):
        t.add_column(col, justify="left" if col in ("system", "setting") else "right")
    if len(index) == 0:
        return t
    idx = index.assign(config=index["run_id"].str.replace(r"-r\d+$", "", regex=True))
    for _, g in idx.groupby("config", sort=False):
        r = g.iloc[0]
        setting = ", ".join(x for x in (r["variant"], r["setting"]) if x and x != "-") or "-"
        t.add_row(r["system"], setting, str(len(g)), f"{g['samples_per_s'].median():,.0f}",
                  f"{g['median_iter_ms'].median():.1f}")
    return t
