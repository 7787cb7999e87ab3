"""Embedding systems: where an iteration's rows come from and where their updates go.

Every system implements the same three stages, called by the trainer loop:

- `begin_round(round)`: at a round boundary (main thread): e.g. insert prefetched rows and
  start fetching the next round in the background (transport workers);
- `read(step)`: the rows (and optimizer state) of U_b, in `step.plan.uniq` order;
- `write(step, rows, state)`: store the updated rows: in a cache, or back to the servers;
  then write back what the plan evicts.

Everything else (model, gradients, optimizers, synchronisation, metrics) is shared, so a
difference between systems is the policy's alone.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch

from bagpipe_cli.engine.cache import RowCache
from bagpipe_cli.engine.oracle import IterPlan, RoundPlan
from bagpipe_cli.engine.transport import RowsFuture, Transport


@dataclass
class Step:
    """Per-iteration state in flight."""

    plan: IterPlan
    dense: torch.Tensor
    labels: torch.Tensor
    times: dict[str, float] = field(default_factory=dict)
    rows_fetched: int = 0  # rows transferred from the servers for this iteration
    rows_written_back: int = 0
    cache_hits: int = 0  # rows of U_b that were already on the trainer


class EmbeddingSystem(ABC):
    """The interface every system implements (see the module docstring)."""

    name: str = ""
    uses_oracle_slots = False  # whether the oracle must assign cache slots

    def __init__(self, transport: Transport):
        self.transport = transport
        self._pending_writes: list[Future] = []

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        """Prepare a round; returns seconds spent waiting for data."""
        return 0.0

    @abstractmethod
    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None: ...

    def _write_back(self, keys: np.ndarray, rows: torch.Tensor, state: torch.Tensor) -> None:
        if len(keys):
            self._pending_writes.extend(self.transport.write_back(keys, rows, state))
        # Completed writes need not be kept; this bounds the list.
        if len(self._pending_writes) > 64:
            self._pending_writes = [f for f in self._pending_writes if not f.done()]

    def flush(self) -> None:
        """Wait until every write-back has landed on the servers."""
        for f in self._pending_writes:
            f.result()
        self._pending_writes = []


class SyncSystem(EmbeddingSystem):
    """No cache: fetch U_b from the servers every iteration, write the updates straight back.

    The write-back of iteration b is queued on each server before the fetch of b+1, so the
    next fetch always sees it (servers serve requests in order).
    """

    name = "sync"

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        rows, state = self.transport.fetch(step.plan.uniq).result()
        step.times["prefetch_wait"] = time.perf_counter() - t0
        step.rows_fetched = len(step.plan.uniq)
        return rows, state

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        self._write_back(step.plan.uniq, rows, state)
        step.rows_written_back = len(step.plan.uniq)


class BagpipeSystem(EmbeddingSystem):
    """Oracle-planned cache with prefetch one round ahead.

    Stages: at the start of round r (main thread) wait for round r's prefetch, insert it at
    the oracle's slots, and start fetching round r+1 (the transport's server workers do the
    transfer while the model computes). Per iteration, rows are read from and updated in the
    cache by slot; rows the plan evicts are written back asynchronously.
    """

    name = "bagpipe"
    uses_oracle_slots = True

    def __init__(self, transport: Transport, cache: RowCache):
        super().__init__(transport)
        self.cache = cache
        self._inflight: dict[int, RowsFuture] = {}

    def begin_round(self, rp: RoundPlan, next_rp: RoundPlan | None) -> float:
        t0 = time.perf_counter()
        fut = self._inflight.pop(rp.r, None) or self.transport.fetch(rp.fetch_keys)
        if len(rp.fetch_keys):
            rows, state = fut.result()
            self.cache.insert(rp.fetch_slots, rows, state)
        waited = time.perf_counter() - t0
        # Every write-back of earlier iterations is already queued, so the servers serve this
        # fetch after them (see the oracle on why that is early enough).
        if next_rp is not None and len(next_rp.fetch_keys):
            self._inflight[next_rp.r] = self.transport.fetch(next_rp.fetch_keys)
        return waited

    def read(self, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        p = step.plan
        step.rows_fetched = p.fetched
        step.cache_hits = len(p.uniq) - p.fetched
        return self.cache.read(p.slots)

    def write(self, step: Step, rows: torch.Tensor, state: torch.Tensor) -> None:
        p = step.plan
        self.cache.write(p.slots, rows, state)
        if len(p.evict_keys):
            rows_out, state_out = self.cache.read(p.evict_slots)
            self._write_back(p.evict_keys, rows_out.cpu(), state_out.cpu())
        step.rows_written_back = len(p.evict_keys)


SYSTEMS = ("bagpipe", "sync")
