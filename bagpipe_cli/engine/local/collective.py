"""Sums among the trainers of the in-process runtime: every trainer is in this process, so
its sums are already complete; with an emulated network the collective holds the caller for
the time the distributed runtime's sum of the same bytes would take (asynchronous sums on a
serving thread of their own)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch

from bagpipe_cli.engine.collective import Collective
from bagpipe_cli.engine.local.server import ServingThread
from bagpipe_cli.engine.network import NetworkModel


class LocalCollective(Collective):
    """All trainers in one process (see the module docstring)."""

    def __init__(self, size: int, network: NetworkModel, on_start: Callable[[], None] | None = None):
        self.size = size
        self.network = network
        self._worker = ServingThread("collectives", on_start)

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> list:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.network.wait(self.network.allreduce_seconds(nbytes, self.size))
        return values  # every trainer's, already

    def start_sum(self, x: torch.Tensor) -> Future:
        seconds = self.network.allreduce_seconds(x.numel() * x.element_size(), self.size)
        return self._worker.submit(lambda: (x, seconds))

    @property
    def busy_s(self) -> float:
        return self._worker.busy_s

    def close(self) -> None:
        self._worker.close()
