"""Sums among the trainers of the in-process runtime: every trainer is in this process, so
its sums are already complete; with an emulated network the collective holds the caller for
the time the distributed runtime's sum of the same bytes would take (asynchronous sums on a
serving thread of their own)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch

from bagpipe_cli.engine.collective import Collective
from bagpipe_cli.engine.local.server import Label, ServingThread
from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.trace import NO_TRACE, NoTracer


class LocalCollective(Collective):
    """All trainers in one process (see the module docstring)."""

    def __init__(self, size: int, network: NetworkModel, on_start: Callable[[], None] | None = None,
                 tracer: NoTracer = NO_TRACE, track: tuple[str, str] | None = None):
        self.size = size
        self.network = network
        self.tracer = tracer
        self._worker = ServingThread("collectives", on_start, tracer, track)

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> list:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.network.wait(self.network.allreduce_seconds(nbytes, self.size))
        return values  # every trainer's, already

    def start_sum(self, x: torch.Tensor) -> Future:
        nbytes = x.numel() * x.element_size()
        seconds = self.network.allreduce_seconds(nbytes, self.size)
        label = (Label("sum (sync_later)", "sum", len(x), nbytes, -1, self.tracer.position)
                 if self.tracer.enabled else None)
        return self._worker.submit(lambda: (x, seconds), label)

    @property
    def busy_s(self) -> float:
        return self._worker.busy_s

    def close(self) -> None:
        self._worker.close()
