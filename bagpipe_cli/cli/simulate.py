"""`bagpipe simulate`: predicted iteration times and speed-ups on a cluster (the performance model)."""

from __future__ import annotations

import math
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
from bagpipe_cli.engine.registry import role
from bagpipe_cli.io import atomic_dir
from bagpipe_cli.outputs import Input
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
    cfg, cl = result.config, result.config.cluster
    net = f"{cl.net_gbps:g} Gbit/s" if cl.net_gbps else "infinite bandwidth"
    if cl.trainer_gbps:
        net += f" (trainers {cl.trainer_gbps:g} Gbit/s)"
    title = (f"{cfg.name}: {cl.trainers} trainers, {cl.servers} servers, {net}, "
             f"{cl.net_latency_us:g} us, {cfg.runtime}; batch {cfg.batch_size:,}, L={cfg.lookahead}, "
             f"{result.trace['iterations']:,} iterations traced")
    tab = Table(title=title, caption="ms per iteration, means after warm-up; fetch, sync, plan: "
                "exposed waits (plan: for rank 0 or the plans' relay); iter = compute + fetch + sync "
                "+ plan; vs sync: speed-up of the mean; rank 0: its planning + sending per "
                "iteration, and the plan MB it sends")
    for col in ["system", "compute", "fetch", "sync", "plan", "iter", "median", "vs sync",
                "rank 0", "MB/iter", "fetched/iter"]:
        tab.add_column(col, justify="left" if col == "system" else "right")
    for p in result.predictions:
        v = result.volumes[p.system]
        tab.add_row(p.system, f"{p.compute_ms:.2f}", f"{p.exposed_fetch_ms:.2f}",
                    f"{p.exposed_sync_ms:.2f}", f"{p.exposed_plan_ms:.2f}", f"{p.mean_ms:.2f}",
                    f"{p.median_ms:.2f}",
                    f"{p.speedup:.2f}x" if math.isfinite(p.speedup) else "-",
                    f"{p.planner_ms_per_iter:.2f}",
                    f"{p.planner_mb_per_iter:.3f}", f"{v['rows_fetched']:,.0f}")
    console.print(tab)
    _print_calibration(result)
    ref = next((p for p in result.predictions if role(p.system) == "reference"), None)
    if ref is not None and ref.mean_ms > 0:
        share = (ref.exposed_fetch_ms + ref.exposed_sync_ms) / ref.mean_ms
        note = cfg.reported.get("embedding_share") if cfg.reported else None
        console.print(f"{ref.system} waits for embedding rows and synchronisation {share:.0%} of its "
                      f"iteration" + (f" (reported: {note})" if note else ""))
    _print_comparison(result)
    line = _fastest_line(result.predictions)
    if line:
        console.print(line, highlight=False)


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


def _print_comparison(result) -> None:
    """bagpipe's predicted speed-up over every other system simulated (the bound `local`
    included), next to the published figures where the scenario has them."""
    bag = next((p for p in result.predictions if role(p.system) == "ours"), None)
    if bag is None:
        return
    rep = result.config.reported or {}
    t = Table(title="predicted speed-up of bagpipe over each other system"
              + (f" (reported: {rep.get('source', 'published')})" if rep else ""),
              caption="its mean iteration / bagpipe's (below 1x: faster than bagpipe)")
    t.add_column("system")
    t.add_column("bagpipe speed-up", justify="right")
    if rep:
        t.add_column("reported", justify="right")
    for p in result.predictions:
        if p is bag:
            continue
        row = [p.system, _ratio(p.mean_ms, bag.mean_ms)]
        if rep:
            per = rep.get("speedup") or {}
            # "up to" a paper's best is over its baselines, not over the bound
            best = "-" if role(p.system) == "bound" else f"up to {rep.get('speedup_max', '?')}x"
            row.append(str(per.get(p.system, best) if isinstance(per, dict) else per))
        t.add_row(*row)
    console.print(t)


def _ratio(slow_ms: float, fast_ms: float) -> str:
    r = slow_ms / fast_ms if fast_ms > 0 else math.nan
    return f"{r:.2f}x" if math.isfinite(r) else "-"


def _fastest_line(preds) -> str:
    """In words: the fastest system (mean iteration time) and its speed-up over the next
    fastest (the best other) and over the reference (sync) where simulated; "" for fewer
    than two systems."""
    ok = sorted((p for p in preds if math.isfinite(p.mean_ms)), key=lambda p: p.mean_ms)
    if len(ok) < 2:
        return ""
    best, runner = ok[0], ok[1]
    line = (f"fastest: {best.system}, {_ratio(runner.mean_ms, best.mean_ms)} over "
            f"{runner.system} (the best other)")
    ref = next((p for p in ok[2:] if role(p.system) == "reference"), None)
    if ref is not None:
        line += f", {_ratio(ref.mean_ms, best.mean_ms)} over {ref.system}"
    return line


def _validation_table(rows) -> Table:
    """Each run's predicted and measured time, and its byte counts' errors."""
    from bagpipe_cli.simulate.validate import BYTE_CHECKS, BYTES_TOLERANCE, TOLERANCE

    tab = Table(title=f"model vs measured median iteration time ({len(rows)} runs; "
                      f"within ±{TOLERANCE:.0%} passes) and counted bytes (±{BYTES_TOLERANCE:.0%})",
                caption="ms per iteration; compute: calibrated from the run's own timers; bytes per "
                        "iteration, predicted / counted - 1: rank 0's plans, the servers' rows, the "
                        "trainers' collectives (the worst trainer's); -: not counted")
    for col in ["system", "setting", "compute", "predicted", "measured", "error", "",
                "rank 0", "rows", "collective"]:
        tab.add_column(col, justify="left" if col in ("system", "setting") else "right")
    for r in rows:
        d = r.to_dict()
        marks = []
        for kind in BYTE_CHECKS:
            c = r.check(kind)
            marks.append("-" if c.ok is None else f"{100 * c.error:+.1f}%" + ("" if c.ok else " [red]OUT[/red]"))
        tab.add_row(d["system"], d["setting"], f"{d['compute_ms']:.2f}",
                    f"{d['predicted_ms']:.2f}", f"{d['measured_ms']:.2f}", f"{100 * d['error']:+.1f}%",
                    "ok" if r.ok else "[red]OUT[/red]", *marks)
    return tab


def _validate(paths: tuple[Path, ...], out: Path | None, overwrite: bool) -> None:
    from collections import Counter

    from bagpipe_cli.simulate.validate import (
        BYTE_CHECKS,
        BYTES_TOLERANCE,
        TOLERANCE,
        validate,
        validation_frame,
    )

    check_outputs([Input("--validate", p) for p in paths])
    with err_console.status("validating") as status:
        result = validate(*paths, progress=lambda i, n, r: status.update(f"[{i + 1}/{n}] {r}"))
    warn_skipped(result.skipped)
    if result.unmodelled:
        from bagpipe_cli.simulate.model import SYSTEMS

        err_console.print("note: left out " + ", ".join(f"{n} {s} run(s)" for s, n in result.unmodelled.items())
                          + f": simulate has no model of their traffic (it models {', '.join(SYSTEMS)})",
                          highlight=False, soft_wrap=True)
    rows = result.rows
    console.print(_validation_table(rows))
    n_ok = sum(r.ok for r in rows)
    by_sys: dict[str, list[bool]] = {}
    for r in rows:
        by_sys.setdefault(r.run.system, []).append(r.ok)
    console.print(f"{n_ok} of {len(rows)} runs within ±{TOLERANCE:.0%}; by system: "
                  + ", ".join(f"{s} {sum(v)}/{len(v)}" for s, v in by_sys.items()))
    names = {"plan": "rank 0's plan bytes", "rows": "the servers' row bytes",
             "collective": "each trainer's collective bytes"}
    for kind in BYTE_CHECKS:
        checks = [r.check(kind) for r in rows]
        checked = [c for c in checks if c.ok is not None]
        if checked:
            console.print(f"{names[kind]}: {sum(c.ok for c in checked)} of {len(checked)} "
                          f"distributed runs within ±{BYTES_TOLERANCE:.0%}")
        for why, n in Counter(c.why for c in checks if c.ok is None).items():
            console.print(f"{names[kind]} not checked for {n} run(s): {why}")
    missing = [r.run.run_id for r in rows if r.run.network_emulated and r.run.fetch_cpu_from.startswith("none")]
    if missing:
        console.print(f"note: {len(missing)} emulated-network run(s) have no no-network twin; their "
                      "fetch CPU is taken as 0")
    if out is not None:
        with atomic_dir(out, overwrite) as tmp:
            validation_frame(rows).to_csv(tmp / "validate.csv", index=False)
        console.print(f"wrote {out}/validate.csv")

