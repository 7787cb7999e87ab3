"""Rank 0: the planner. It plans every round and sends its plan, ahead of use, down
the trainers' relay tree (`relay.py`: one copy leaves rank 0), or, a partitioned cache's,
to each trainer its own share of it (`rounds.py`'s `trainer_round`); every trainer reads its
own samples. One sender thread makes, encodes and sends round r's plans while the main
thread plans round r + 1 (one round in flight, in round order; an error on it is raised on
the main thread); the main thread takes its turn on gloo (a checkpoint, an evaluation, the
end of the plans) only once the sender's round is out. It writes the checkpoints, and at
the end gathers every trainer's and every server's report (`records/run_record.py`) into
the run's RunRecord, and so its TrainResult.

A checkpoint at the boundary before iteration b: every trainer sends its new records and
its resident rows (a partitioned cache's trainers each their own, a replicated cache's
trainer 0; trainer 0 also the dense state), every server its shard once it has served
every trainer's requests before the boundary; rank 0 lays the resident rows over the shards
and writes the checkpoint. On resume rank 0 reads it and sends each server its shard and
each trainer the dense state (only rank 0 needs to see the checkpoint directory). An
evaluation (--eval-every) gathers the same true tables from the trainers and the servers, and
rank 0 evaluates them while the trainers go on. Traced, rank 0 merges every rank's events.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from bagpipe_cli.engine.comm.shards import Shard
from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.distributed.faults import Faults
from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.rounds import PlanWire
from bagpipe_cli.engine.distributed.wire import (
    Encoded,
    decode,
    encode,
    recv_encoded,
    recv_obj,
    send_encoded,
)
from bagpipe_cli.engine.planning.builders import Planning
from bagpipe_cli.engine.planning.feed import MAX_LOADER_WORKERS, planned_rounds
from bagpipe_cli.engine.planning.plans import RoundPlan
from bagpipe_cli.engine.records.checkpoint import (
    Checkpoint,
    Checkpointer,
    checkpoint_due,
    dataset_identity,
    full_tables,
)
from bagpipe_cli.engine.records.result import TrainResult, finish_run
from bagpipe_cli.engine.records.resume_checks import streams
from bagpipe_cli.engine.records.run_record import RunLayout, RunRecord, ServerReport, TrainerReport
from bagpipe_cli.engine.records.trace import NO_TRACE, PLANNER, NoTracer, trace_document, trace_meta
from bagpipe_cli.engine.setup import RunSetup, open_resume
from bagpipe_cli.engine.trainer.evaluation import eval_point
from bagpipe_cli.engine.trainer.loop import ProgressFn, eval_due
from bagpipe_cli.launch.contention import ContentionMeter
from bagpipe_cli.launch.environment import peak_rss_mb
from bagpipe_cli.launch.placement import available_cores
from bagpipe_cli.models import build_model


class DistributedPlanner:
    """Rank 0 of a run laid out as `layout` (see the module docstring)."""

    def __init__(self, s: RunSetup, layout: Layout, devices: list[str], placements: list[dict],
                 faults: Faults, plans: Any, progress: ProgressFn | None = None,
                 tracer: NoTracer = NO_TRACE):
        self.s, self.layout, self.devices, self.faults, self.progress = s, layout, devices, faults, progress
        self.placements, self.tracer, self.start = placements, tracer, 0
        self.plans = plans  # the relay's process group (rank 0 and the trainers)
        tracer.name_thread(PLANNER, "planner")
        self.evals: list[dict[str, Any]] = []
        self.eval_s = self.end_eval_s = 0.0  # evaluating (all; after training ended)
        self.traffic = Traffic()
        self.waiting_s = 0.0  # sending, i.e. a trainer behind
        # traffic and waiting_s: the sender thread's while it sends, the main thread's after a join
        self._sending: Future | None = None  # the round on the sender thread
        self.iterations = 0  # planned and sent
        self.ckpt: Checkpointer | None = None
        self.records: list[list[dict[str, Any]]] = [[] for _ in range(layout.trainers)]

    def _send(self, obj: Any, dst: int, kind: str = "control", group: Any = None) -> None:
        """Send `obj` (or what is already `Encoded`) to rank `dst`, counted."""
        t = time.perf_counter()
        enc = obj if isinstance(obj, Encoded) else encode(obj)
        self.traffic.send(kind, send_encoded(enc, dst, self.layout, group))
        self.waiting_s += time.perf_counter() - t

    def _recv(self, src: int) -> Any:
        """A control message (checkpoint parts, shards, results), counted."""
        enc = recv_encoded(src, self.layout)
        self.traffic.receive("control", enc.nbytes)
        return decode(enc)

    def run(self) -> TrainResult:
        t_start = time.perf_counter()
        s, lay = self.s, self.layout
        ck = open_resume(s)
        self.start = start = ck.iteration if ck else 0
        # (an in-process run's one stream: as trainer 0's)
        prior = streams(ck.metrics, lay.trainers) if ck else [[] for _ in range(lay.trainers)]
        self.records = [list(p) for p in prior]
        with self.tracer.span("planning pass", "planning"):
            s.feed_cores = len(self.placements[0]["compute"])  # rank 0's
            planning = s.spec.plan(s, start)
        self._initial_state(ck, planning, start)
        if s.cfg.checkpoint_every:
            self.ckpt = Checkpointer(s.cfg, dataset_identity(s.ds), start)
        cpu = time.process_time()  # the feed's, not the planning pass's
        here = [p["pid"] for p in self.placements if p["host"] == self.placements[0]["host"]]
        self.meter = ContentionMeter(len(available_cores()), here)
        try:
            self._feed(planning, start)
        finally:
            if self.ckpt is not None:
                self.ckpt.close()
        # The reports (not counted: their senders count none of them either).
        reports = [recv_obj(r, lay) for r in lay.trainer_ranks]
        servers = [recv_obj(lay.server_rank(k), lay) for k in range(lay.servers)]
        wall = time.perf_counter() - t_start - self.end_eval_s
        self.cpu_s = time.process_time() - cpu
        return self._result(planning, prior, reports, servers, wall, ck)

    def _initial_state(self, ck: Checkpoint | None, planning: Planning, start: int) -> None:
        """Each server's initial shard (the checkpoint's, or None: seeded), each trainer its
        cache size, its first iteration and (resumed) the dense state."""
        lay = self.layout
        for k in range(lay.servers):
            self._send(None if ck is None else {"weight": ck.weight[k::lay.servers].clone(),
                                                "state": ck.state[k::lay.servers].clone()},
                       lay.server_rank(k))
        dense = {"dense": ck.dense, "optimizer": ck.dense_optimizer, "rng": ck.rng} if ck else {}
        for r in lay.trainer_ranks:
            self._send({"slots": planning.slots, "start": start, **dense}, r)
        if ck is not None:
            del ck.weight, ck.state

    def _feed(self, planning: Planning, start: int) -> None:
        """Plan every round while the sender thread sends the one before (`_send_round`);
        take the checkpoints inside the round before, once this round has gone out."""
        s = self.s
        done = start
        prev = None
        workers = s.cfg.loader_workers or min(MAX_LOADER_WORKERS, len(self.placements[0]["compute"]))
        tr, t0 = self.tracer, time.perf_counter()
        wire = PlanWire.of(s, planning.slots is not None)
        sender = ThreadPoolExecutor(1, thread_name_prefix="plan-sender")
        try:
            for rp, _ in planned_rounds(s.ds, s.cfg, s.train_rows, planning.planner, s.offsets,
                                        start, workers, samples=False):
                t1 = time.perf_counter()
                where = (rp.iters[0].b if rp.iters else -1, rp.r)
                tr.complete("read and plan round", "plan", t0, t1, len(rp.fetch_keys), position=where)
                self._join()  # one round in flight
                self._sending = sender.submit(self._send_round, wire, rp, where)
                self.iterations += len(rp.iters)
                # The trainers got this round while they train the previous one, which is when
                # they reach its checkpoint boundaries.
                if prev is not None:
                    self._boundaries([p.b for p in prev.iters])
                prev = rp
                done += len(rp.iters)
                if self.progress and rp.iters:
                    self.progress(done - 1, {"loss": math.nan, "time": math.nan})
                t0 = time.perf_counter()
            self._join()
            self._send_plans(wire, None)
        finally:
            sender.shutdown(cancel_futures=True)  # waits for a send in flight
        if prev is not None:
            self._boundaries([p.b for p in prev.iters])
        t = time.perf_counter()
        self._boundaries([s.cfg.iterations])  # the end of training
        self.end_eval_s = time.perf_counter() - t

    def _send_round(self, wire: PlanWire, rp: RoundPlan, where: tuple[int, int]) -> None:
        """On the sender thread: round `rp`'s plans made, encoded and sent."""
        t = time.perf_counter()
        self._send_plans(wire, rp)
        self.tracer.complete("send round", "send", t, time.perf_counter(), position=where,
                             track=(PLANNER, "plan sender"))

    def _join(self) -> None:
        """Wait for the round on the sender thread (its error raised here)."""
        sending, self._sending = self._sending, None
        if sending is not None:
            sending.result()

    def _send_plans(self, wire: PlanWire, rp: RoundPlan | None) -> None:
        """Round `rp`'s plans (None: the end): one to the relay tree's root, or to each
        trainer its own, in trainer order."""
        for j, enc in wire.encoded(rp):  # each trainer's own made and encoded by threads
            self._send(enc, self.layout.trainer_rank(j), "plan", self.plans)

    def _boundaries(self, iterations: list[int]) -> None:
        """Rank 0's part of the checkpoints and evaluations at the boundaries before
        `iterations`, in the order the trainers reach them (a checkpoint first); the round on
        the sender thread joined first where one is due (one thread on gloo at a time)."""
        cfg, ck = self.s.cfg, self.ckpt
        due = [(b, ck is not None and checkpoint_due(cfg, b, ck.start), eval_due(cfg, b, self.start))
               for b in iterations]
        due = [d for d in due if d[1] or d[2]]
        if due:
            self._join()
        for b, checkpoint, evaluate in due:
            if checkpoint:
                self._checkpoint(b)
            if evaluate:
                t = time.perf_counter()
                with self.tracer.span("evaluate", "eval"):
                    self._evaluate(b)
                self.eval_s += time.perf_counter() - t

    def _evaluate(self, b: int) -> None:
        """The held-out rows with the true tables before iteration b (trainer 0's resident
        rows over the servers' shards) and trainer 0's dense model."""
        lay = self.layout
        parts = [self._recv(r) for r in lay.trainer_ranks]
        part = parts[0]
        shards = [_shard(k, lay, self._recv(lay.server_rank(k))) for k in range(lay.servers)]
        weight, _ = full_tables(shards, _resident(parts))
        model = build_model(self.s.mcfg)
        model.load_state_dict(part["dense"])
        self.evals.append(eval_point(self.s, b, part["wall_s"], model, weight))

    def _checkpoint(self, b: int) -> None:
        """Rank 0's part of the checkpoint at the boundary before iteration b."""
        lay = self.layout
        parts = [self._recv(r) for r in lay.trainer_ranks]
        t = time.perf_counter()
        for i, part in enumerate(parts):
            self.records[i].extend(part["records"])
        shards = [_shard(k, lay, self._recv(lay.server_rank(k))) for k in range(lay.servers)]
        weight, state = full_tables(shards, _resident(parts))
        self.ckpt.save(b, weight, state, parts[0]["dense"], parts[0]["optimizer"],
                       parts[0]["rng"], self.records, t)
        self.faults.checkpoint_done()

    def _result(self, planning: Planning, prior: list[list[dict]], reports: list[TrainerReport],
                servers: list[ServerReport], wall: float, ck: Checkpoint | None) -> TrainResult:
        s, lay, iters = self.s, self.layout, self.iterations
        model = build_model(s.mcfg)
        model.load_state_dict(reports[0].dense)
        sent = sum(self.traffic.sent.values())
        roles = {"planner": {**planning.role(), "waiting_s": self.waiting_s,
                             "bytes_sent": sent, "bytes_received": sum(self.traffic.received.values()),
                             "cpu_s": self.cpu_s, "bytes_per_iteration": sent / max(1, iters),
                             "peak_rss_mb": peak_rss_mb(), "traffic": self.traffic.figures(iters)},
                 **{f"trainer{i}": r.role(iters) for i, r in enumerate(reports)},
                 **{f"server{k}": sv.role(iters) for k, sv in enumerate(servers)}}
        layout = RunLayout(world=lay.world, servers=lay.servers, trainers=lay.trainers,
                           trainer_devices=self.devices, devices=[r.device_info for r in reports],
                           backend=s.cfg.backend, placement=self.placements)
        trace = None
        if self.tracer.enabled:
            parts = [self.tracer.export(), *(r.trace for r in reports), *(sv.trace for sv in servers)]
            clock = "ranks aligned to rank 0's clock (offsets measured at start-up)"
            trace = trace_document(parts, trace_meta(s.cfg, clock, parts))
        # this machine's load; the trainers' own waits for a CPU, wherever they ran
        contention = self.meter.figures([r.sched for r in reports])
        shards = [sv.shard(k, lay.servers) for k, sv in enumerate(servers)]
        return finish_run(RunRecord(
            s, planning, reports, prior, wall, model, shards, layout, runner="distributed",
            transport="torch", roles=roles, contention=contention, checkpointer=self.ckpt, resumed=ck, evals=self.evals, eval_s=self.eval_s, trace=trace))


def _resident(parts: list[dict[str, Any]]) -> list[tuple]:
    """The trainers' resident rows (trainer 0's alone of a replicated cache)."""
    return [p["resident"] for p in parts if p["resident"] is not None]


def _shard(k: int, layout: Layout, sent: dict[str, Any]) -> Shard:
    return Shard.holding(k, layout.servers, sent["weight"], sent["state"])
