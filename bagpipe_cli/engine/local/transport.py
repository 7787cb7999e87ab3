"""A trainer's side of the in-process runtime's servers: requests split by shard and queued
on each server's serving thread (`engine/local/server.py`); with a `NetworkModel`, each
server's link sleeps for latency + bytes/bandwidth per message, so a cluster network is
emulated without burning CPU. Traced, every request is a slice on its server's track, and a
fetch has an arrow from where it was issued to the slice serving it.

Its traffic (`engine/comm/traffic.py`) is what the distributed transport would send and
receive for the same calls, this process's and each server's: every server gets every
request (its header; its keys and payload where it has rows of it), as in lockstep, though
only those with rows are served here. Where the call stands for several trainers' requests
(`asked`: this process runs every trainer), each trainer's is counted, and the server's link
is held for each in turn, as a server rank serves the trainers in lockstep; the rows move
once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.comm.shards import Shard, split_by_shard
from bagpipe_cli.engine.comm.traffic import Traffic, request_bytes
from bagpipe_cli.engine.comm.transport import Asked, Transport
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
        self._payload = [[0, 0] for _ in servers]  # per server: bytes received, sent (payloads)

    def _count(self, k: int, kind: str, rows: list[int], row_bytes: int, served: bool = False) -> float:
        """Requests `kind` to server k, one of `rows[i]` rows per trainer asking (each row
        `row_bytes` with it, or with `served` back), counted as they would cross
        (`request_bytes`); returns the seconds the server's link takes for them: it serves
        them one after another, and an empty one costs no transfer (as a server rank)."""
        seconds = 0.0
        for n in rows:
            payload = 0 if served else n * row_bytes
            self.traffic.send(kind, request_bytes(n, payload))
            self.server_traffic[k].receive(kind, request_bytes(n, payload))
            self._payload[k][1 if served else 0] += n * row_bytes
            if served and n:
                self.server_traffic[k].send(kind, n * row_bytes)
                self.traffic.receive(kind, n * row_bytes)
            if n:
                seconds += self.network.transfer_seconds(n * row_bytes)
        if served:
            self.bytes_received += sum(rows) * row_bytes
        else:
            self.bytes_sent += sum(rows) * row_bytes
        return seconds

    def _asked(self, keys: np.ndarray, asked: Asked) -> list[list[int]]:
        """Per server, the rows of each request the call stands for: each trainer's of
        `asked`, or this process's one of `keys`."""
        counts = [np.bincount(np.asarray(a, np.int64) % self.num_servers, minlength=self.num_servers)
                  for a in (asked if asked is not None else [keys])]
        return [[int(c[k]) for c in counts] for k in range(self.num_servers)]

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

    def fetch(self, keys: np.ndarray, asked: Asked = None) -> LocalRows:
        parts, row = [], (self.dim + self.state_dim) * 4
        for k, ((pos, local), rows) in enumerate(zip(split_by_shard(keys, self.num_servers),
                                                     self._asked(keys, asked), strict=True)):
            seconds = self._count(k, "rows", rows, row, served=True)
            if len(pos) == 0 and self.num_servers > 1:
                continue
            server, idx = self.servers[k], torch.from_numpy(local)

            def run(server=server, idx=idx, seconds=seconds):
                return server.gather(idx), seconds

            label = self._label(k, "fetch", len(local), len(local) * row, arrow=True)
            parts.append((pos, self._workers[k].submit(run, label)))
        return LocalRows(len(keys), parts, self.dim, self.state_dim, self.tracer)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor,
                   asked: Asked = None) -> list[Future]:
        futures, row = [], (self.dim + self.state_dim) * 4
        for k, ((pos, local), sent) in enumerate(zip(split_by_shard(keys, self.num_servers),
                                                     self._asked(keys, asked), strict=True)):
            seconds = self._count(k, "rows", sent, row)
            if len(pos) == 0:
                continue
            p = torch.from_numpy(pos)
            r, s = (rows, state) if self.num_servers == 1 else (rows[p], state[p])
            server, idx = self.servers[k], torch.from_numpy(local)

            def run(server=server, idx=idx, r=r, s=s, seconds=seconds):
                server.write_back(idx, r, s)
                return None, seconds

            label = self._label(k, "write-back", len(local), len(local) * row)
            futures.append(self._workers[k].submit(run, label))
        return futures

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any,
                       asked: Asked = None) -> list[Future]:
        futures, row = [], grad.shape[1] * grad.element_size()
        for k, ((pos, local), sent) in enumerate(zip(split_by_shard(keys, self.num_servers),
                                                     self._asked(keys, asked), strict=True)):
            seconds = self._count(k, "gradients", sent, row)
            if len(pos) == 0:
                continue
            g = grad if self.num_servers == 1 else grad[torch.from_numpy(pos)]
            server, idx = self.servers[k], torch.from_numpy(local)

            def run(server=server, idx=idx, g=g, seconds=seconds):
                server.apply_gradients(idx, g, opt)
                return None, seconds

            label = self._label(k, "push", len(local), len(local) * row)
            futures.append(self._workers[k].submit(run, label))
        return futures

    def server_reports(self) -> list[ServerReport]:
        """Per server: its shard, the seconds its worker was busy (serving, and holding the
        emulated link), the bytes it sent and received (the requests' payloads, as its rank
        would: every trainer's), and its traffic."""
        return [ServerReport(s.weight, s.state, {"busy_s": w.busy_s, "bytes_sent": served,
                                                 "bytes_received": got}, t)
                for s, w, t, (got, served) in zip(self.servers, self._workers, self.server_traffic,
                                                  self._payload, strict=True)]
    def close(self) -> None:
        for w in self._workers:
            w.close()
