"""`bagpipe advise`: one answer for the user's own cluster (the library: `bagpipe_cli/advise/`)."""

from __future__ import annotations

from pathlib import Path

import click

from bagpipe_cli.cli.common import (
    InputPath,
    OutputPath,
    StageBars,
    check_outputs,
    console,
    data_argument,
    list_option,
    out_option,
    overwrite_option,
    translate_errors,
)
from bagpipe_cli.files.outputs import Input
from bagpipe_cli.model_names import MODEL_NAMES

EPILOG = """\b
Examples:
  bagpipe advise data/demo --trainers 16 --net-gbps 25 --out results/advice
  bagpipe advise data/movielens --trainers 8 --net-gbps 10 --scale 100 --out results/advice-x100
"""


@click.command(epilog=EPILOG)
@data_argument
@click.option("--trainers", type=click.IntRange(1), required=True, help="Trainers of your cluster (N).")
@click.option("--net-gbps", type=click.FloatRange(min=0, min_open=True), required=True,
              help="Your network's bandwidth per link, Gbit/s.")
@click.option("--cluster", type=InputPath(), default=None,
              help="A cluster file (benchmarks/paper-scenario.yaml) for the rest of the cluster: "
                   "servers, latency, trainers' links; --trainers and --net-gbps override it.")
@click.option("--scale", type=click.IntRange(1), default=1, show_default=True,
              help="Ask about the log K times larger: every table K times the rows, the same "
                   "skew, K times the samples (written once to --scaled-data).")
@click.option("--scaled-data", type=OutputPath("dataset"), default=None,
              help="Where --scale's dataset goes, or is reused from when it holds DATA at the "
                   "same --scale [default: results/datasets/NAME-xK].")
@click.option("--systems", default="simulated", show_default=True,
              help="Systems to compare, comma-separated, or a group (`bagpipe systems`).")
@click.option("--batch-size", type=click.IntRange(1), default=None,
              help="Global batch [default: 2,048 samples a trainer].")
@click.option("--model", type=click.Choice(MODEL_NAMES), default="dlrm", show_default=True,
              help="Dense model.")
@click.option("--emb-dim", type=click.IntRange(1), default=16, show_default=True,
              help="Embedding dimension E.")
@click.option("--lookahead", type=click.IntRange(1), default=16, show_default=True,
              help="Bagpipe's lookahead L.")
@click.option("--iterations", type=click.IntRange(2), default=24, show_default=True,
              help="Iterations of each measuring run.")
@click.option("--warmup", type=click.IntRange(0), default=6, show_default=True,
              help="Of those, left out of the measurements.")
@out_option("advice", help="Write advice.json, advice.md, bench/ and simulation/ here (atomically).")
@overwrite_option
@translate_errors
def advise(data: Path, trainers: int, net_gbps: float, cluster: Path | None, scale: int,
           scaled_data: Path | None, systems: str, batch_size: int | None, model: str,
           emb_dim: int, lookahead: int, iterations: int, warmup: int, out: Path,
           overwrite: bool) -> None:
    """Answer which system trains fastest on your cluster: measure, model, validate, verdict.

    Runs every system briefly on DATA (one trainer computing a trainer's share of the batch,
    one torch thread), calibrates `bagpipe simulate` from those runs at --trainers and
    --net-gbps, checks the model against the same runs, and prints one verdict: the fastest
    system, its margin over the best other and over sync, the confidence (the share of runs
    the model predicts within 20%), why (where the winner's and sync's iterations go) and
    where the answer changes with the number of trainers or the network. Writes
    advice.json, advice.md (with the speed-up against trainers), the runs (bench/) and the
    model's output (simulation/) to --out.
    """
    from bagpipe_cli.advise import AdviseConfig, reusable, run_advise, scaled_path
    from bagpipe_cli.advise.page import write_advice
    from bagpipe_cli.files.atomic import atomic_dir

    cfg = AdviseConfig(data=str(data), trainers=trainers, net_gbps=net_gbps,
                       cluster=str(cluster) if cluster else None, scale=scale,
                       scaled_data=str(scaled_data) if scaled_data else None,
                       systems=tuple(list_option(systems, str, "--systems") or ()),
                       batch_size=batch_size, iterations=iterations, warmup=warmup,
                       model=model, emb_dim=emb_dim, lookahead=lookahead)
    inputs = [Input("DATA", data)] + ([Input("--cluster", cluster)] if cluster else [])
    reuse = reusable(cfg) if scale > 1 else None
    if reuse is not None:  # DATA at --scale, written by an earlier advise: read, not written
        check_outputs([*inputs, Input("--scaled-data", reuse)], skip=("scaled_data",))
    else:
        check_outputs(inputs, scaled_data=scaled_path(cfg) if scale > 1 else scaled_data)
    with atomic_dir(out, overwrite) as tmp, StageBars(absolute=True, width=40) as steps:
        advice = run_advise(cfg, tmp, steps, overwrite)
        write_advice(advice, tmp)
    for line in advice.verdict.lines:
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"wrote {out}/advice.json, advice.md, simulation/ and bench/", highlight=False)
