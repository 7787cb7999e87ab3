"""What a fixed-capacity cache policy decides, batch by batch, for a trainer's planner.

The engine's baselines (`engine/planning/builders.py`) follow these decisions, and `bagpipe profile`'s
simulators count the same ones (`simulators.py`), so a training run fetches exactly the
rows the profile says it would. Per batch b (U_b its unique row keys):

- `EvictingDecisions` (lru, lfu): the missing rows of U_b are fetched; the victims the
  policy's priority picks (never rows of U_b) are written back first, so at most R rows
  are resident;
- `HotSetDecisions` (fae): the R most-accessed rows (of the trace, or of its first
  `hot_sample` part) are loaded before batch 0 and stay; every other row of U_b is fetched
  for b and written back after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.eviction import EvictingCache
from bagpipe_cli.policies.simulators import check_capacity, hot_rows, trace_row_counts
from bagpipe_cli.policies.trace import Trace

_NONE = np.empty(0, np.int64)


def profiled_batches(batches: int, hot_sample: float) -> int:
    """How many of a run's first batches a hot set is profiled from (--hot-sample): the
    share `hot_sample` of `batches`, rounded up, at least one and at most all."""
    return min(batches, max(1, math.ceil(hot_sample * batches)))
Priority = Callable[[int, int, np.ndarray], np.ndarray | None]  # (b, trace offset, U_b) -> keys


@dataclass
class BatchDecision:
    """The cache actions of one batch, in the order they happen."""

    before: np.ndarray  # victims written back before the fetch
    fetch: np.ndarray  # rows fetched for the batch
    after: np.ndarray  # rows written back after the batch


class EvictingDecisions:
    """An evicting cache of `capacity` rows whose victims `priority` orders (see module doc)."""

    def __init__(self, trace: Trace, capacity: int, priority: Priority, priority_max: int):
        check_capacity(capacity, trace.max_batch_rows)
        self.trace, self.priority = trace, priority
        self.cache = EvictingCache(capacity, trace, priority_max)
        self.slots = int(capacity)  # physical cache rows the plan needs

    def step(self, b: int, uniq: np.ndarray) -> BatchDecision:
        lo, u = int(self.trace.offsets[b]), self.trace.batch(b)
        fetch = u[~self.cache.resident[u]]
        self.cache.step(u, lo, self.priority(b, lo, u))
        before = np.concatenate(self.cache.evicted) if self.cache.evicted else _NONE
        return BatchDecision(before, fetch, _NONE)


class HotSetDecisions:
    """FAE's static hot set of `capacity` rows; the cold rows of each batch come and go."""

    def __init__(self, trace: Trace, capacity: int, hot_sample: float = 1.0):
        if capacity < 1:
            raise ConfigError(f"--cache-rows must be >= 1 (got {capacity})")
        # FAE picks its hot rows from a profile of a sample of the input: here the first
        # `hot_sample` of the run's batches (all of them by default, as `bagpipe profile`).
        sample = trace.prefix(profiled_batches(len(trace), hot_sample))
        self.hot = hot_rows(trace_row_counts(sample), capacity)
        self.hot_keys = np.flatnonzero(self.hot)
        cold_max = max((int((~self.hot[trace.batch(b)]).sum()) for b in range(len(trace))), default=0)
        self.slots = len(self.hot_keys) + cold_max  # physical cache rows the plan needs

    def step(self, b: int, uniq: np.ndarray) -> BatchDecision:
        cold = uniq[~self.hot[uniq]]
        fetch = np.concatenate([self.hot_keys, cold]) if b == 0 else cold
        return BatchDecision(_NONE, fetch, cold)
