"""TorchRec as an external baseline: same data, batches, dense model and initial weights.

    parent:         starts P trainer processes (the engine's local launcher), relays rank 0's
                    per-iteration progress, kills every child if one fails
    trainer r:      gloo process group; TorchRec's EmbeddingBagCollection sharded by
                    DistributedModelParallel (table-wise, column-wise or data-parallel), our
                    dense model (`build_model`) DDP-wrapped by it; TorchRec's
                    TrainPipelineSparseDist overlaps batch b+1's id distribution with batch b
    rank 0 at end:  gathers every trainer's records and the full tables, evaluates the
                    held-out tail with the engine's `evaluate`, writes the result for the parent

Like for like with the engine (`bagpipe_cli.engine.trainer.loop`):
- data: global batch b = training rows [bB, (b+1)B) (wrapping), trainer r reads rows
  [r B/P, (r+1) B/P) of it, one id per table and sample (a KeyedJaggedTensor, lengths 1);
- model and initial weights: see `torchrec_parts.py`;
- loss and gradients: TorchRec's convention, which gives the engine's gradient: each
  trainer's loss is the mean BCE of its slice of B/P samples; DDP averages the dense (and
  data-parallel table) gradients over the P trainers, and TorchRec's backward all-to-all
  divides the sharded tables' gradients by P too (`comm_ops` gradient division, on by
  default). (1/P) * sum over slices of sum(BCE)/(B/P) = sum(BCE)/B: the gradient of the
  global batch's mean, as the engine computes it. The recorded loss is the mean of the slices';
- optimizer: the tables' optimizer is fused into the backward (`apply_optimizer_in_backward`:
  SGD -> FBGEMM EXACT_SGD, adagrad -> EXACT_ROWWISE_ADAGRAD, eps 1e-8 as ours), the dense
  optimizer is torch's SGD or Adam with the dense learning rate.
With SGD, one process and the same seed its losses equal `--system sync`'s within float
rounding (tests/test_torchrec.py checks one batch exactly and a short 2-process run).

Timing columns (seconds; trainers merged by the engine's rule, `records.merge_records`):
`time` (the whole `pipeline.progress` call), `data` (reading and building the batch the
pipeline loads during this iteration, b+1), `forward` (model forward: embedding lookup,
output all-to-all, dense), `backward` (backward with the fused embedding update and DDP's
all-reduce), `optimizer` (dense step), `sync` (the rest: the pipeline's input distribution
and bookkeeping). Cache columns are 0: TorchRec keeps every table resident on its shard.
The CPU columns are empty (NaN): not measured here.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.records.metrics import (
    COLUMN_NAMES,
    CPU_KEYS,
    TIME_KEYS,
    check_loss,
    complete_summary,
    merge_records,
    role_figures,
    summarize,
)
from bagpipe_cli.engine.records.result import TrainResult, checkpoint_summary, trainer_records
from bagpipe_cli.engine.setup import RunSetup, build_dense, prepare, run_config
from bagpipe_cli.engine.trainer.evaluation import evaluate
from bagpipe_cli.engine.trainer.loop import ProgressFn
from bagpipe_cli.errors import BagpipeError, ConfigError
from bagpipe_cli.external.torchrec_parts import (
    SHARDINGS,
    TimedOptimizer,
    TimedPipeline,
    TorchRecModel,
    build_ebc,
    emb_optimizer_name,
    fuse_embedding_optimizer,
    gather_tables,
    initial_tables,
    load_tables,
    make_batch,
    output_keys,
    quiet,
    require_torchrec,
    sharding_env,
    sharding_plan,
    torchrec_available,
)
from bagpipe_cli.launch.processes import spawn_local

__all__ = ["SHARDINGS", "TorchRecModel", "build_ebc", "initial_tables", "make_batch", "run_torchrec",
           "torchrec_available", "train_torchrec"]


def run_torchrec(cfg: TrainConfig, progress: ProgressFn | None = None) -> TrainResult:
    """The registry's runner of `--system torchrec`: `cfg.trainers` processes, table-wise."""
    return train_torchrec(cfg, progress=progress)


def train_torchrec(cfg: TrainConfig, procs: int | None = None, sharding: str | None = None,
                   progress: ProgressFn | None = None, run_timeout_s: float | None = None) -> TrainResult:
    """Train `cfg`'s settings with TorchRec; a TrainResult.

    procs: trainer processes (default cfg.trainers); sharding: table_wise (default),
    column_wise or data_parallel (with one process every table is local whatever the choice).
    progress(b, record) is called with rank 0's record of each iteration. cfg.timeout_s bounds
    every collective; run_timeout_s (default: none) the whole run.
    """
    require_torchrec()
    sharding = sharding or "table_wise"
    if sharding not in SHARDINGS:
        raise ConfigError(f"--sharding {sharding!r}: choose one of {', '.join(SHARDINGS)}")
    cfg = replace(cfg, system="torchrec", trainers=procs or cfg.trainers, transport="inproc",
                  procs=None)
    if cfg.net_gbps is not None or cfg.net_latency_us:
        raise ConfigError("--system torchrec does not emulate a network (--net-gbps); its "
                          "processes talk over gloo on this machine")
    with tempfile.TemporaryDirectory(prefix="bagpipe-torchrec-") as tmp:
        conf, out = Path(tmp) / "config.json", Path(tmp) / "result.pt"
        conf.write_text(json.dumps(asdict(cfg)))

        def on_line(line: str) -> None:
            if progress and line.startswith("{"):
                msg = json.loads(line)
                progress(msg["iteration"], msg["record"])

        entry = ("import sys; from bagpipe_cli.external.torchrec_run import rank_main; "
                 "sys.exit(rank_main(*sys.argv[1:]))")
        spawn_local([sys.executable, "-c", entry, str(conf), str(out), sharding], cfg.trainers,
                    lambda r: f"torchrec trainer {r} (rank {r})", cfg.timeout_s, on_line, run_timeout_s)
        return torch.load(out, weights_only=False)


def rank_main(conf: str, out: str, sharding: str) -> int:
    """One trainer process; rank 0 writes the TrainResult to `out`."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cfg = TrainConfig(**json.loads(Path(conf).read_text()))
    # The trainers share the machine's cores, as the engine's one process uses them all.
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // world))
    quiet()
    code = 0
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=cfg.timeout_s))
        try:
            _train_rank(prepare(cfg), rank, world, sharding, Path(out))
        finally:
            dist.destroy_process_group()
    except BagpipeError as e:
        print(f"Error: {e}", file=sys.stderr)
        code = e.exit_code
    except BaseException:  # noqa: BLE001 - reported, then the process ends
        traceback.print_exc()
        code = 1
    # Leave without interpreter teardown: TorchRec/fbgemm keep native threads that now and
    # then abort a finished process at exit ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _build(s: RunSetup, sharding: str, world: int):
    """The sharded model (tables loaded with the engine's initial values) and the dense optimizer."""
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    cfg, cards = s.cfg, s.cardinalities
    # Same initial weights as the engine: the dense model from torch's RNG seeded with the
    # run's seed (identical on every rank), the tables from the engine's initialisation.
    dense, _ = build_dense(cfg, s.mcfg)
    tables = initial_tables(cards, s.row_dim, cfg.seed)
    ebc = build_ebc(cards, s.row_dim, tables)
    fuse_embedding_optimizer(ebc, cfg)
    model = TorchRecModel(ebc, dense, len(cards), s.row_dim, 1.0 / (cfg.batch_size // world))
    pg = dist.group.WORLD
    dmp = DistributedModelParallel(model, env=sharding_env(pg), device=torch.device("cpu"),
                                   plan=sharding_plan(model, cards, sharding, world, pg))
    load_tables(dmp, tables)
    model.set_key_order(output_keys(dmp, s.ds, len(cards)))
    dense_params = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    opt = torch.optim.SGD if cfg.dense_optimizer == "sgd" else torch.optim.Adam
    return dmp, opt(dense_params, lr=cfg.dense_learning_rate)


def _train(s: RunSetup, dmp, dense_opt, rank: int, world: int) -> tuple[list[dict], float, str]:
    """Every iteration through TorchRec's pipeline; (this rank's records, seconds, pipeline)."""
    cfg = s.cfg
    B, per = cfg.batch_size, cfg.batch_size // world
    times = dict.fromkeys(TIME_KEYS, 0.0)
    per_epoch = s.train_rows // B

    def batches():
        for b in range(cfg.iterations):
            t = time.perf_counter()
            lo = (b % per_epoch) * B + rank * per
            bt = s.ds.slice(lo, lo + per, b)
            batch = make_batch(bt.dense, bt.sparse, bt.labels)
            times["data"] += time.perf_counter() - t
            yield batch

    def forward(batch):
        t = time.perf_counter()
        out = dmp(batch)
        times["forward"] += time.perf_counter() - t
        return out

    pipe = TimedPipeline(dmp, TimedOptimizer(dense_opt, times), torch.device("cpu"), custom_model_fwd=forward)
    pipe.times = times
    it = batches()
    records: list[dict[str, Any]] = []
    dist.barrier()
    t_start = time.perf_counter()
    for b in range(cfg.iterations):
        for k in times:
            times[k] = 0.0
        t = time.perf_counter()
        loss, _ = pipe.progress(it)
        elapsed = time.perf_counter() - t
        times["sync"] = max(0.0, elapsed - sum(times.values()))  # what the other phases leave
        rec = {**dict.fromkeys(COLUMN_NAMES, 0), **dict.fromkeys(CPU_KEYS, math.nan),  # unmeasured
               "compute_threads": math.nan, "iteration": b, "loss": float(loss),
               "time": elapsed, **times}
        check_loss(rec["loss"], b, cfg)  # a NaN loss stops the run, naming the iteration
        records.append(rec)
        if rank == 0:
            print(json.dumps({"iteration": b, "record": rec}), flush=True)
    wall = time.perf_counter() - t_start
    pipe.detach()
    return records, wall, type(pipe).__mro__[1].__name__


def _train_rank(s: RunSetup, rank: int, world: int, sharding: str, out: Path) -> None:
    require_torchrec()
    dmp, dense_opt = _build(s, sharding, world)
    records, wall, pipeline = _train(s, dmp, dense_opt, rank, world)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, records)
    full = gather_tables(dmp, len(s.cardinalities), s.cardinalities, s.row_dim)
    if rank == 0:
        res = _result(s, everyone, full, dmp.module.dense, wall, sharding, world, pipeline)
        tmp = out.with_name(out.name + ".part")
        torch.save(res, tmp)
        tmp.rename(out)


def _result(s: RunSetup, everyone: list[list[dict]], full: list[torch.Tensor], dense_model,
            wall: float, sharding: str, world: int, pipeline: str) -> TrainResult:
    """Rank 0: the trainers' records merged by the engine's rule, the summary, the tables."""
    import torchrec

    cfg = s.cfg
    unique = [len(np.unique(k)) for k in key_batches(s.ds, cfg, s.train_rows, s.offsets)]
    frames = []
    for recs in everyone:
        f = pd.DataFrame(recs)
        # The global batch's mean loss is the mean of the (equal-sized) slices' means.
        f["loss"] = [sum(r[b]["loss"] for r in everyone) / world for b in range(len(recs))]
        f["unique_rows"] = f["no_sync"] = unique  # rows go to their table's owner, not all-reduced
        frames.append(f)
    metrics = merge_records(frames)
    summary = summarize(metrics, cfg.system, cfg.model, cfg.batch_size, cfg.warmup, wall)
    summary.update(evaluate(dense_model, [torch.cat(full)], s.ds, s.offsets, s.train_rows, s.eval_rows))
    summary.update({
        "planner_ms_per_batch": math.nan, "network_emulated": False, "train_rows": s.train_rows,
        "eval_rows": s.eval_rows, "rows_written_back_at_end": 0, "runner": "torchrec",
        "transport": "torch", "world_size": world, "backend": "gloo",
        "trainer_devices": ["cpu"] * world,
        "roles": {f"trainer{i}": role_figures(f) for i, f in enumerate(frames)},
        **checkpoint_summary(None, None, summary["median_iter_ms"])})
    layout = {"world": world, "servers": 0, "trainers": world, "trainer_devices": ["cpu"] * world,
              "backend": "gloo", "placement": [{"rank": r, "role": "trainer",
                                                "torch_threads": torch.get_num_threads()}
                                               for r in range(world)]}
    config = run_config(s, layout, {
        "name": "torchrec", "launch": "local processes", "sharding": sharding if world > 1 else "local",
        "procs": world, "version": torchrec.__version__, "pipeline": pipeline,
        "torch_threads_per_proc": torch.get_num_threads(),
        "embedding_optimizer": emb_optimizer_name(cfg)})
    return TrainResult(config, metrics, complete_summary(summary), dense_model, full,
                       trainer_records(frames))
