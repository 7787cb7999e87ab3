"""The seam among the trainers of a run: the `Collective` interface, and the one order of sums.

The training loop sums the partial gradients of the trainers its process runs (in trainer
order, `ordered_sum`), then asks a `Collective` for the sum over *all* trainers. Runtimes:
`engine/local/collective.py` (every trainer in this process: the sums are already complete;
an emulated network waits what the distributed runtime would) and
`engine/distributed/collective.py` (trainer ranks over torch.distributed).

How trainers sum (`--collective`, `KINDS`):

- `exact` (the default): the vector is cut into N chunks; an all-to-all sends chunk j of
  every trainer to trainer j, which adds its N pieces in trainer order (the additions of
  `ordered_sum`), and an all-gather returns the summed chunks. Bitwise the in-process sums,
  and each trainer sends and receives 2(N-1)/N of the vector, as a ring all-reduce;
- `allgather`: every trainer receives every other's whole vector and adds them in trainer
  order: bitwise too, at (N-1) vectors a trainer;
- `allreduce`: the library's all-reduce (gloo's or NCCL's own order): the fastest kernel,
  within float rounding of the others, not bitwise.

The dense gradients are summed in buckets while the backward pass runs (`Collective.wrap`:
DDP with a comm hook that does the chosen sum), the rows' gradients after it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future

import torch

from bagpipe_cli.engine.comm.traffic import Traffic
from bagpipe_cli.engine.config import COLLECTIVE_KINDS

KINDS = COLLECTIVE_KINDS


def traffic(kind: str, elements: int, itemsize: int, n: int) -> int:
    """Bytes one trainer sends (and receives) to sum a vector of `elements` over `n` trainers."""
    if n <= 1 or elements == 0:
        return 0
    if kind == "allgather":
        return (n - 1) * elements * itemsize
    chunk = -(-elements // n)  # exact: all-to-all + all-gather of N chunks; allreduce: a ring's
    return 2 * (n - 1) * chunk * itemsize


class Collective(ABC):
    """Sums over every trainer of the run (`size` of them)."""

    size: int
    kind: str = "exact"
    bytes_sent = 0  # what this process's trainers sent and received in collectives
    bytes_received = 0
    busy_s = 0.0  # seconds of collective work (critical and in the background)
    exposed_s = 0.0  # of which the training loop waited

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the loop runs forward and backward through: one that sums the dense
        gradients while the backward runs (distributed), or the model itself."""
        return model

    def take_dense_wait(self) -> float:
        """Seconds the last backward waited at its end for the dense sums (then reset)."""
        return 0.0

    @abstractmethod
    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor],
                   dense: list[torch.Tensor] = (), overlap_s: float = 0.0) -> list:
        """Replace every tensor by its sum over all trainers, in place, on the critical path;
        return every trainer's value (a float32 scalar each: the process passes its own
        trainers' sums and values), in trainer order, as tensors or floats: the caller adds
        them as Python floats (`add_floats`) once it reads them. `dense`: the dense gradients,
        summed during the `overlap_s` seconds of the backward (by `wrap`'s module)."""

    @abstractmethod
    def start_sum(self, x: torch.Tensor) -> Future:
        """The sum of `x` over all trainers, in the background: `.result()` waits for it."""

    def exchange(self, parts: list[torch.Tensor], counts: list[int], later: bool = False):
        """Rows by need, not a sum (the partitioned cache, engine/planning/partition.py): `parts[j]`
        [rows, width] go to trainer j, and `counts[j]` rows come from it; returns what came,
        per trainer, or with `later` a Future of it, exchanged in the background."""
        raise NotImplementedError(f"{type(self).__name__} does not exchange rows")

    def move_rows(self, sent, received, row_bytes: int, x: torch.Tensor | None = None,
                  later: bool = False):
        """In-process, the partitioned cache's exchanges emulated: their time and bytes
        (`engine/local/collective.py`)."""
        raise NotImplementedError(f"{type(self).__name__} does not emulate exchanges")

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


def collective_figures(c: Collective) -> dict[str, float]:
    """A trainer process's collective traffic and time, for summary.json's roles: bytes sent
    and received among trainers (apart from the servers'), the seconds the training loop
    waited for sums (exposed) and those the sums ran hidden behind other work (overlapped)."""
    return {"collective_bytes_sent": int(c.bytes_sent), "collective_bytes_received": int(c.bytes_received),
            "collective_exposed_s": float(c.exposed_s),
            "collective_overlapped_s": max(0.0, float(c.busy_s) - float(c.exposed_s))}


def count_collective(c: Collective, traffic: Traffic) -> dict[str, float]:
    """`collective_figures` of a trainer process whose training ended, its bytes also
    counted in its `traffic` (kind `collective`): the one count of both runtimes."""
    figures = collective_figures(c)
    traffic.send("collective", figures["collective_bytes_sent"])
    traffic.receive("collective", figures["collective_bytes_received"])
    return figures
