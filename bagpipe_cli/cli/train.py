"""`bagpipe train`: train one system and store the run (options: `engine.config.TrainConfig`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bagpipe_cli.cli.common import (
    OutputPath,
    SectionOption,
    check_outputs,
    console,
    data_argument,
    err_console,
    out_option,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.cli.options import SectionedCommand, config_options, given
from bagpipe_cli.engine.config import SHARED_DATA, TrainConfig
from bagpipe_cli.errors import BagpipeError
from bagpipe_cli.files.outputs import FILE, Input


@click.command(cls=SectionedCommand, epilog="Example: bagpipe train data/demo --system bagpipe --model dlrm "
                      "--batch-size 1024 --iterations 200 --lookahead 16 --out results/run1")
@data_argument
@config_options(TrainConfig)
@out_option("run")
@overwrite_option
@click.option("--save-model", type=OutputPath(FILE), default=None, cls=SectionOption,
              section="output", help="Write the dense state_dict and every full embedding table "
                                     "here (torch.save; an existing file only with --overwrite).")
@translate_errors
def train(data: Path, out: Path, overwrite: bool, save_model: Path | None, **kw) -> None:
    """Train one system on DATA and write config.json, metrics.csv and summary.json to --out.

    The loss is the mean over the global batch; dense and embedding gradients of the
    trainers' slices are summed (see README). Bagpipe and sync give identical parameters.
    """
    from bagpipe_cli.data import open_dataset

    if kw["procs"] is not None:
        kw["transport"] = "torch"  # the spawned ranks run with --transport torch
    if kw["checkpoint_every"] and kw["checkpoint_dir"] is None:
        kw["checkpoint_dir"] = str(out.with_name(out.name + ".ckpt"))
    trace = kw["trace"]
    if trace is not None:  # absolute: the report finds it from config.json
        kw["trace"] = os.path.abspath(trace)
    cfg = TrainConfig(data=str(data), **kw)
    _warn_unread(given(kw), cfg.system, cfg.cache_rows)
    try:
        open_dataset(data)  # a DATA that is no dataset is named first
    except BagpipeError as e:
        if cfg.transport == "torch" and cfg.procs is None:  # one rank of a torchrun job
            raise type(e)(f"{e}; {SHARED_DATA}") from None
        raise
    _check_outputs(cfg)  # fail before training, not after
    # The engine (torch) is imported once the options and the paths are known to be good.
    from bagpipe_cli.engine import run

    if cfg.resume is not None and (cfg.transport == "inproc" or cfg.procs is not None):
        _check_resume(cfg)
    with Progress(TextColumn(f"[bold]train {cfg.system}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("[cyan]{task.fields[sps]}"), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn(), console=err_console, disable=not err_console.is_terminal) as bar:
        task = bar.add_task("train", total=cfg.iterations, sps="", loss="")

        def on_iter(b: int, rec: dict) -> None:
            if rec["time"] == rec["time"]:  # not NaN (distributed rank 0 plans, others train)
                bar.update(task, completed=b + 1, loss=f"{rec['loss']:.4f}",
                           sps=f"{cfg.batch_size / max(rec['time'], 1e-9):,.0f} samples/s")
            else:
                bar.update(task, completed=b + 1)

        result = run(cfg, progress=on_iter)
    if result is None:  # a non-zero rank of a torch.distributed job: rank 0 writes the run
        if cfg.master is not None:
            err_console.print(f"this machine's ranks are done; --node-rank 0 (at {cfg.master}) "
                              "writes the run", highlight=False)
        return
    _write_outputs(result, cfg, out, overwrite, save_model)
    console.print(_summary_table(cfg, result.summary, out))
    for w in result.warnings:
        err_console.print(f"[yellow]Warning:[/] {w}", highlight=False, soft_wrap=True)


def _write_outputs(result, cfg: TrainConfig, out: Path, overwrite: bool,
                   save_model: Path | None) -> None:
    """Each output written whole (atomically), the run folder last, so that its presence means
    the run's outputs are complete; a write that fails removes what this command made before,
    and puts back a file it replaced (--overwrite): the earlier one is kept aside until every
    output is written."""
    from bagpipe_cli.data import open_dataset
    from bagpipe_cli.engine import save_model as write_model
    from bagpipe_cli.files.temporaries import kept_aside
    from bagpipe_cli.results import write_run, write_trace

    files = [p for p in (save_model, Path(cfg.trace) if result.trace is not None else None) if p]
    made = [p for p in files if not os.path.lexists(p)]
    try:
        with kept_aside([p for p in files if p not in made]):
            if save_model is not None:
                write_model(result, save_model, [t.name for t in open_dataset(cfg.data).meta.tables])
            if result.trace is not None:
                write_trace(Path(cfg.trace), result.trace)
            write_run(out, result.config, result.metrics, result.summary, overwrite=overwrite,
                      trainer_metrics=result.trainer_metrics, evals=result.evals)
    except BaseException:
        for p in made:
            with contextlib.suppress(OSError):
                p.unlink()
        raise


def _summary_table(cfg: TrainConfig, s: dict, out: Path) -> Table:
    t = Table(title=f"{cfg.system} / {cfg.model} -> {out}", show_header=False)
    # samples/s is --batch-size over the mean iteration (summary.json's definitions): the
    # median beside it differs where some iterations are slow (a round's first, a busy core)
    t.add_row("samples/s (measured iterations)",
              f"{s['samples_per_s']:,.0f} ({cfg.batch_size:,} samples / {s['mean_iter_ms']:.1f} ms "
              "mean iteration)")
    t.add_row("median iteration (p10-p90)", f"{s['median_iter_ms']:.1f} ms "
              f"({s['p10_iter_ms']:.1f}-{s['p90_iter_ms']:.1f})")
    t.add_row("wall", f"{s['wall_s']:.2f} s (training, evaluations left out)")
    t.add_row("time split (median ms)", ", ".join(f"{k} {v:.1f}" for k, v in s["median_time_ms"].items()))
    t.add_row("rows fetched / written back", f"{s['rows_fetched']:,} / {s['rows_written_back']:,}")
    if s["peak_resident_rows"] is not None:
        t.add_row("cache rows (peak)", f"{s['cache_rows']:,} ({s['peak_resident_rows']:,})")
        t.add_row("planner", f"{s['planner_ms_per_batch']:.2f} ms/batch")
    t.add_row("final loss / eval AUC", f"{s['final_loss']:.4f} / {s['eval_auc']:.4f}")
    if s["evaluations"]:
        best = f"{s['best_eval_auc']:.4f}" if s["best_eval_auc"] == s["best_eval_auc"] else "nan"
        t.add_row("evaluations (--eval-every)", f"{s['evaluations']}, best AUC {best}, "
                                                f"{s['eval_s']:.1f} s apart -> metrics_eval.csv")
    if s["target_auc"] is not None:
        reached = (f"{s['time_to_target_s']:.2f} s ({s['iterations_to_target']} iterations)"
                   if s["time_to_target_s"] is not None else "not reached")
        t.add_row(f"time to AUC {s['target_auc']:g}", reached)
    if cfg.trace is not None:
        t.add_row("trace", f"{cfg.trace} (open in ui.perfetto.dev or chrome://tracing)")
    network = {"kernel": f"shaped by the kernel to {cfg.net_gbps} Gbit/s",
               "sleep": "emulated (a sleep per transfer)"}.get(s["network_shaping"], "not emulated")
    t.add_row("network", network)
    if s["checkpoints"]:
        t.add_row("checkpoints", f"{s['checkpoints']} x {s['checkpoint_ms_median']:.1f} ms "
                                 f"({s['checkpoint_overhead_pct']:.1f}% of training) -> {cfg.checkpoint_dir}")
    if s["resumed_from"]:
        t.add_row("resumed from", f"{s['resumed_from']['checkpoint']} (iteration {s['resumed_from']['iteration']})")
    return t


def _warn_unread(options: dict, system: str, cache_rows: int | None) -> None:
    """Warn of each system setting given on the command line that `system` does not read (a
    warning, not an error: one command line run for each of several systems is common)."""
    from bagpipe_cli.engine.config import option_name
    from bagpipe_cli.engine.registry import SYSTEMS, spec

    own = spec(system)
    for name in sorted(own.ignored_settings(cache_rows) & options.keys()):
        readers = [s.name for s in SYSTEMS.values() if name not in s.ignored_settings(cache_rows)]
        why = (f"--system {system} does not read it" if name in own.ignored_settings(None)
               else f"--system {system} with --cache-rows does not read it")
        click.echo(f"Warning: {option_name(name)} {options[name]} is ignored: {why} "
                   f"(read by {', '.join(readers)})", err=True)


def _check_outputs(cfg: TrainConfig) -> None:
    """Every path the run will write, checked before it starts by the one rule
    (`check_outputs`): none replaces or alters an input (the dataset, the checkpoints it
    resumes from), or another output, and each can be written. The checkpoint folder is
    written into (kept) only when the run checkpoints."""
    inputs = [Input("DATA", Path(cfg.data))]
    ckpt = Path(cfg.checkpoint_dir) if cfg.checkpoint_every and cfg.checkpoint_dir else None
    resumed = Path(cfg.resume).resolve() if cfg.resume is not None else None
    if resumed is not None and not (ckpt and (resumed == ckpt.resolve()
                                              or ckpt.resolve() in resumed.parents)):
        inputs.append(Input("--resume", resumed))  # (resuming from the checkpoints it goes on
        #                                           writing is continuing them)
    if ckpt is None and cfg.checkpoint_dir is not None:  # read (--resume's default), not written
        inputs.append(Input("--checkpoint-dir", Path(cfg.checkpoint_dir)))
    # Claimed by the process that writes them: not by another machine's (--node-rank > 0) or
    # another torchrun rank's.
    writes = (cfg.node_rank == 0 if cfg.master is not None else
              os.environ.get("RANK", "0") == "0" if cfg.transport == "torch" and cfg.procs is None
              else True)
    check_outputs(inputs, checkpoint_dir=ckpt, skip=() if ckpt else ("checkpoint_dir",),
                  claim=writes)
    if ckpt is not None:  # one run lineage's checkpoints in a folder: another's are refused
        from bagpipe_cli.engine.records.lineage import checkpoint_lineage

        checkpoint_lineage(ckpt, cfg.resume)


def _check_resume(cfg: TrainConfig) -> None:
    """Fail before training (or spawning ranks) if --resume cannot be used; say which one is used."""
    from bagpipe_cli.data import open_dataset
    from bagpipe_cli.engine.records.checkpoint import (
        check_compatible,
        dataset_identity,
        find_checkpoint,
    )

    ck = find_checkpoint(Path(cfg.resume))
    check_compatible(cfg, ck, dataset_identity(open_dataset(cfg.data)))
    for why in ck.skipped:
        err_console.print(f"[yellow]Warning:[/] skipped a checkpoint: {why}", highlight=False, soft_wrap=True)
    err_console.print(f"resuming from {ck.path} at iteration {ck.iteration}", highlight=False, soft_wrap=True)
