"""Planning a run's cache: the plan builders every system's registry entry names.

- `no_plan`: systems without a planned cache need only U_b and its
  inverse per iteration: an oracle with lookahead 1 and no cache plans them;
- `lookahead_plan`: Bagpipe's Oracle Cacher at --lookahead (`engine/planning/oracle.py`), planned as
  training goes, by --planners workers (`engine/planning/slices.py`): its cache grows with the rounds' need (or is --cache-rows, refused when a
  round needs more), so no pass over the whole run comes first; prefetch's is the same
  oracle at a lookahead of one batch, without LRPP;
- `policy_plan`: a fixed-capacity cache that follows its system's planner policy's
  decisions (`policies/decisions.py`, the same as `bagpipe profile`'s simulators), so
  fetched-row counts of a training run equal the profile's on the same batches.

A `PolicyPlanner` produces the same RoundPlans as the Oracle, one iteration per round and
nothing prefetched ahead: a round's misses are fetched when it starts, and the iteration
waits for them; the policy's victims are written back before them (`pre_evict`), its
after-batch rows after the iteration (`evict`). A run resumed at iteration `start` plans
over the whole run's trace, replays the policy's decisions on batches 0..start-1, and
fetches the rows the cache then holds first (`RoundPlan.warm`): from `start` on, its
plans are those of the run that was never stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.planning.keys import KeySets, UniqueKeys
from bagpipe_cli.engine.planning.oracle import Oracle, plan_peak
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan
from bagpipe_cli.engine.planning.slices import default_planners
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.launch.placement import available_cores
from bagpipe_cli.policies.trace import Trace, trace_from_parts

if TYPE_CHECKING:
    from bagpipe_cli.engine.setup import RunSetup


def trace_of(batches: Iterable[np.ndarray], total_rows: int) -> Trace:
    """The profile's trace of a run: per batch the unique keys in first-access order, with counts."""
    keys, counts = [], []
    for k in batches:
        u, first, cnt = np.unique(k, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")
        keys.append(u[order])
        counts.append(cnt[order])
    return trace_from_parts(keys, counts, total_rows)


class PolicyPlanner:
    """Plans a fixed-capacity cache over a known trace by its policy's `decisions`
    (`EvictingDecisions`, `HotSetDecisions`: see the module docstring)."""

    def __init__(self, decisions: Any, trace: Trace, total_rows: int, start: int = 0):
        self.decisions, self.trace, self.start = decisions, trace, start
        self.slots = decisions.slots  # physical cache rows the plan needs
        self.slot_of = np.full(total_rows, -1, dtype=np.int32)
        self.keysets = KeySets(total_rows)
        self.free = list(range(self.slots - 1, -1, -1))
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

    def _warm(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Replay the decisions on batches 0..start-1; (keys, slots) then resident (None at
        the run's start: nothing is)."""
        if not self.start:
            return None
        for b in range(self.start):
            d = self.decisions.step(b, np.sort(self.trace.batch(b)))
            self._release(d.before)
            self._take(d.fetch)
            self._release(d.after)
        keys = np.flatnonzero(self.slot_of >= 0)
        return keys, self.slot_of[keys]

    def plan(self, batches: Iterable[np.ndarray | UniqueKeys]) -> Iterator[RoundPlan]:
        """`batches` yields the keys (or UniqueKeys) of each iteration from `start` on;
        yields round plans, numbered from 0 at `start` (as the oracle's)."""
        tr = self.trace
        t0 = time.perf_counter()
        warm = self._warm()
        self.seconds += time.perf_counter() - t0
        for i, keys in enumerate(batches):
            t0 = time.perf_counter()
            b = self.start + i
            uniq, inverse = self.keysets.of(keys)
            if len(tr.batch(b)) != len(uniq):
                raise RuntimeError("trace does not match the batch stream")
            d = self.decisions.step(b, uniq)
            pre_slots = self._release(d.before)
            fetch_slots = self._take(d.fetch)
            resident = self.slots - len(self.free)
            self.peak_resident = max(self.peak_resident, resident)
            slots = self.slot_of[uniq]
            after_slots = self._release(d.after)
            # The cache is replicated on every trainer: every row's gradient is all-reduced.
            it = IterPlan(i, uniq, inverse, slots, len(d.fetch), d.after, after_slots,
                          sync_now=len(uniq), sync_later=0, no_sync=0,
                          no_sync_owner_rows=np.zeros(1, np.int64))
            rp = RoundPlan(i, d.fetch, fetch_slots, [it], resident_after_insert=resident,
                           pre_evict_keys=d.before, pre_evict_slots=pre_slots)
            if i == 0:
                rp.warm = warm
            self.seconds += time.perf_counter() - t0
            self.iterations_planned += 1
            yield rp
        # A last round without iterations writes every resident row back.
        resident = np.flatnonzero(self.slot_of >= 0)
        yield RoundPlan(len(tr) - self.start, np.empty(0, np.int64), np.empty(0, np.int32), [],
                        pre_evict_keys=resident, pre_evict_slots=self._release(resident))

    @property
    def ms_per_batch(self) -> float:
        return 1e3 * self.seconds / max(1, self.iterations_planned)


@dataclass
class Planning:
    """The planner of a run's cache and, from a planning pass, bagpipe's peak at --lookahead
    (the baselines' default capacity; None without such a pass)."""

    planner: Oracle | PolicyPlanner
    peak: int | None = None
    capacity: int | None = None  # a fixed-capacity baseline's (its slots may hold more)

    @property
    def cache_rows(self) -> int | None:
        """The cache's capacity in rows (a growing oracle's so far; None: no cache)."""
        p = self.planner
        return self.capacity if isinstance(p, PolicyPlanner) else p.capacity

    @property
    def slots(self) -> int | None:
        """Physical rows of the trainer cache the plan needs so far (None: the system has no
        cache); a growing oracle's grow as it plans."""
        p = self.planner
        return p.slots if isinstance(p, PolicyPlanner) else p.capacity

    def role(self) -> dict[str, Any]:
        """summary.json's figures of the planner's work: its busy seconds and, for the oracle,
        its workers (`planners`), each one's thread CPU ms per batch and the CPU ms per batch
        of the oracle's own thread (what the workers' slices are laid into)."""
        p = self.planner
        out: dict[str, Any] = {"busy_s": p.seconds}
        if isinstance(p, Oracle):
            per = 1e3 / max(1, p.iterations_planned)
            out.update(planners=p.planners, worker_cpu_ms_per_batch=[c * per for c in p.workers.cpu.tolist()],
                       serial_cpu_ms_per_batch=p.serial_cpu * per)
        return out

    @property
    def bagpipe_peak(self) -> int | None:
        """Bagpipe's peak of resident rows at --lookahead: the pass's, or the oracle's own
        (once it has planned the run)."""
        p = self.planner
        if self.peak is not None or isinstance(p, PolicyPlanner) or p.capacity is None:
            return self.peak
        return int(p.peak_resident)


PlanBuilder = Callable[["RunSetup", int], Planning]  # (run, first iteration) -> its planning


def no_plan(s: RunSetup, start: int = 0) -> Planning:
    """U_b and its inverse per iteration, nothing cached: an oracle of lookahead 1, no cache,
    no LRPP classes (no system without a planned cache reads them)."""
    return Planning(Oracle(s.total_rows, 1, 1, s.cfg.trainers, None, lrpp=False))


def peak_capacity(s: RunSetup) -> tuple[int, int]:
    """(bagpipe's peak at --lookahead over the whole run, the capacity: --cache-rows or that
    peak). A planning pass (the oracle is deterministic) gives the peak before any training;
    the baselines' default capacity is the memory Bagpipe needs, as in `bagpipe profile`."""
    cfg = s.cfg
    peak, _ = plan_peak(key_batches(s.ds, cfg, s.train_rows, s.offsets), s.total_rows,
                        cfg.lookahead, cfg.round)
    return peak, cfg.cache_rows or max(peak, 1)


def lookahead_plan(s: RunSetup, start: int = 0, lookahead: int | None = None,
                   lrpp: bool = True) -> Planning:
    """Bagpipe's oracle at --lookahead, planned as training goes: a cache of --cache-rows
    (a round that needs more is refused), or by default one that grows with the rounds'
    need (it ends at most an eighth above the run's peak). A fixed `lookahead` (prefetch's
    one batch) plans rounds of one iteration; `lrpp=False` synchronises every row."""
    cfg = s.cfg
    L, C = (cfg.lookahead, cfg.round) if lookahead is None else (lookahead, 1)
    return Planning(Oracle(s.total_rows, L, C, cfg.trainers, cfg.cache_rows,
                           grow=cfg.cache_rows is None, lrpp=lrpp, planners=planners(s)))


def planners(s: RunSetup) -> int:
    """The oracle's planning workers: --planners, or one per ACCESSES_PER_PLANNER accesses of
    a batch, at most the cores its runtime's placement leaves to the planner (else the
    cores this process may use)."""
    if s.cfg.planners is not None:
        return s.cfg.planners
    return default_planners(s.cfg.batch_size * len(s.offsets), s.feed_cores or len(available_cores()))


def policy_plan(s: RunSetup, start: int = 0) -> Planning:
    """A fixed-capacity cache following its system's planner policy (its registry entry's
    `planner_decisions`). A resumed run plans the whole run (its capacity, hot set and cache
    state at `start` are those of the run never stopped): see the module docstring."""
    decide = spec(s.cfg.system).planner_decisions()
    peak, capacity = peak_capacity(s)
    trace = trace_of(key_batches(s.ds, s.cfg, s.train_rows, s.offsets), s.total_rows)
    planner = PolicyPlanner(decide(trace, capacity, s.cfg.hot_sample), trace, s.total_rows, start)
    return Planning(planner, peak, capacity)
