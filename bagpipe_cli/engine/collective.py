"""Collectives among the trainers of a run: sums of every trainer's gradients.

The training loop sums the partial gradients of the trainers its process runs (in trainer
order), then asks a `Collective` for the sum over *all* trainers:

- `LocalCollective`: every trainer is in this process, so its sums are already complete;
  with an emulated network it holds the caller for the time a ring all-reduce of the same
  bytes would take (asynchronous sums on a worker thread of their own);
- `distributed/collectives.py`: all-gathers over torch.distributed, summed in trainer order
  on every trainer (bitwise the same sums as in-process).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future

import torch

from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.transport import Worker


class Collective(ABC):
    """Sums over every trainer of the run (`size` of them)."""

    size: int

    @abstractmethod
    def allreduce_(self, tensors: list[torch.Tensor], values: list[float]) -> float:
        """Replace every tensor by its sum over all trainers, in place, on the critical path;
        return the sum over all trainers of `values` (added as Python floats, in trainer
        order). The process passes its own trainers' sums and values."""

    @abstractmethod
    def start_sum(self, x: torch.Tensor) -> Future:
        """The sum of `x` over all trainers, in the background: `.result()` waits for it."""

    def close(self) -> None:
        """Release workers (none by default)."""
        return None


def add_floats(values: list[float]) -> float:
    """v0 + v1 + ... as Python floats, in order (the one order every collective uses)."""
    total = 0.0
    for v in values:
        total += v
    return total


class LocalCollective(Collective):
    """All trainers in one process (see the module docstring)."""

    def __init__(self, size: int, network: NetworkModel, on_start: Callable[[], None] | None = None):
        self.size = size
        self.network = network
        self._worker = Worker("collectives", on_start)

    def allreduce_(self, tensors: list[torch.Tensor], values: list[float]) -> float:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.network.wait(self.network.allreduce_seconds(nbytes, self.size))
        return add_floats(values)

    def start_sum(self, x: torch.Tensor) -> Future:
        seconds = self.network.allreduce_seconds(x.numel() * x.element_size(), self.size)
        return self._worker.submit(lambda: (x, seconds))

    @property
    def busy_s(self) -> float:
        return self._worker.busy_s

    def close(self) -> None:
        self._worker.close()
