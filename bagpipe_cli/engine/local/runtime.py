"""The in-process runtime: N logical trainers in one process over a local collective.

    planner thread:  read batch b+L (with --loader-workers threads reading and indexing
                     batches ahead), plan it (local/planner.py) -> bounded queue of rounds
    main thread:     the training loop (engine/trainer/loop.py) for every trainer: their slices'
                     forward/backward in trainer order, the sums already complete, on the
                     trainers' device (--device); it and torch's threads on the compute
                     cores, the other threads on the reserved ones (launch/placement.py)
    server workers:  one thread per embedding server, requests in FIFO order, the emulated
                     network held there (local/server.py)
    checkpoints:     at the boundary before iteration b (main thread): pending work lands,
                     the servers' tables with the cache's resident rows over them are written
                     with the dense state; training goes on with the same cache
    evaluations:     --eval-every, at the same boundaries and from the same true tables (timed
                     apart); --trace records every thread on one clock
    the result:      this process's `TrainerReport` and the servers' figures in a
                     `RunRecord` (engine/records/run_record.py), as rank 0 of a distributed
                     run makes it; every role's traffic counted as the distributed runtime
                     counts it (engine/comm/traffic.py)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bagpipe_cli.engine.comm.collective import count_collective
from bagpipe_cli.engine.comm.shards import Shard, init_shards, shards_from_tables
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.distributed.rounds import PlanWire
from bagpipe_cli.engine.local.collective import LocalCollective
from bagpipe_cli.engine.local.planner import LocalPlanner
from bagpipe_cli.engine.local.transport import LocalTransport
from bagpipe_cli.engine.planning.builders import Planning
from bagpipe_cli.engine.planning.feed import MAX_LOADER_WORKERS, batch_stream, planned_rounds
from bagpipe_cli.engine.records.checkpoint import Checkpointer, dataset_identity, full_tables
from bagpipe_cli.engine.records.result import TrainResult, finish_run
from bagpipe_cli.engine.records.resume_checks import streams
from bagpipe_cli.engine.records.run_record import RunLayout, RunRecord, TrainerReport
from bagpipe_cli.engine.records.trace import (
    NO_TRACE,
    PLANNER,
    NoTracer,
    Tracer,
    trace_document,
    trace_meta,
    traced,
    trainer_role,
)
from bagpipe_cli.engine.setup import (
    RunSetup,
    build_dense,
    open_resume,
    prepare,
    restore_dense,
)
from bagpipe_cli.engine.systems import SystemParts
from bagpipe_cli.engine.trainer.device import computing_on, cuda_count, describe, pick, to_cpu
from bagpipe_cli.engine.trainer.evaluation import eval_point
from bagpipe_cli.engine.trainer.loop import Hook, ProgressFn, TrainingLoop
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet
from bagpipe_cli.launch.contention import LOADED, ContentionMeter, machine_load
from bagpipe_cli.launch.placement import Pinned, Placement, available_cores, plan_in_process
from bagpipe_cli.models import build_model

STEP_SAMPLES = 128  # the trainers' step is timed on this many samples (`feed_need`)


def train_in_process(cfg: TrainConfig, progress: ProgressFn | None = None) -> TrainResult:
    """Run `cfg` in this process and return its metrics, summary and final parameters."""
    device = pick(cfg.device, cuda_count())
    s = prepare(cfg)
    cores = available_cores()
    load = machine_load(len(cores)) if cfg.placement == "auto" else None
    busy = load is not None and load >= LOADED["load_per_core"]
    need = feed_need(s, len(cores)) if cfg.placement == "auto" and device == "cpu" and not busy \
        else None
    pinned = Pinned(plan_in_process(cfg.placement, cfg.threads, cores, device != "cpu", need,
                                    load=load))
    with pinned as placement, computing_on(device, not cfg.nondeterministic) as dev:
        return _train(s, pinned, placement, dev, progress)


def feed_need(s: RunSetup, cores: int) -> float | None:
    """The cores the feed needs to keep up with the trainers on `cores` CPU cores: its seconds
    to read and index a batch (one thread; the faster of the run's last two batches) over the
    trainers' seconds to compute one (a forward and backward of the dense model, torch on
    every core, timed on up to STEP_SAMPLES samples and scaled to the global batch). None on
    one core (nothing to split)."""
    if cores < 2:
        return None
    cfg = s.cfg
    stream = batch_stream(s.ds, cfg, s.train_rows, s.offsets, max(0, cfg.iterations - 2))
    read, batch = float("inf"), None
    while True:  # the first read also sets up the reader's key tables: the second is timed
        t = time.perf_counter()
        got = next(stream, None)
        if got is None:
            break
        read, batch = min(read, time.perf_counter() - t), got
    n = min(len(batch.labels), STEP_SAMPLES)
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(s.mcfg)
            dense, labels = torch.from_numpy(batch.dense[:n]), torch.from_numpy(batch.labels[:n])
            emb = torch.randn(n, s.ds.meta.num_tables, s.row_dim)
            for k in (1, n):  # a warm-up on one sample, then the timed step
                t = time.perf_counter()
                e = emb[:k].clone().requires_grad_()
                F.binary_cross_entropy_with_logits(model(dense[:k], e), labels[:k]).backward()
            step = (time.perf_counter() - t) * len(batch.labels) / n
    finally:
        torch.set_num_threads(threads)
    return read / step


def _train(s: RunSetup, pinned: Pinned, placement: Placement, device: torch.device,
           progress: ProgressFn | None) -> TrainResult:
    cfg = s.cfg
    s.feed_cores = len(placement.helpers) if placement.policy != "off" else None
    ck = open_resume(s)
    start = ck.iteration if ck else 0
    model, dense_opt = build_dense(cfg, s.mcfg, device)
    if ck is None:
        servers = init_shards(s.cardinalities, s.row_dim, cfg.servers, cfg.seed, s.rowopt.init_state)
    else:  # the checkpoint's true parameters (a cache's rows are fetched from them)
        servers = shards_from_tables(ck.weight, ck.state, cfg.servers)
        restore_dense(model, dense_opt, ck.dense, ck.dense_optimizer, ck.rng)
    tracer = Tracer() if cfg.trace else NO_TRACE
    role = trainer_role(0, cfg.trainers)
    tracer.name_thread(role, "main")
    transport = LocalTransport(servers, s.network, on_start=pinned.helper, tracer=tracer)
    with tracer.span("planning pass", "planning", track=(PLANNER, "planner")):
        planning = s.spec.plan(s, start)
    trainers = TrainerSet.everyone(cfg.trainers)
    system = s.spec.build_system(SystemParts(s, planning.slots, transport, trainers,
                                                    torch.device(device), servers))
    collective = LocalCollective(cfg.trainers, s.network, cfg.collective, on_start=pinned.helper,
                                 tracer=tracer, track=(role, "collectives"))
    ckpt = Checkpointer(cfg, dataset_identity(s.ds), start) if cfg.checkpoint_every else None
    prior = streams(ck.metrics, 1)[0] if ck else []  # (a --procs run's, merged)
    evals: list[dict[str, Any]] = []
    loop = TrainingLoop(cfg, model, dense_opt, system, s.rowopt, traced(collective, tracer),
                        trainers, start, device,
                        checkpoint=_checkpoint(ckpt, servers, prior) if ckpt else None,
                        progress=progress, evaluate=_evaluator(s, servers, evals), tracer=tracer)
    feed = _planner(s, planning, start, placement, pinned, tracer, transport)
    meter = ContentionMeter(len(set(placement.compute) | set(placement.helpers)))
    t_start = time.perf_counter()
    try:
        records = loop.run(feed)
        system.flush()
    finally:
        feed.close()
        transport.close()
        collective.close()
        if ckpt is not None:
            ckpt.close()
    wall = time.perf_counter() - t_start - loop.eval_s
    report = TrainerReport(
        records, str(device), describe(device), transport.bytes_sent, transport.bytes_received,
        count_collective(collective, transport.traffic), transport.traffic,
        system.written_back_at_end, peak_resident_rows=system.peak_held)
    layout = RunLayout(world=1, servers=cfg.servers, trainers=cfg.trainers,
                       trainer_devices=[str(device)] * cfg.trainers, devices=[report.device_info],
                       backend=None, placement=[placement.to_json()])
    parts = [tracer.export()]
    trace = trace_document(parts, trace_meta(cfg, "in-process: one clock", parts)) \
        if tracer.enabled else None
    return finish_run(RunRecord(
        s, planning, [report], [prior], wall, model.cpu(), servers, layout, runner="inproc",
        transport="inproc", roles=_roles(planning, feed, report, transport, collective),
        contention=meter.figures(), checkpointer=ckpt, resumed=ck, evals=evals,
        eval_s=loop.eval_s, trace=trace))


def _planner(s: RunSetup, planning: Planning, start: int, placement: Placement, pinned: Pinned,
             tracer: NoTracer, transport: LocalTransport) -> LocalPlanner:
    """The planner thread, its plans counted as rank 0 sends them and the trainers receive
    them (each its own, or every trainer the one plan down the relay tree)."""
    cfg, wire = s.cfg, PlanWire.of(s, planning.slots is not None)
    rounds = planned_rounds(s.ds, cfg, s.train_rows, planning.planner, s.offsets, start,
                            loader_workers(cfg, placement))
    return LocalPlanner(rounds, on_start=pinned.helper, tracer=tracer, plan_bytes=wire.nbytes,
                        received=transport.traffic, relayed=cfg.trainers if wire.relayed else 1)


def _roles(planning: Planning, feed: LocalPlanner, report: TrainerReport,
           transport: LocalTransport, collective: LocalCollective) -> dict[str, dict[str, Any]]:
    """summary.json's roles of an in-process run: the planner thread, the trainers (one
    process), every server's thread, the collectives' thread; each process role its traffic
    as the distributed runtime would count it (`engine/comm/traffic.py`)."""
    iters = len(report.records)
    return {"planner": {**planning.role(), "traffic": feed.traffic.figures(iters)},
            "trainers": {**report.role(iters), "collective_bytes_by_trainer": {
                "sent": collective.sent.tolist(), "received": collective.received.tolist()}},
            **{f"server{k}": r.role(iters) for k, r in enumerate(transport.server_reports())},
            "collectives": {"busy_s": collective.busy_s}}


def loader_workers(cfg: TrainConfig, placement: Placement) -> int:
    """The planner's reader threads: --loader-workers, or the cores placement keeps for the planner."""
    if cfg.loader_workers is not None:
        return cfg.loader_workers
    return min(MAX_LOADER_WORKERS, len(placement.helpers)) if placement.policy != "off" else 1


def _evaluator(s: RunSetup, servers: list[Shard], evals: list[dict[str, Any]]) -> Hook | None:
    """--eval-every: the held-out rows with the true tables (as a checkpoint takes them)."""
    if not s.cfg.eval_every:
        return None

    def take(b: int, loop: TrainingLoop) -> None:
        wall = loop.train_seconds()
        loop.system.flush()
        weight, _ = full_tables(servers, [loop.system.resident()])
        evals.append(eval_point(s, b, wall, loop.model, weight))

    return take


def _checkpoint(ckpt: Checkpointer, servers: list[Shard],
                prior: list[dict]) -> Callable[[int, TrainingLoop], None]:
    def take(b: int, loop: TrainingLoop) -> None:
        t = time.perf_counter()
        # Pending work has landed: the true tables are the servers' with the resident rows
        # over them (the cache keeps them).
        loop.system.flush()
        weight, state = full_tables(servers, [loop.system.resident()])
        ckpt.save(b, weight, state, to_cpu(loop.model.state_dict()),
                  to_cpu(loop.dense_opt.state_dict()), torch.get_rng_state(), [prior + loop.records], t)

    return take
