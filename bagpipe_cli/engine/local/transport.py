"""A trainer's side of the in-process runtime's servers: requests split by shard and queued
on each server's serving thread (`engine/local/server.py`); with a `NetworkModel`, each
server's link sleeps for latency + bytes/bandwidth per message, so a cluster network is
emulated without burning CPU. Traced, every request is a slice on its server's track, and a
fetch has an arrow from where it was issued to the slice serving it.

Its traffic (`engine/comm/traffic.py`) is what the distributed transport would send and
receive for the same calls, this process's and each server's: every server gets every
request (its header; its keys and payload where it has rows of it), as in lockstep, though
only those with rows are served here."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.comm.shards import Shard, split_by_shard
from bagpipe_cli.engine.comm.traffic import Traffic, request_bytes
from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.local.server import Label, LocalServer
from bagpipe_cli.engine.records.run_record import ServerReport
from bagpipe_cli.engine.records.trace import NO_TRACE, REQUEST_FLOW, NoTracer, server_role


class LocalRows:
    """A fetch in flight: rows and optimizer state, assembled from the shards' replies on `result()`."""

    def __init__(self, n: int, parts: list[tuple[np.ndarray, Future]], dim: int, state_dim: int,
                 tracer: NoTracer = NO_TRACE):
        self._n, self._parts, self._dim, self._sdim = n, parts, dim, state_dim
        self.tracer = tracer

    def done(self) -> bool:
        return all(f.done() for _, f in self._parts)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        with self.tracer.span("wait rows", "wait", rows=self._n):
            return self._result()

    def _result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._parts) == 1:
            return self._parts[0][1].result()
        rows = torch.empty(self._n, self._dim)
        state = torch.empty(self._n, self._sdim)
        for pos, f in self._parts:
            w, s = f.result()
            p = torch.from_numpy(pos)
            rows[p] = w
            state[p] = s
        return rows, state


class LocalTransport(Transport):
    """Servers as worker threads in this process; optional network emulation per link."""

    def __init__(self, servers: list[Shard], network: NetworkModel | None = None,
                 on_start: Callable[[], None] | None = None, tracer: NoTracer = NO_TRACE):
        self.servers = servers
        self.num_servers = len(servers)
        self.network = network or NetworkModel()
        self.tracer = tracer
        self._workers = [LocalServer(f"server-{s.shard}", on_start, tracer,
                                       (server_role(s.shard), "serving")) for s in servers]
        self._sent = [0] * len(servers)  # requests sent to each server (the trace's arrows)
        self.dim = servers[0].weight.shape[1]
        self.state_dim = servers[0].state.shape[1]
        self.traffic = Traffic()  # this process's, by kind
        self.server_traffic = [Traffic() for _ in servers]

    def _count(self, k: int, kind: str, rows: int, payload: int = 0, served: int = 0) -> None:
        """Request `kind` of `rows` rows to server k (`payload` bytes with it, `served` bytes
        back), counted as it would cross (`request_bytes`)."""
        out = request_bytes(rows, payload)
        self.traffic.send(kind, out)
        self.server_traffic[k].receive(kind, out)
        if served:
            self.server_traffic[k].send(kind, served)
            self.traffic.receive(kind, served)

    def _label(self, k: int, name: str, rows: int, nbytes: int,
               arrow: bool = False) -> Label | None:
        """How request `name` to server k appears on the trace (None: not traced); with
        `arrow` (a fetch) an arrow starts here and ends at the slice serving it."""
        self._sent[k] += 1
        if not self.tracer.enabled:
            return None
        flow = (REQUEST_FLOW, 0, k, self._sent[k]) if arrow else None
        if flow is not None:
            self.tracer.flow_out(*flow)
        return Label(name, "serve", rows, nbytes, 0, self.tracer.position, flow)

    def fetch(self, keys: np.ndarray) -> LocalRows:
        parts = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            nbytes = len(local) * (self.dim + self.state_dim) * 4
            self._count(k, "rows", len(local), served=nbytes)
            if len(pos) == 0 and self.num_servers > 1:
                continue
            server, idx = self.servers[k], torch.from_numpy(local)
            self.bytes_received += nbytes

            def run(server=server, idx=idx, nbytes=nbytes):
                return server.gather(idx), self.network.transfer_seconds(nbytes)

            label = self._label(k, "fetch", len(local), nbytes, arrow=True)
            parts.append((pos, self._workers[k].submit(run, label)))
        return LocalRows(len(keys), parts, self.dim, self.state_dim, self.tracer)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> list[Future]:
        futures = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            nbytes = len(local) * (self.dim + self.state_dim) * 4
            self._count(k, "rows", len(local), nbytes)
            if len(pos) == 0:
                continue
            p = torch.from_numpy(pos)
            r, s = (rows, state) if self.num_servers == 1 else (rows[p], state[p])
            server, idx = self.servers[k], torch.from_numpy(local)
            self.bytes_sent += nbytes

            def run(server=server, idx=idx, r=r, s=s, nbytes=nbytes):
                server.write_back(idx, r, s)
                return None, self.network.transfer_seconds(nbytes)

            label = self._label(k, "write-back", len(local), nbytes)
            futures.append(self._workers[k].submit(run, label))
        return futures

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any) -> list[Future]:
        futures = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            self._count(k, "gradients", len(local), len(local) * grad.shape[1] * grad.element_size())
            if len(pos) == 0:
                continue
            g = grad if self.num_servers == 1 else grad[torch.from_numpy(pos)]
            server, idx = self.servers[k], torch.from_numpy(local)
            nbytes = g.numel() * 4
            self.bytes_sent += nbytes

            def run(server=server, idx=idx, g=g, nbytes=nbytes):
                server.apply_gradients(idx, g, opt)
                return None, self.network.transfer_seconds(nbytes)

            label = self._label(k, "push", len(local), nbytes)
            futures.append(self._workers[k].submit(run, label))
        return futures

    def server_reports(self) -> list[ServerReport]:
        """Per server: its shard, the seconds its worker was busy (serving, and holding the
        emulated link), the bytes it sent and received, and its traffic."""
        return [ServerReport(s.weight, s.state, {"busy_s": w.busy_s, "bytes_sent": s.bytes_served,
                                                 "bytes_received": s.bytes_received}, t)
                for s, w, t in zip(self.servers, self._workers, self.server_traffic, strict=True)]

    def close(self) -> None:
        for w in self._workers:
            w.close()
