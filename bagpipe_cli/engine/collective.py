"""The seam among the trainers of a run: the `Collective` interface, and the one order of sums.

The training loop sums the partial gradients of the trainers its process runs (in trainer
order, `ordered_sum`), then asks a `Collective` for the sum over *all* trainers. Runtimes:
`engine/local/collective.py` (every trainer in this process: the sums are already complete)
and `engine/distributed/collective.py` (trainer ranks over torch.distributed, summed in the
same order, so the sums are bitwise those of the in-process runtime).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future

import torch


class Collective(ABC):
    """Sums over every trainer of the run (`size` of them)."""

    size: int

    @abstractmethod
    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor]) -> list:
        """Replace every tensor by its sum over all trainers, in place, on the critical path;
        return every trainer's value (a float32 scalar each: the process passes its own
        trainers' sums and values), in trainer order, as tensors or floats: the caller adds
        them as Python floats (`add_floats`) once it reads them."""

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


def ordered_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """p0 + p1 + ... in trainer order: the one summation order every runtime uses."""
    if len(parts) == 1:
        return parts[0]
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total
