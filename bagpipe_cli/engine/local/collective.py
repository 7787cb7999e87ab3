"""Sums among the trainers of the in-process runtime: every trainer is in this process, so
its sums are already complete. With an emulated network the collective holds the caller for
the time the distributed runtime's sum of the same bytes would take (`--collective`): the
rows' gradients and the losses on the critical path, and whatever of the dense gradients'
sum the backward pass did not hide (the distributed runtime sums them in buckets while the
backward runs); asynchronous sums wait on a serving thread of their own. It counts the
bytes each trainer would send and receive (`sent`, `received`: per trainer, as each
trainer rank counts its own; `bytes_sent`, `bytes_received`: their totals), a partitioned
cache's rows moved by need each trainer's own (`move_rows`), and waits what the busiest
trainer's link would take."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch

from bagpipe_cli.engine.comm.collective import Collective, traffic
from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.local.server import Label, LocalServer
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer


class LocalCollective(Collective):
    """All trainers in one process (see the module docstring)."""

    def __init__(self, size: int, network: NetworkModel, kind: str = "exact",
                 on_start: Callable[[], None] | None = None, tracer: NoTracer = NO_TRACE,
                 track: tuple[str, str] | None = None):
        self.size, self.network, self.kind, self.tracer = size, network, kind, tracer
        self._worker = LocalServer("collectives", on_start, tracer, track)
        self.sent = np.zeros(size, np.int64)  # bytes each trainer sent in sums and exchanges
        self.received = np.zeros(size, np.int64)
        self.exposed_s = 0.0

    @property
    def bytes_sent(self) -> int:
        return int(self.sent.sum())

    @property
    def bytes_received(self) -> int:
        return int(self.received.sum())

    def _count(self, tensors: list[torch.Tensor], extra: int = 0) -> int:
        """Bytes of `tensors` (plus `extra` float32s); counts every trainer's traffic of
        their sum (each sends and receives the same)."""
        n = sum(t.numel() for t in tensors) + extra
        moved = traffic(self.kind, n, 4, self.size)
        self.sent += moved
        self.received += moved
        return 4 * n

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor],
                   dense: list[torch.Tensor] = (), overlap_s: float = 0.0) -> list:
        if self.size > 1:
            net = self.network
            hidden = net.collective_seconds(self.kind, self._count(list(dense)), self.size)
            # the losses, where they are summed here (a partitioned cache carries them)
            nbytes = self._count(tensors, self.size if values else 0)
            critical = net.collective_seconds(self.kind, nbytes, self.size) if nbytes else 0.0
            wait = max(0.0, hidden - overlap_s) + critical
            net.wait(wait)
            self.exposed_s += wait
        return values  # every trainer's, already

    def start_sum(self, x: torch.Tensor) -> Future:
        nbytes = self._count([x])
        seconds = self.network.collective_seconds(self.kind, nbytes, self.size)
        label = (Label("sum (sync_later)", "sum", len(x), nbytes, -1, self.tracer.position)
                 if self.tracer.enabled else None)
        return self._worker.submit(lambda: (x, seconds), label)

    def move_rows(self, sent: np.ndarray, received: np.ndarray, row_bytes: int,
                  x: torch.Tensor | None = None, later: bool = False):
        """The partitioned cache's rows by need (engine/planning/partition.py): trainer i sends
        `sent[i]` rows and receives `received[i]`; an all-to-all takes as long as the
        busiest trainer's link (sending and receiving at once); each trainer's bytes are
        counted. The values are complete already: `later` returns a Future of `x`, else None."""
        rows_out, rows_in = int(sent.max(initial=0)), int(received.max(initial=0))
        self.sent += np.asarray(sent, np.int64) * row_bytes
        self.received += np.asarray(received, np.int64) * row_bytes
        seconds = (self.network.transfer_seconds(max(rows_out, rows_in) * row_bytes)
                   if self.size > 1 and rows_out + rows_in else 0.0)
        if later:
            label = (Label("exchange (sync_later)", "sum", rows_out, rows_out * row_bytes, -1,
                           self.tracer.position) if self.tracer.enabled else None)
            return self._worker.submit(lambda: (x, seconds), label)
        self.network.wait(seconds)
        self.exposed_s += seconds
        return None

    @property
    def busy_s(self) -> float:
        return self._worker.busy_s + self.exposed_s

    def close(self) -> None:
        self._worker.close()
