"""`bagpipe train`: train one system with the engine and store the run."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from bagpipe_cli.cli.common import (
    console,
    data_argument,
    err_console,
    out_option,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.engine.systems import SYSTEMS


@click.command(epilog="Example: bagpipe train data/demo --system bagpipe --model dlrm "
                      "--batch-size 1024 --iterations 200 --lookahead 16 --out results/run1")
@data_argument
@click.option("--system", type=click.Choice(SYSTEMS), default="bagpipe", show_default=True,
              help="bagpipe: lookahead cache + prefetch; sync: fetch and write back every iteration; "
                   "lru/lfu: fixed cache, fetch on miss; fae: static hot rows; het: bounded-staleness "
                   "cache; local: all tables on the trainer.")
@click.option("--model", default="dlrm", show_default=True, help="dlrm | wdl | deepfm | dcn.")
@click.option("--batch-size", type=int, default=1024, show_default=True, help="Global batch size.")
@click.option("--iterations", type=int, default=100, show_default=True)
@click.option("--lookahead", type=int, default=16, show_default=True, help="L: batches the oracle looks ahead.")
@click.option("--round", "round_", type=int, default=None, help="C: iterations per prefetch round [default: L/4].")
@click.option("--cache-rows", type=int, default=None, help="Cache rows of bagpipe/lru/lfu/fae [default: bagpipe's peak at --lookahead].")
@click.option("--staleness", type=int, default=0, show_default=True,
              help="het: versions a cached row may lag behind the servers.")
@click.option("--hot-sample", type=float, default=1.0, show_default=True,
              help="fae: fraction of the run's batches profiled to pick the --cache-rows hot rows.")
@click.option("--emb-dim", type=int, default=16, show_default=True)
@click.option("--optimizer", default="sgd", show_default=True, help="Embedding optimizer: sgd | adagrad.")
@click.option("--lr", type=float, default=0.1, show_default=True, help="Embedding learning rate.")
@click.option("--dense-optimizer", default="sgd", show_default=True, help="sgd | adam.")
@click.option("--dense-lr", type=float, default=None, help="Dense learning rate [default: --lr].")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--trainers", type=int, default=1, show_default=True, help="N simulated data-parallel trainers.")
@click.option("--servers", type=int, default=1, show_default=True, help="K embedding server shards.")
@click.option("--net-gbps", type=float, default=None, help="Emulate a network of this bandwidth (Gbit/s).")
@click.option("--net-latency-us", type=float, default=0.0, show_default=True, help="Emulated latency per message.")
@click.option("--eval-rows", type=int, default=None, help="Held-out tail rows for AUC [default: 10%, at most 50k].")
@click.option("--warmup", type=int, default=5, show_default=True, help="Iterations excluded from speed figures.")
@click.option("--transport", type=click.Choice(["inproc", "torch"]), default="inproc", show_default=True,
              help="inproc: threads in one process; torch: this process is one torch.distributed "
                   "rank (launch with torchrun, or use --procs).")
@click.option("--procs", type=int, default=None,
              help="Spawn the ranks locally: 1 oracle + --servers + --trainers processes "
                   "(torch.distributed over loopback).")
@click.option("--threads", type=int, default=None,
              help="torch compute threads [default: torch's; 1 per rank with --transport torch]. "
                   "On a busy machine, fewer than the cores gives steadier timings.")
@click.option("--device", default="cpu", show_default=True,
              help="torch transport: where trainers compute: cpu, cuda (the GPUs of a machine in "
                   "turn) or cuda:K. Embedding servers and the oracle stay on the CPU.")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="torch transport: collectives between trainers (gloo; nccl needs --device cuda "
                   "and a GPU per trainer). Servers are always reached over gloo.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="torch transport: seconds a rank waits for a peer before giving up.")
@click.option("--checkpoint-every", type=int, default=0, show_default=True,
              help="Checkpoint every N iterations (0: never): tables after write-backs, dense model "
                   "and optimizer, iteration, RNG; written atomically.")
@click.option("--checkpoint-dir", type=click.Path(path_type=Path), default=None,
              help="Where checkpoints go (ckpt-NNNNNNNN folders) [default: <--out>.ckpt].")
@click.option("--checkpoint-keep", type=int, default=2, show_default=True,
              help="Newest checkpoints kept.")
@click.option("--resume", type=click.Path(path_type=Path), default=None,
              help="Resume from a checkpoint folder, or the newest good one in a --checkpoint-dir.")
@out_option()
@overwrite_option
@click.option("--save-model", type=click.Path(path_type=Path), default=None,
              help="Write the dense state_dict and every full embedding table here (torch.save).")
@translate_errors
def train(data: Path, out: Path, overwrite: bool, save_model: Path | None, round_: int | None, **kw) -> None:
    """Train one system on DATA and write config.json, metrics.csv and summary.json to --out.

    The loss is the mean over the global batch; dense and embedding gradients of the
    trainers' slices are summed (see README). Bagpipe and sync give identical parameters.
    """
    from bagpipe_cli.engine import TrainConfig
    from bagpipe_cli.engine import save_model as save
    from bagpipe_cli.engine import train as run
    from bagpipe_cli.io import check_output_dir
    from bagpipe_cli.results import write_run

    procs = kw.pop("procs")
    if procs is not None:
        kw["transport"] = "torch"  # the spawned ranks run with --transport torch
    if kw["checkpoint_every"] and kw["checkpoint_dir"] is None:
        kw["checkpoint_dir"] = out.with_name(out.name + ".ckpt")
    for key in ("checkpoint_dir", "resume"):
        kw[key] = str(kw[key]) if kw[key] is not None else None
    cfg = TrainConfig(data=str(data), round=round_, **kw)
    check_output_dir(out, overwrite)  # fail before training, not after
    if cfg.resume is not None and (cfg.transport == "inproc" or procs is not None):
        _check_resume(cfg)
    if procs is not None:  # the ranks as local processes; rank 0's result comes back here
        from bagpipe_cli.engine.distributed import spawn_train

        _check_procs(cfg, procs)
        run = spawn_train
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
        return
    write_run(out, result.config, result.metrics, result.summary, overwrite=overwrite)
    if save_model is not None:
        from bagpipe_cli.data import open_dataset

        save(result, save_model, [t.name for t in open_dataset(data).meta.tables])
    s = result.summary
    t = Table(title=f"{cfg.system} / {cfg.model} -> {out}", show_header=False)
    t.add_row("samples/s (measured iterations)", f"{s['samples_per_s']:,.0f}")
    t.add_row("median iteration", f"{s['median_iter_ms']:.1f} ms")
    t.add_row("time split (median ms)", ", ".join(f"{k} {v:.1f}" for k, v in s["median_time_ms"].items()))
    t.add_row("rows fetched / written back", f"{s['rows_fetched']:,} / {s['rows_written_back']:,}")
    if s["peak_resident_rows"] is not None:
        t.add_row("cache rows (peak)", f"{s['cache_rows']:,} ({s['peak_resident_rows']:,})")
        t.add_row("oracle", f"{s['oracle_ms_per_batch']:.2f} ms/batch")
    t.add_row("final loss / eval AUC", f"{s['final_loss']:.4f} / {s['eval_auc']:.4f}")
    t.add_row("network", "emulated" if s["network_emulated"] else "not emulated")
    if s.get("checkpoints"):
        t.add_row("checkpoints", f"{s['checkpoints']} x {s['checkpoint_ms_median']:.1f} ms "
                                 f"({s['checkpoint_overhead_pct']:.1f}% of training) -> {cfg.checkpoint_dir}")
    if s.get("resumed_from"):
        t.add_row("resumed from", f"{s['resumed_from']['checkpoint']} (iteration {s['resumed_from']['iteration']})")
    console.print(t)


def _check_resume(cfg) -> None:
    """Fail before training (or spawning ranks) if --resume cannot be used; say which one is used."""
    from bagpipe_cli.data import open_dataset
    from bagpipe_cli.engine.checkpoint import check_compatible, dataset_identity, find_checkpoint

    ds = open_dataset(cfg.data)
    ck = find_checkpoint(Path(cfg.resume))
    check_compatible(cfg, ck, dataset_identity(ds))
    for why in ck.skipped:
        err_console.print(f"[yellow]Warning:[/] skipped a checkpoint: {why}", highlight=False, soft_wrap=True)
    err_console.print(f"resuming from {ck.path} at iteration {ck.iteration}", highlight=False, soft_wrap=True)


def _check_procs(cfg, procs: int) -> None:
    from bagpipe_cli.engine.distributed import Layout
    from bagpipe_cli.errors import ConfigError

    layout = Layout(cfg.servers, cfg.trainers)
    if procs != layout.world:
        raise ConfigError(f"--procs {procs}: a run with --servers {cfg.servers} and --trainers "
                          f"{cfg.trainers} needs 1 + {cfg.servers} + {cfg.trainers} = {layout.world} processes")
