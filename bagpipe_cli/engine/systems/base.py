"""Embedding systems: where an iteration's rows come from and where their updates go.

A system object serves the trainers one process runs (`TrainerSet`): every trainer of the
run in-process, one trainer on a torch.distributed trainer rank. The training loop
(`engine/trainer/loop.py`) calls, in order:

- `begin_round(round, next_round)`: at a round boundary: write back the round's victims,
  insert its rows (prefetched during the previous round, or fetched now), start fetching
  the next round (bagpipe);
- `view(plan)`: the rows the process's gradients are taken over, and each access's position
  in them: U_b for the replicated systems, the process's own rows for the pushing ones;
- `read(step, keys, index)`: the values every access of the process's samples reads;
- replicated systems (`SystemSpec.replicated`: bagpipe and the caches) hold every row of U_b on every trainer
  and all-reduce gradients: `update_rows(plan, idx, grad)` applies the summed gradients to
  rows by position in U_b, and `evict(plan, classes)` writes back this process's share of
  the rows the plan evicts;
- pushing systems (the others: parameter-server ones) send their rows' gradients to the servers, which sum every
  trainer's and apply the optimizer: `push(step, keys, grad)`;
- hooks around an iteration, for systems that change what it computes: `phases(step,
  index, slices)` before it may split each trainer's samples into phases, each with what
  must happen first (hotline: popular samples, then the rest once their rows land), or
  leave some out (slipstream: samples whose rows are stale; `skips_samples`), a trainer's
  share of a phase being empty when it likes (all hot, all cold, all skipped);
  `after_iteration(step)` runs once its updates are applied (slipstream: a snapshot every K
  iterations);
- `flush()`: when training ends, everything is back on the servers; `resident()`: the rows
  whose newest value is on the trainer (a checkpoint lays them over the servers' tables).

Everything else (model, gradients, optimizers, synchronisation, metrics) is the loop's, so a
difference between systems is the policy's alone. Over torch.distributed every trainer
sends the servers the same sequence of requests, empty ones included (`transport.lockstep`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from bagpipe_cli.engine.comm.collective import Collective
from bagpipe_cli.engine.comm.shards import Shard
from bagpipe_cli.engine.comm.transport import Transport
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan
from bagpipe_cli.engine.records.metrics import Step
from bagpipe_cli.engine.records.trace import NO_TRACE, NoTracer
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.engine.trainer.trainer_set import TrainerSet

if TYPE_CHECKING:
    from bagpipe_cli.engine.setup import RunSetup

Rows = tuple[np.ndarray, np.ndarray]  # (keys, cache slots)


@dataclass
class Phase:
    """Samples an iteration computes together, after `before` (say, rows landing): per
    trainer slice of the process, the positions of the samples (in the process's batch)."""

    samples: list[np.ndarray]
    before: Callable[[Step], None] | None = None


@dataclass
class SystemParts:
    """What one process's embedding system is built from (`SystemSpec.build_system`)."""

    setup: RunSetup
    slots: int | None  # physical cache rows the plan needs (`Planning.slots`)
    transport: Transport
    trainers: TrainerSet
    device: torch.device
    servers: list[Shard] | None = None  # the in-process shards (local trains them in place)


class EmbeddingSystem(ABC):
    """The interface every system implements (see the module docstring)."""

    replicated = True
    # Whether `phases` may leave samples out (slipstream): the loop then sums the count of
    # computed samples over the trainers, so an iteration that computed none records no loss.
    skips_samples = False
    # Whether its trainers hold only their own rows (`partitioned.PartitionedCache`): the loop
    # then asks it to `reduce` each row's partial gradients at the row's home.
    partitioned = False
    tracer: NoTracer = NO_TRACE  # the run's trace (the training loop sets it)
    collective: Collective | None = None  # the trainers' sums (the training loop sets it)

    def __init__(self, transport: Transport, trainers: TrainerSet, device: str | torch.device = "cpu"):
        self.transport = transport
        self.trainers = trainers
        self.device = torch.device(device)
        self._pending: list[Future] = []  # write-backs and pushes not known to have landed
        self.pre_evicted = 0  # rows written back at the current round's start
        self.warmed = 0  # rows a resumed cache fetched back at the current round's start
        self.written_back_at_end = 0  # rows still resident when training ended

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        """Prepare a round; returns seconds spent waiting for rows."""
        return 0.0

    def view(self, plan: IterPlan) -> tuple[np.ndarray, np.ndarray]:
        """(keys, index): the rows gradients are taken over, and each of this set's accesses'
        position in them. Replicated systems: U_b."""
        return plan.uniq, self.trainers.inverse(plan)

    @abstractmethod
    def read(self, step: Step, keys: np.ndarray, index: torch.Tensor) -> torch.Tensor:
        """The values [accesses, dim] this set's accesses read (`index`: positions in `keys`)."""

    def phases(self, step: Step, index: torch.Tensor, slices: list[slice]) -> list[Phase] | None:
        """What the iteration computes, phase by phase (`index`: each access's position in
        the rows read; `slices`: each trainer's samples); None: every sample, at once."""
        return None

    def after_iteration(self, step: Step) -> None:  # noqa: B027 (a hook: most do nothing)
        """Called once the iteration's updates are applied, before its record is made."""

    def classes(self, plan: IterPlan) -> np.ndarray | None:
        """Per row of U_b: SYNC_NOW / SYNC_LATER / NO_SYNC (LRPP), or None: all SYNC_NOW."""
        return None

    def update_rows(self, plan: IterPlan, idx: np.ndarray | None, grad: torch.Tensor,
                    opt: RowOptimizer) -> None:
        """Apply the row optimizer to the rows at positions `idx` of U_b (None: every row, in
        order); `grad` holds their summed gradients, in `idx` order."""
        raise NotImplementedError(f"{type(self).__name__} does not update rows here")

    def evict(self, plan: IterPlan, classes: np.ndarray | None) -> tuple[int, Rows]:
        """Write back this set's share of the rows evicted after `plan.b` whose update is
        applied; returns (rows written back, the sync_later ones to write back once settled)."""
        return 0, (np.empty(0, np.int64), np.empty(0, np.int32))

    def push(self, step: Step, keys: np.ndarray, grad: torch.Tensor, opt: RowOptimizer) -> None:
        """Send the summed gradients of `keys` to the servers, which apply `opt`."""
        raise NotImplementedError(f"{type(self).__name__} does not push gradients")

    def write_back_slots(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Send the rows at cache `slots` (holding `keys`) back to their servers."""
        raise NotImplementedError(f"{type(self).__name__} has no cache slots")

    def _send(self, futures: list[Future]) -> None:
        self._pending.extend(futures)
        if len(self._pending) > 64:  # completed ones need not be kept
            self._pending = [f for f in self._pending if not f.done()]

    def _write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor,
                    asked: list[np.ndarray] | None = None) -> None:
        # Sent even when empty: the torch transport keeps every trainer's requests in
        # lockstep (the in-process one sends nothing for no rows). `asked`: each trainer's
        # share, where this process runs several (`Transport`).
        self._send(self.transport.write_back(keys, rows, state, asked))

    def flush(self) -> None:
        """Wait until every write-back and push has landed on the servers."""
        for f in self._pending:
            f.result()
        self._pending = []

    @property
    def peak_held(self) -> int | None:
        """The most rows this process's cache held at once, where it is its own (a
        partitioned cache's trainer); None: the plan's peak is the cache's."""
        return None

    def resident(self) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        """(keys, rows, state) held on the trainer with a newer value than the servers'."""
        return np.empty(0, np.int64), torch.empty(0, 0), torch.empty(0, 0)
