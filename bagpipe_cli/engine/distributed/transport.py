"""A trainer rank's side of the embedding servers, over torch.distributed point-to-point (gloo).

Every call sends one request to every server (an empty one where a server has no rows of
it), numbered per server: the servers serve the trainers in lockstep and check that all
trainers are in step (`distributed/server.py`). Its header carries the trainer's iteration
and round for the servers' trace; a traced fetch starts an arrow to the slice serving it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.comm.shards import split_by_shard
from bagpipe_cli.engine.comm.traffic import Traffic, request_bytes
from bagpipe_cli.engine.comm.transport import Asked, Transport
from bagpipe_cli.engine.distributed.layout import Layout
from bagpipe_cli.engine.distributed.wire import (
    OP_CHECKPOINT,
    OP_DONE,
    OP_EVAL,
    OP_FETCH,
    OP_GRAD,
    OP_KINDS,
    OP_WRITEBACK,
    comm,
)
from bagpipe_cli.engine.records.trace import NO_TRACE, REQUEST_FLOW, NoTracer


class DistributedRows:
    """A fetch in flight: the replies of every server, assembled on result()."""

    def __init__(self, n: int, parts: list, dim: int, sdim: int, layout: Layout,
                 tracer: NoTracer = NO_TRACE):
        self.n, self.parts, self.dim, self.sdim, self.layout = n, parts, dim, sdim, layout
        self.tracer = tracer

    def done(self) -> bool:
        return all(w.is_completed() for _, _, _, works, _ in self.parts for w in works)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.tracer.span("wait rows", "wait", rows=self.n):
            return self._result()

    def _result(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.empty(self.n, self.dim)
        state = torch.empty(self.n, self.sdim)
        for pos, r, s, works, peer in self.parts:
            for w in works:
                comm(self.layout, peer, w.wait)
            p = torch.from_numpy(pos)
            rows[p] = r
            state[p] = s
        return rows, state


class DistributedTransport(Transport):
    """The servers of a torch.distributed run, as one trainer rank sees them."""

    lockstep = True

    def __init__(self, layout: Layout, dim: int, state_dim: int, network: NetworkModel,
                 tracer: NoTracer = NO_TRACE, trainer: int = 0, traffic: Traffic | None = None):
        self.layout, self.tracer, self.trainer = layout, tracer, trainer
        self.traffic = traffic or Traffic()  # by kind: requests and rows, gradients, control
        self.num_servers = layout.servers
        self.network = network
        self.dim, self.sdim = dim, state_dim
        self._pending: list[tuple[Any, Any, int]] = []  # (work, tensors kept alive, peer)
        self._seq = [0] * layout.servers
        self.bytes_sent = 0
        self.bytes_received = 0

    def _send(self, k: int, op: int, local: np.ndarray, *payload: torch.Tensor) -> None:
        dst = self.layout.server_rank(k)
        hdr = torch.tensor([op, len(local), self._seq[k], *self.tracer.position], dtype=torch.int64)
        if op == OP_FETCH and len(local):
            self.tracer.flow_out(REQUEST_FLOW, self.trainer, k, self._seq[k])
        self._seq[k] += 1
        msgs = [hdr] + ([torch.from_numpy(np.ascontiguousarray(local, dtype=np.int64)), *payload]
                        if len(local) else [])
        for m in msgs:
            if m.numel():
                self._pending.append((comm(self.layout, dst, dist.isend, m.contiguous(), dst), m, dst))
                self.bytes_sent += m.numel() * m.element_size()
        payload_bytes = sum(m.numel() * m.element_size() for m in payload)
        self.traffic.send(OP_KINDS.get(op, "control"), request_bytes(len(local), payload_bytes))
        if len(self._pending) > 256:
            self._pending = [p for p in self._pending if not p[0].is_completed()]

    def fetch(self, keys: np.ndarray, asked: Asked = None) -> DistributedRows:
        # (`asked`: a rank runs one trainer, whose request this is)
        parts = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            src = self.layout.server_rank(k)
            self._send(k, OP_FETCH, local)
            r = torch.empty(len(local), self.dim)
            s = torch.empty(len(local), self.sdim)
            works = []
            if len(local):
                works.append(comm(self.layout, src, dist.irecv, r, src))
                if self.sdim:
                    works.append(comm(self.layout, src, dist.irecv, s, src))
                self.bytes_received += (r.numel() + s.numel()) * 4
                self.traffic.receive("rows", (r.numel() + s.numel()) * 4)
            parts.append((pos, r, s, works, src))
        return DistributedRows(len(keys), parts, self.dim, self.sdim, self.layout, self.tracer)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor,
                   asked: Asked = None) -> list[Future]:
        rows, state = rows.cpu(), state.cpu()
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            p = torch.from_numpy(pos)
            payload = [rows[p].contiguous()] + ([state[p].contiguous()] if self.sdim else [])
            self._send(k, OP_WRITEBACK, local, *payload)
        return []

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any,
                       asked: Asked = None) -> list[Future]:
        grad = grad.cpu()
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            self._send(k, OP_GRAD, local, grad[torch.from_numpy(pos)].contiguous())
        return []

    def checkpoint(self, op: int = OP_CHECKPOINT) -> None:
        """Tell every server this trainer reached a checkpoint (after its write-backs), or an
        evaluation (`op` OP_EVAL): the server sends rank 0 its shard."""
        for k in range(self.num_servers):
            self._send(k, op, np.empty(0, np.int64))

    def evaluation(self) -> None:
        self.checkpoint(OP_EVAL)

    def drain(self) -> None:
        for work, _, peer in self._pending:
            comm(self.layout, peer, work.wait)
        self._pending = []

    def close(self) -> None:
        for k in range(self.num_servers):
            self._send(k, OP_DONE, np.empty(0, np.int64))
        self.drain()
