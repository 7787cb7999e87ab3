"""A trainer rank: the training loop (engine/trainer/loop.py) for one trainer of N.

Its rounds' plans come from rank 0, ahead of use, down the relay tree (`relay.py`), or (a
partitioned cache's) its own from rank 0; it reads
its own slice of every batch from the dataset (`rounds.RoundMaker`); its rows come from the
server ranks (`DistributedTransport`), its sums from the other trainers (`DistributedCollective`). At a checkpoint it sends rank 0 its new metrics records (trainer 0
also the dense model, its optimizer and the RNG state) and its resident rows, then every
server a CHECKPOINT request after its write-backs; at an evaluation (--eval-every) every
trainer sends its resident rows (a partitioned cache's are its own; a replicated cache's,
trainer 0's), trainer 0 its dense model, and every trainer the servers an EVAL request.
At the end it sends rank 0 its `TrainerReport` (records, figures, traffic; trainer 0 its
dense model; traced, its events).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from bagpipe_cli.engine.comm.collective import count_collective
from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.distributed.collective import DistributedCollective
from bagpipe_cli.engine.distributed.faults import Faults
from bagpipe_cli.engine.distributed.layout import TRAINERS, Layout
from bagpipe_cli.engine.distributed.relay import PlanFeed
from bagpipe_cli.engine.distributed.rounds import RoundMaker, own_plans
from bagpipe_cli.engine.distributed.transport import DistributedTransport
from bagpipe_cli.engine.distributed.wire import PLANNING_WAIT_S, decode, recv_encoded, send_obj
from bagpipe_cli.engine.planning.feed import SliceReader
from bagpipe_cli.engine.records.run_record import TrainerReport
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer, traced, trainer_role
from bagpipe_cli.engine.setup import RunSetup, build_dense, restore_dense
from bagpipe_cli.engine.systems import SystemParts
from bagpipe_cli.engine.trainer.device import describe, to_cpu
from bagpipe_cli.engine.trainer.loop import Hook, TrainingLoop
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet
from bagpipe_cli.errors import RankFailure
from bagpipe_cli.launch.contention import sched_times, wait_delta
from bagpipe_cli.launch.environment import peak_rss_mb


def trainer_main(s: RunSetup, layout: Layout, i: int, collective: DistributedCollective, plans: Any,
                 device: torch.device, faults: Faults, tracer: NoTracer = NO_TRACE) -> None:
    """Trainer i: its slice of every global batch, synchronised with the other trainers;
    `plans`: the plans' process group (rank 0 and the trainers)."""
    cfg = s.cfg
    tracer.name_thread(trainer_role(i, 1), "main")
    model, dense_opt = build_dense(cfg, s.mcfg, device)
    traffic = Traffic()
    enc = recv_encoded(0, layout, PLANNING_WAIT_S)
    traffic.receive("control", enc.nbytes)
    info = decode(enc)
    if info.get("dense") is not None:  # resumed: the checkpoint's dense model and optimizer
        restore_dense(model, dense_opt, info["dense"], info["optimizer"], info["rng"])
    transport = DistributedTransport(layout, s.row_dim, s.rowopt.state_dim, s.network, tracer, i, traffic)
    trainers = TrainerSet.one(i, layout.trainers)
    system = s.spec.build_system(SystemParts(s, info["slots"], transport, trainers,
                                                    torch.device(device)))
    hook = _checkpoint(layout, transport, faults, traffic) if cfg.checkpoint_every else None
    loop = TrainingLoop(cfg, model, dense_opt, system, s.rowopt, traced(collective, tracer),
                        trainers, info["start"], device, checkpoint=hook,
                        evaluate=_evaluator(layout, transport, traffic) if cfg.eval_every else None,
                        tracer=tracer)
    make = RoundMaker(SliceReader(s.ds, cfg, s.train_rows, s.offsets, i, layout.trainers), i,
                      s.total_rows)
    cpu, sched = time.process_time(), sched_times()
    try:
        records = loop.run(PlanFeed(layout, plans, i, make, traffic, relayed=not own_plans(s)))
    except RuntimeError as e:  # a background sum failed (DDP re-raises it): its error says why
        if collective.failure is not None:
            raise collective.failure from None
        if isinstance(e, dist.DistBackendError):  # a collective inside DDP lost a trainer
            raise RankFailure(f"lost contact with {layout.name(TRAINERS)}: "
                              f"{str(e).splitlines()[0][:160]}") from e
        raise
    finally:
        collective.close()
    cpu = time.process_time() - cpu
    system.flush()
    transport.close()
    report = TrainerReport(
        records, str(device), describe(device), transport.bytes_sent, transport.bytes_received,
        count_collective(collective, traffic), traffic, system.written_back_at_end,
        peak_resident_rows=system.peak_held, cpu_s=cpu, peak_rss_mb=peak_rss_mb(),
        sched=wait_delta(sched, sched_times()), trace=tracer.export(),
        dense=to_cpu(model.state_dict()) if i == 0 else None)
    send_obj(report, 0, layout)  # (the report itself is not counted: it is sent after the count)


def _resident(loop: TrainingLoop) -> tuple | None:
    """The rows whose newest value this trainer holds: trainer 0's replicated cache holds
    every trainer's; a partitioned cache's trainers each hold their own."""
    return loop.system.resident() if loop.trainers.first == 0 or loop.system.partitioned else None


def _evaluator(layout: Layout, transport: DistributedTransport, traffic: Traffic) -> Hook:
    """--eval-every: every trainer sends rank 0 its resident rows (`_resident`), trainer 0
    its dense model too (rank 0 lays the rows over the servers' shards and evaluates); every
    trainer asks the servers for their shards."""

    def take(b: int, loop: TrainingLoop) -> None:
        msg: dict[str, Any] = {"resident": _resident(loop)}
        if loop.trainers.first == 0:
            msg.update(wall_s=loop.train_seconds(), dense=to_cpu(loop.model.state_dict()))
        traffic.send("control", send_obj(msg, 0, layout))
        transport.evaluation()  # after every write-back of this trainer

    return take


def _checkpoint(layout: Layout, transport: DistributedTransport, faults: Faults,
                traffic: Traffic) -> Callable[[int, TrainingLoop], None]:
    sent = 0  # records already sent to rank 0 with a checkpoint

    def take(b: int, loop: TrainingLoop) -> None:
        nonlocal sent
        msg: dict[str, Any] = {"records": loop.records[sent:], "resident": _resident(loop)}
        sent = len(loop.records)
        if loop.trainers.first == 0:
            msg["dense"] = to_cpu(loop.model.state_dict())
            msg["optimizer"] = to_cpu(loop.dense_opt.state_dict())
            msg["rng"] = torch.get_rng_state()
        traffic.send("control", send_obj(msg, 0, layout))
        transport.checkpoint()  # after every write-back of this trainer
        faults.checkpoint_done()

    return take
