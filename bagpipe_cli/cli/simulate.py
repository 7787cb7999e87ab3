"""`bagpipe simulate`: predicted iteration times and speed-ups on a cluster (the performance model)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from bagpipe_cli.cli.common import (
    InputPath,
    SectionOption,
    check_outputs,
    console,
    err_console,
    format_si,
    out_option,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.cli.options import SectionedCommand, config_options, given
from bagpipe_cli.cli.report import warn_skipped
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.files.outputs import Input
from bagpipe_cli.simulate.cluster import SimulateConfig, load_cluster

EPILOG = """\b
Examples:
  bagpipe simulate data/demo --trainers 8 --net-gbps 25 --net-latency-us 10 --compute-ms 5 \\
      --batch-size 16384 --lookahead 200 --out results/sim
  bagpipe simulate results/profile-demo --calibrate results/bench-demo --trainers 4 --net-gbps 10
  bagpipe simulate --cluster benchmarks/paper-scenario.yaml --out results/paper-scenario
  bagpipe simulate --validate results/bench-demo     # model vs every run `make demo` measured
"""


@click.command(cls=SectionedCommand, epilog=EPILOG)
@click.argument("source", required=False, type=InputPath())
@click.option("--cluster", "cluster_file", type=InputPath(), cls=SectionOption,
              section="cluster and network",
              help="Cluster/scenario YAML file of these settings (see benchmarks/paper-scenario.yaml); "
                   "options given here override it.")
@click.option("--validate", "validate_paths", multiple=True, type=InputPath(),
              help="Instead of predicting: compare the model with every run under RESULTS "
                   "(run or bench folders; repeatable).")
@config_options(SimulateConfig)
@out_option("simulation", required=False,
            help="Write simulate.json, CSVs and plots here (atomically).")
@overwrite_option
@translate_errors
def simulate(source: Path | None, cluster_file: Path | None, validate_paths: tuple[Path, ...],
             out: Path | None, overwrite: bool, **kw) -> None:
    """Predict iteration times and speed-ups of every system on a cluster from SOURCE's trace.

    SOURCE is a dataset or a `bagpipe profile` output folder (whose batch size and first
    lookahead are the defaults). Communication volumes per iteration come from the engine's
    own plans over the batches `bagpipe train` would read; the model overlaps them with the
    compute as each system's pipeline allows (docs/performance-model.md). The defaults are
    `bagpipe train`'s.
    """
    options = given(kw)
    if validate_paths:
        if source or cluster_file or options:
            raise click.UsageError("--validate takes every setting from the runs: drop SOURCE, "
                                   "--cluster and the other options")
        _validate(validate_paths, out, overwrite)
        return
    cf = load_cluster(cluster_file) if cluster_file else None
    check_outputs(_inputs(source, cluster_file, cf, options))
    from bagpipe_cli.simulate import build_config, run_simulate, write_simulation

    cfg = build_config(str(source) if source else None, cf, lambda m: err_console.print(m), **options)
    with _Bar() as bar:
        result = run_simulate(cfg, bar)
    _print_result(result)
    if out is not None:
        write_simulation(result, out, overwrite)
        console.print(f"wrote {out}/simulate.json, predictions.csv, sweep.csv, "
                      "speedup_vs_trainers.png, speedup_vs_bandwidth.png")


class _Bar:
    """A rich bar over the system traces that take a simulation's time (M/N), with the
    batches read and their rate; silent when stderr is not a terminal."""

    def __enter__(self):
        self.progress = Progress(
            TextColumn("[bold]{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("traces"), TextColumn("[cyan]{task.fields[rate]}"), TimeElapsedColumn(),
            TimeRemainingColumn(), console=err_console, disable=not err_console.is_terminal)
        self.progress.__enter__()
        self.task = self.progress.add_task("simulating", total=None, rate="")
        self.t0 = time.perf_counter()
        return self

    def __call__(self, p) -> None:
        spent = time.perf_counter() - self.t0
        rate = f"{p.batches:,} batches, {format_si(p.batches / spent)} batches/s" if spent > 0 else ""
        self.progress.update(self.task, description=p.stage, completed=p.traces_done,
                             total=p.traces_total, rate=rate)

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)


def _inputs(source: Path | None, cluster_file: Path | None, cf, options: dict) -> list[Input]:
    """What a prediction reads: SOURCE, the cluster file and its dataset, --calibrate's runs."""
    inputs = [Input("--calibrate", Path(p)) for p in options.get("calibrate") or ()]
    if source is not None:
        inputs.append(Input("SOURCE", source))
    if cluster_file is not None:
        inputs.append(Input("--cluster", cluster_file))
    for key in ("data", "calibrate"):
        value = cf.settings.get(key) if cf is not None else None
        for p in (value,) if isinstance(value, str) else value or ():
            inputs.append(Input(f"--cluster's {key}", Path(p)))
    return inputs


def _print_result(result) -> None:
    from bagpipe_cli.simulate.compare import (
        embedding_wait_line,
        fastest_line,
        prediction_table,
        speedup_table,
    )

    console.print(_table(prediction_table(result)))
    _print_calibration(result)
    preds, reported = result.predictions, result.config.reported
    line = embedding_wait_line(preds, reported)
    if line:
        console.print(line)
    table = speedup_table(preds, reported)
    if table is not None:
        console.print(_table(table))
    line = fastest_line(preds)
    if line:
        console.print(line, highlight=False)


def _table(t) -> Table:
    """A rich table of a `TextTable`; a mark outside a tolerance ("OUT", "+12.0% OUT") has
    OUT in red."""
    tab = Table(title=t.title, caption=t.caption)
    for col in t.columns:
        # a count of megabytes a word a line ("server\nrows\nMB"): its words kept whole
        head = col.replace(" ", "\n") if col.endswith(" MB") else col
        tab.add_column(head, justify="left" if col in t.left else "right",
                       min_width=max(map(len, head.splitlines())) if "\n" in head else None)
    for row in t.rows:
        cells = [Text(c) for c in row]
        for c in cells:
            if c.plain == "OUT" or c.plain.endswith("% OUT"):
                c.stylize("red", len(c.plain) - 3)
        tab.add_row(*cells)
    return tab


def _print_calibration(result) -> None:
    """Where the compute came from: the runs, the one forward+backward every system uses (and
    each system's own, measured), and `Warning:` lines on stderr where they disagree."""
    src, cfg = result.compute_source, result.config
    if src.get("kind") != "calibrated":
        return
    console.print(f"compute calibrated from {src['runs']} run(s) at batch {src['batch_size']:,} "
                  f"(x{src['scale']:.3g} for {cfg.batch_size // cfg.cluster.trainers:,} samples "
                  "per trainer)", highlight=False)
    fb = src.get("fwd_bwd") or {}
    if fb.get("systems"):
        mine = ", ".join(f"{s} {fb['measured_ms'][s]:.2f}" for s in fb["systems"])
        own = "".join(f"; {s} its own, {fb['measured_ms'][s]:.2f} ms ({why})"
                      for s, why in fb.get("own", {}).items() if s in cfg.systems)
        console.print(f"forward+backward measured once: {fb['ms']:.2f} ms at batch "
                      f"{src['batch_size']:,}, the median over the runs (each system's: {mine} "
                      f"ms), for every system{own}", highlight=False, soft_wrap=True)
    for w in src.get("warnings", []):
        err_console.print(f"[yellow]Warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    warn_skipped(src.get("skipped", []))


def _validate(paths: tuple[Path, ...], out: Path | None, overwrite: bool) -> None:
    from bagpipe_cli.simulate.validate import (
        summary_lines,
        unmodelled_note,
        validate,
        validation_frame,
        validation_table,
    )

    check_outputs([Input("--validate", p) for p in paths])
    with err_console.status("validating") as status:
        result = validate(*paths, progress=lambda i, n, r: status.update(f"[{i + 1}/{n}] {r}"))
    warn_skipped(result.skipped)
    note = unmodelled_note(result.unmodelled)
    if note:
        err_console.print(note, highlight=False, soft_wrap=True)
    console.print(_table(validation_table(result.rows)))
    for line in summary_lines(result.rows):
        console.print(line)
    if out is not None:
        with atomic_dir(out, overwrite) as tmp:
            validation_frame(result.rows).to_csv(tmp / "validate.csv", index=False)
        console.print(f"wrote {out}/validate.csv")
