"""A server rank: one shard of the tables, serving the trainers in lockstep.

Request k of trainer 0, of trainer 1, ..., then request k+1 of each: so request k of every
trainer is served before request k+1 of any, which orders requests *across* trainers as the
schedule does (a write-back of row x by one trainer lands before a later fetch of x by
another). A pass of gradient pushes is summed in trainer order, then applied. Traced, every
request with rows is a slice of the server's track, tagged with the trainer's iteration and
round from its header, and a fetch ends the arrow its trainer started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.comm.shards import Shard, init_shards
from bagpipe_cli.engine.comm.traffic import HEADER, Traffic, request_bytes
from bagpipe_cli.engine.distributed.faults import Faults
from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import (
    OP_CHECKPOINT,
    OP_DONE,
    OP_EVAL,
    OP_FETCH,
    OP_GRAD,
    OP_KINDS,
    OP_NAMES,
    OP_WRITEBACK,
    PLANNING_WAIT_S,
    ScheduleError,
    comm,
    decode,
    recv_encoded,
    send_obj,
)
from bagpipe_cli.engine.records.run_record import ServerReport
from bagpipe_cli.engine.records.trace import NO_TRACE, REQUEST_FLOW, NoTracer, server_role
from bagpipe_cli.engine.setup import RunSetup
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.launch.environment import peak_rss_mb

_TRACED = {OP_FETCH: "fetch", OP_WRITEBACK: "write-back", OP_GRAD: "push"}  # names on the trace


@dataclass
class _Stats:
    busy_s: float = 0.0  # serving, the emulated transfers included
    waiting_s: float = 0.0
    bytes_sent: int = 0
    requests: int = 0  # lockstep passes
    loaded: int = 0  # passes in which some request had rows
    network_s: float = 0.0  # of busy_s: the emulated transfers (sleeps)


@dataclass
class _Pass:
    """One lockstep pass: request k of every trainer."""

    op: int = 0
    rows: int = 0  # over every trainer's request
    grads: list = field(default_factory=list)  # (local indices, gradients) per trainer


class DistributedServer:
    """Serves one shard to the trainers of `layout` (see the module docstring)."""

    def __init__(self, shard: Shard, layout: Layout, network: NetworkModel,
                 opt: RowOptimizer, faults: Faults, tracer: NoTracer = NO_TRACE):
        self.shard, self.layout, self.network, self.opt, self.faults = shard, layout, network, opt, faults
        self.tracer = tracer
        self.traffic = Traffic()
        self.dim, self.sdim = shard.weight.shape[1], shard.state.shape[1]
        self.stats = _Stats()

    def serve(self) -> dict:
        """Serve until every trainer is done; returns the server's figures."""
        cpu = time.process_time()
        while True:
            p = self._one_pass(self.stats.requests)
            self.stats.requests += 1
            if p.op == OP_DONE:
                break
            if p.op in (OP_CHECKPOINT, OP_EVAL):
                # Every trainer's requests before the checkpoint (or evaluation) are served:
                # this is the shard at the boundary.
                self.traffic.send("control", send_obj({"weight": self.shard.weight,
                                                       "state": self.shard.state}, 0, self.layout))
                if p.op == OP_CHECKPOINT:
                    self.faults.checkpoint_done()
            if p.grads:
                self._apply(p.grads)
        s = self.stats
        return {"cpu_s": time.process_time() - cpu, "peak_rss_mb": peak_rss_mb(), "busy_s": s.busy_s, "waiting_s": s.waiting_s, "bytes_sent": s.bytes_sent,
                "bytes_received": self.shard.bytes_received, "requests": s.requests,
                "loaded_requests": s.loaded, "network_s": s.network_s}

    def _one_pass(self, seq: int) -> _Pass:
        p = _Pass()
        first: tuple[int, int] | None = None
        for i in range(self.layout.trainers):
            src = self.layout.trainer_rank(i)
            hdr = torch.empty(HEADER, dtype=torch.int64)
            t0 = time.perf_counter()
            comm(self.layout, src, dist.recv, hdr, src)
            t1 = time.perf_counter()
            self.stats.waiting_s += t1 - t0
            op, n, their_seq, b, r = hdr.tolist()
            kind = OP_KINDS.get(op, "control")
            self.traffic.receive(kind, request_bytes(n))  # the header, the keys
            self.tracer.at(b, r)
            if first is None:
                first = (op, their_seq)
            if (op, their_seq) != first or their_seq != seq:
                raise ScheduleError(
                    f"server {self.shard.shard}: request {seq} of trainer {i} is "
                    f"{OP_NAMES.get(op, op)} #{their_seq}, trainer 0's is {OP_NAMES.get(first[0])} "
                    f"#{first[1]}; the trainers are out of step (a bug in bagpipe)")
            p.op = op
            p.rows += n
            if op not in (OP_DONE, OP_CHECKPOINT, OP_EVAL):
                self._request(op, n, src, p)
            t2 = time.perf_counter()
            self.stats.busy_s += t2 - t1
            if n and self.tracer.enabled:
                self._trace(op, n, i, seq, t1, t2)
        self.stats.loaded += p.rows > 0
        return p

    def _trace(self, op: int, n: int, i: int, seq: int, t1: float, t2: float) -> None:
        """Request `seq` of trainer i, served from t1 to t2."""
        row = self.dim if op == OP_GRAD else self.dim + self.sdim
        self.tracer.complete(_TRACED.get(op, OP_NAMES.get(op, "?")), "serve", t1, t2, n,
                             n * row * 4, i)
        if op == OP_FETCH:
            self.tracer.flow_in(REQUEST_FLOW, i, self.shard.shard, seq, at=(t1 + t2) / 2)

    def _wait(self, nbytes: int) -> None:
        t = time.perf_counter()
        self.network.wait(self.network.transfer_seconds(nbytes))
        self.stats.network_s += time.perf_counter() - t

    def _request(self, op: int, n: int, src: int, p: _Pass) -> None:
        lay = self.layout
        local = torch.empty(n, dtype=torch.int64)
        if n:
            comm(lay, src, dist.recv, local, src)
        # An empty request only keeps the trainers in step: it costs no emulated transfer.
        if op == OP_FETCH:
            w, s = self.shard.gather(local)
            if n:
                self._wait(n * (self.dim + self.sdim) * 4)
                comm(lay, src, dist.send, w, src)
                if self.sdim:
                    comm(lay, src, dist.send, s, src)
                self.stats.bytes_sent += (w.numel() + s.numel()) * 4
                self.traffic.send("rows", (w.numel() + s.numel()) * 4)
        elif op == OP_WRITEBACK:
            if n:
                rows, state = torch.empty(n, self.dim), torch.empty(n, self.sdim)
                comm(lay, src, dist.recv, rows, src)
                if self.sdim:
                    comm(lay, src, dist.recv, state, src)
                self.traffic.receive("rows", (rows.numel() + state.numel()) * 4)
                self.shard.write_back(local, rows, state)
                self._wait(n * (self.dim + self.sdim) * 4)
        elif op == OP_GRAD:
            g = torch.empty(n, self.dim)
            if n:
                comm(lay, src, dist.recv, g, src)
                self.traffic.receive("gradients", g.numel() * 4)
                self._wait(n * self.dim * 4)
            p.grads.append((local, g))

    def _apply(self, grads: list) -> None:
        """Sum the trainers' gradients in trainer order, then one optimizer step per row."""
        t1 = time.perf_counter()
        keys = torch.unique(torch.cat([k for k, _ in grads]))
        total = torch.zeros(len(keys), self.dim)
        for k, g in grads:
            if len(k):
                total.index_add_(0, torch.searchsorted(keys, k), g)
        if len(keys):
            self.shard.apply_gradients(keys, total, self.opt)
        t2 = time.perf_counter()
        self.stats.busy_s += t2 - t1
        self.tracer.complete("apply pushes", "apply", t1, t2, len(keys))


def server_main(s: RunSetup, layout: Layout, k: int, faults: Faults,
                tracer: NoTracer = NO_TRACE) -> None:
    """Server k: its shard (seeded, or a resumed run's from rank 0), served until done."""
    tracer.name_thread(server_role(k), "serving")
    enc = recv_encoded(0, layout, PLANNING_WAIT_S)  # a resumed run's shard, from rank 0's checkpoint
    init = decode(enc)
    if init is None:
        # Initial values depend only on (seed, table, id): each server builds just its shard.
        shard = init_shards(s.cardinalities, s.row_dim, layout.servers, s.cfg.seed,
                             s.rowopt.init_state, only=k)[0]
    else:
        shard = Shard.holding(k, layout.servers, init["weight"], init["state"])
    server = DistributedServer(shard, layout, s.network, s.rowopt, faults, tracer)
    server.traffic.receive("control", enc.nbytes)
    stats = server.serve()
    send_obj(ServerReport(shard.weight, shard.state, stats, server.traffic, tracer.export()), 0,
             layout)
