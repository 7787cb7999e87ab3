"""Transports move embedding rows between trainers and embedding servers.

The interface is made for a deterministic schedule: the oracle's plan says who sends what
to whom and when, so a transport needs no any-source receives. Requests to one server are
served in the order they are made (FIFO): that is what makes a round's write-backs land
before later fetches of the same rows.

`InProcessTransport` runs every server as a worker thread with a FIFO queue (used by tests
and single-process runs); with a `NetworkModel`, each server's link sleeps for
latency + bytes/bandwidth per message, so a cluster network is emulated without burning CPU.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.server import EmbeddingServer, split_by_shard


class RowsFuture:
    """Rows and optimizer state of a fetch, assembled from the shards' replies on `result()`."""

    def __init__(self, n: int, parts: list[tuple[np.ndarray, Future]], dim: int, state_dim: int):
        self._n, self._parts, self._dim, self._sdim = n, parts, dim, state_dim

    def done(self) -> bool:
        return all(f.done() for _, f in self._parts)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
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


class Transport(ABC):
    """A trainer process's view of the embedding servers."""

    network: NetworkModel
    num_servers: int
    lockstep = False  # every trainer must send every server the same sequence of requests
    bytes_sent = 0  # payload bytes this trainer process sent to the servers
    bytes_received = 0  # and received from them

    @abstractmethod
    def fetch(self, keys: np.ndarray) -> RowsFuture:
        """Start fetching the rows (and optimizer state) of global `keys`, in that order."""

    @abstractmethod
    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> list[Future]:
        """Start writing rows back to their servers; the futures complete when they landed."""

    @abstractmethod
    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any) -> list[Future]:
        """Send row gradients to the servers, which apply the row optimizer `opt`."""

    @abstractmethod
    def close(self) -> None:
        """Finish outstanding requests and stop workers."""

    def drain(self) -> None:  # noqa: B027 (nothing to wait for unless a transport sends asynchronously)
        """Wait until every request sent so far has left this process, so that the tensors
        it sent are not kept alive."""


class Worker:
    """A thread serving requests in FIFO order, then holding the link for the transfer time."""

    def __init__(self, name: str, on_start: Callable[[], None] | None = None):
        self.q: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self._on_start = on_start
        self.t = threading.Thread(target=self._run, name=name, daemon=True)
        self.t.start()

    def submit(self, fn: Callable[[], tuple[Any, float]]) -> Future:
        f: Future = Future()
        self.q.put((fn, f))
        return f

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()  # e.g. pin this thread to the helper cores
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, f = item
            t0 = time.perf_counter()
            try:
                result, delay = fn()
                if delay > 0:
                    time.sleep(delay)
                f.set_result(result)
            except BaseException as e:  # surfaced on the trainer by f.result()
                f.set_exception(e)
            self.busy_s += time.perf_counter() - t0

    def close(self) -> None:
        self.q.put(None)
        self.t.join()


class InProcessTransport(Transport):
    """Servers as worker threads in this process; optional network emulation per link."""

    def __init__(self, servers: list[EmbeddingServer], network: NetworkModel | None = None,
                 on_start: Callable[[], None] | None = None):
        self.servers = servers
        self.num_servers = len(servers)
        self.network = network or NetworkModel()
        self._workers = [Worker(f"server-{s.shard}", on_start) for s in servers]
        self.dim = servers[0].weight.shape[1]
        self.state_dim = servers[0].state.shape[1]

    def fetch(self, keys: np.ndarray) -> RowsFuture:
        parts = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            if len(pos) == 0 and self.num_servers > 1:
                continue
            server, idx = self.servers[k], torch.from_numpy(local)
            nbytes = len(local) * (self.dim + self.state_dim) * 4
            self.bytes_received += nbytes

            def run(server=server, idx=idx, nbytes=nbytes):
                return server.gather(idx), self.network.transfer_seconds(nbytes)

            parts.append((pos, self._workers[k].submit(run)))
        return RowsFuture(len(keys), parts, self.dim, self.state_dim)

    def write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> list[Future]:
        futures = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            if len(pos) == 0:
                continue
            p = torch.from_numpy(pos)
            r, s = (rows, state) if self.num_servers == 1 else (rows[p], state[p])
            server, idx = self.servers[k], torch.from_numpy(local)
            nbytes = len(local) * (self.dim + self.state_dim) * 4
            self.bytes_sent += nbytes

            def run(server=server, idx=idx, r=r, s=s, nbytes=nbytes):
                server.write_back(idx, r, s)
                return None, self.network.transfer_seconds(nbytes)

            futures.append(self._workers[k].submit(run))
        return futures

    def push_gradients(self, keys: np.ndarray, grad: torch.Tensor, opt: Any) -> list[Future]:
        futures = []
        for k, (pos, local) in enumerate(split_by_shard(keys, self.num_servers)):
            if len(pos) == 0:
                continue
            g = grad if self.num_servers == 1 else grad[torch.from_numpy(pos)]
            server, idx = self.servers[k], torch.from_numpy(local)
            nbytes = g.numel() * 4
            self.bytes_sent += nbytes

            def run(server=server, idx=idx, g=g, nbytes=nbytes):
                server.apply_gradients(idx, g, opt)
                return None, self.network.transfer_seconds(nbytes)

            futures.append(self._workers[k].submit(run))
        return futures

    def server_figures(self) -> dict[str, dict[str, float]]:
        """Per server: seconds its worker was busy (serving, and holding the emulated link)
        and the bytes it sent and received."""
        return {f"server{s.shard}": {"busy_s": w.busy_s, "bytes_sent": s.bytes_served,
                                     "bytes_received": s.bytes_received}
                for s, w in zip(self.servers, self._workers, strict=True)}

    def close(self) -> None:
        for w in self._workers:
            w.close()
