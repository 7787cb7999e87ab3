"""Cache plans of the baselines: lru, lfu (fetch on miss, evict a victim) and fae (static hot set).

They produce the same RoundPlans as the Oracle, one iteration per round and nothing
prefetched ahead: a round's misses are fetched when it starts, and the iteration waits for
them. The eviction decisions are those of `bagpipe profile`'s simulators (the same code),
so fetched-row counts of a training run equal the profile's on the same batches.

- lru/lfu(R): before iteration b the missing rows of U_b are fetched and the victims the
  policy picks (never rows of U_b) are written back first, so at most R rows are resident.
- fae(R): the R most-accessed rows of the run's trace (or of its first `hot_sample` part, as
  FAE profiles a sample of the input) are loaded before iteration 0 and stay;
  every other row of U_b is fetched for b and written back after it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator

import numpy as np

from bagpipe_cli.engine.oracle import IterPlan, RoundPlan
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.simulators import (
    EvictingCache,
    check_capacity,
    hot_rows,
    lfu_count_bound,
    lfu_priority,
    trace_row_counts,
)
from bagpipe_cli.policies.trace import Trace, trace_from_parts

PLANNED_POLICIES = ("lru", "lfu", "fae")


def trace_of(batches: Iterable[np.ndarray], total_rows: int) -> Trace:
    """The profile's trace of a run: per batch the unique keys in first-access order, with counts."""
    keys, counts = [], []
    for k in batches:
        u, first, cnt = np.unique(k, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        keys.append(u[order])
        counts.append(cnt[order])
    return trace_from_parts(keys, counts, total_rows)


def _prefix(trace: Trace, fraction: float) -> Trace:
    """The trace of the first ceil(fraction * batches) batches (at least one)."""
    nb = len(trace)
    return trace.prefix(min(nb, max(1, math.ceil(fraction * nb))))


class PolicyPlanner:
    """Plans an lru, lfu or fae cache of `capacity` rows over a known trace (see module doc)."""

    def __init__(self, policy: str, trace: Trace, capacity: int, total_rows: int,
                 hot_sample: float = 1.0):
        if policy not in PLANNED_POLICIES:
            raise ConfigError(f"--system {policy!r}: not a planned cache policy")
        self.policy, self.trace, self.capacity = policy, trace, int(capacity)
        if policy == "fae":
            if self.capacity < 1:
                raise ConfigError(f"--cache-rows must be >= 1 (got {capacity})")
            # FAE picks its hot rows from a profile of a sample of the input: here the first
            # `hot_sample` of the run's batches (all of them by default, as `bagpipe profile`).
            self.hot = hot_rows(trace_row_counts(_prefix(trace, hot_sample)), self.capacity)
            self.hot_keys = np.flatnonzero(self.hot)
            cold_max = max((int((~self.hot[trace.batch(b)]).sum()) for b in range(len(trace))), default=0)
            slots = len(self.hot_keys) + cold_max
        else:
            check_capacity(self.capacity, trace.max_batch_rows)
            self.cache = EvictingCache(self.capacity, trace, lfu_count_bound(trace) if policy == "lfu" else 0)
            self.priority = lfu_priority(trace) if policy == "lfu" else (lambda b, lo, u: None)
            slots = self.capacity
        self.slots = slots  # physical cache rows the plan needs
        self.slot_of = np.full(total_rows, -1, dtype=np.int32)
        self.free = list(range(slots - 1, -1, -1))
        self.peak_resident = 0
        self.seconds = 0.0
        self.iterations_planned = 0

    def _take(self, keys: np.ndarray) -> np.ndarray:
        n = len(keys)
        slots = np.array(self.free[len(self.free) - n:][::-1] if n else [], dtype=np.int32)
        del self.free[len(self.free) - n:]
        self.slot_of[keys] = slots
        return slots

    def _release(self, keys: np.ndarray) -> np.ndarray:
        slots = self.slot_of[keys]
        self.slot_of[keys] = -1
        self.free.extend(slots.tolist())
        return slots

    def plan(self, batches: Iterable[np.ndarray]) -> Iterator[RoundPlan]:
        tr = self.trace
        for b, keys in enumerate(batches):
            t0 = time.perf_counter()
            uniq, inverse = np.unique(keys, return_inverse=True)
            lo, u = int(tr.offsets[b]), tr.batch(b)
            if len(u) != len(uniq):
                raise RuntimeError("trace does not match the batch stream")
            pre_keys = np.empty(0, np.int64)
            after = np.empty(0, np.int64)
            if self.policy == "fae":
                cold = uniq[~self.hot[uniq]]
                fetch = np.concatenate([self.hot_keys, cold]) if b == 0 else cold
                after = cold
            else:
                fetch = u[~self.cache.resident[u]]
                self.cache.step(u, lo, self.priority(b, lo, u))
                pre_keys = np.concatenate(self.cache.evicted) if self.cache.evicted else pre_keys
            pre_slots = self._release(pre_keys)
            fetch_slots = self._take(fetch)
            resident = self.slots - len(self.free)
            self.peak_resident = max(self.peak_resident, resident)
            slots = self.slot_of[uniq]
            after_slots = self._release(after)
            # The cache is replicated on every trainer: every row's gradient is all-reduced.
            it = IterPlan(b, uniq, inverse.reshape(-1), slots, len(fetch), after, after_slots,
                          sync_now=len(uniq), sync_later=0, no_sync=0,
                          no_sync_owner_rows=np.zeros(1, np.int64))
            rp = RoundPlan(b, fetch, fetch_slots, [it], resident_after_insert=resident,
                           pre_evict_keys=pre_keys, pre_evict_slots=pre_slots)
            self.seconds += time.perf_counter() - t0
            self.iterations_planned += 1
            yield rp
        # A last round without iterations writes every resident row back.
        resident = np.flatnonzero(self.slot_of >= 0)
        yield RoundPlan(len(tr), np.empty(0, np.int64), np.empty(0, np.int32), [],
                        pre_evict_keys=resident, pre_evict_slots=self._release(resident))

    @property
    def ms_per_batch(self) -> float:
        return 1e3 * self.seconds / max(1, self.iterations_planned)
