"""The passes of `bagpipe profile` over the batch trace: the streamed one (Bagpipe at every
lookahead, no cache, what lookahead buys: `profile/reuse.py`) and the policies that need the whole trace (fixed capacities, Bagpipe
against the offline optimum)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

import numpy as np

from bagpipe_cli.data.format import Dataset
from bagpipe_cli.launch.environment import peak_rss_mb
from bagpipe_cli.policies.simulators import BagpipeSimulator, PolicyResult
from bagpipe_cli.policies.table import TABLE, Policy, policies, with_role
from bagpipe_cli.policies.trace import (
    DiskArray,
    Trace,
    TraceWriter,
    iter_batch_keys,
    num_batches,
    table_offsets,
)
from bagpipe_cli.profile.reuse import LookaheadReuse, ReuseCounter, ReuseFactor, reuse_depth
from bagpipe_cli.profile.skew import SkewResult

# progress(stage, advance, total): `advance` more units of `total` done in `stage`.
ProgressFn = Callable[[str, int, int], None]


class PassConfig(Protocol):
    """What the passes read of a `ProfileConfig`."""

    @property
    def batch_size(self) -> int: ...
    @property
    def lookaheads(self) -> tuple[int, ...]: ...
    @property
    def cache_rows(self) -> tuple[int, ...] | None: ...


@dataclass(frozen=True)
class TraceInfo:
    """The batch sequence that was simulated."""

    batch_size: int
    batches: int  # every batch, a final partial one included
    last_batch_rows: int  # samples in the last batch (= batch_size unless partial)
    accesses: int  # samples x tables
    unique_accesses: int  # sum over batches of |U_b|
    max_batch_unique_rows: int  # max over batches of |U_b|
    distinct_rows: int  # rows accessed at least once


@dataclass(frozen=True)
class BagpipeComparison:
    """Bagpipe at lookahead L against Belady with a capacity equal to Bagpipe's peak."""

    lookahead: int
    bagpipe_fetched_rows: int
    bagpipe_peak_resident_rows: int
    belady_cache_rows: int
    belady_fetched_rows: int

    @property
    def fetched_ratio(self) -> float:
        """bagpipe fetched / belady fetched (>= 1: Belady is the optimum at that capacity)."""
        return self.bagpipe_fetched_rows / self.belady_fetched_rows if self.belady_fetched_rows else 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "fetched_ratio": self.fetched_ratio}


@dataclass
class TracePass:
    """What pass 2 found: the batch sequence, Bagpipe at every lookahead, the trace itself
    (kept only for the fixed-capacity policies, else None) and what lookahead buys."""

    info: TraceInfo
    sizes: list[int]  # |U_b| of every batch
    bagpipe: list[PolicyResult]  # one per distinct lookahead
    fixed: dict[int, PolicyResult]  # the lookahead rule at the fixed lookaheads of policies (prefetch)
    trace: Trace | None
    num_rows: int  # embedding rows of all tables
    reuse: LookaheadReuse  # what lookahead buys
    reuse_factor: ReuseFactor  # accesses per distinct row of every batch


def timed(timing: dict[str, dict[str, float]], stage: str, t0: float, n: int) -> None:
    """Record that `stage` processed `n` accesses since `t0` (a `time.perf_counter()`), and
    the process's peak resident memory so far."""
    dt = time.perf_counter() - t0
    timing[stage] = {"seconds": dt, "accesses": n, "accesses_per_s": n / dt if dt > 0 else 0.0,
                     "peak_rss_mb": peak_rss_mb()}


def trace_pass(ds: Dataset, config: PassConfig, skew: SkewResult, keep: bool,
               fixed: list[int], progress: ProgressFn, timing: dict[str, dict[str, float]]
               ) -> TracePass:
    """Stream the per-batch unique rows through the Bagpipe simulator at --lookahead and at
    the `fixed` lookaheads of policies (prefetch's) and through the counts of what lookahead
    buys (`profile/reuse.py`), and keep the trace in memory if `keep`."""
    meta = ds.meta
    accesses = meta.rows * meta.num_tables
    lookaheads = list(dict.fromkeys([*config.lookaheads, *fixed]))
    num_rows = int(sum(meta.cardinalities))
    nb = num_batches(meta.rows, config.batch_size)
    bag = BagpipeSimulator(lookaheads, num_rows)
    reuse = ReuseCounter(reuse_depth(max(config.lookaheads), nb), table_offsets(meta), num_rows)
    writer = TraceWriter(num_rows) if keep else None
    sizes: list[int] = []
    t0, in_reuse = time.perf_counter(), 0.0
    for u, c in iter_batch_keys(ds, config.batch_size, lambda n: progress("trace", n, meta.rows)):
        bag.step(u)
        t1 = time.perf_counter()
        reuse.step(u, c)
        in_reuse += time.perf_counter() - t1
        sizes.append(u.size)
        if writer is not None:
            writer.add(u, c)
    unique_accesses = int(sum(sizes))
    bag_results = bag.results(accesses, unique_accesses)
    timed(timing, "trace+none+bagpipe", t0, accesses)
    timed(timing, "lookahead_reuse", time.perf_counter() - in_reuse, accesses)  # part of the above
    info = TraceInfo(
        batch_size=config.batch_size, batches=nb,
        last_batch_rows=meta.rows - (nb - 1) * config.batch_size,
        accesses=accesses, unique_accesses=unique_accesses,
        max_batch_unique_rows=max(sizes), distinct_rows=skew.accessed_rows,
    )
    trace = writer.finish() if writer is not None else None
    by_lookahead = dict(zip(lookaheads, bag_results, strict=True))
    return TracePass(info, sizes, [by_lookahead[lk] for lk in dict.fromkeys(config.lookaheads)],
                     {lk: by_lookahead[lk] for lk in fixed}, trace, num_rows,
                     *reuse.results(max(config.lookaheads), [t.name for t in meta.tables],
                                    info.last_batch_rows < config.batch_size))


def capacities(config: PassConfig, tp: TracePass) -> tuple[list[int], str]:
    """The capacities R to simulate and how they were chosen: given, or Bagpipe's peak at
    every lookahead (every policy gets the memory Bagpipe needs) and twice the largest batch."""
    if config.cache_rows is not None:
        return sorted(set(config.cache_rows)), "option"
    cache_rows = sorted({*(b.peak_resident_rows for b in tp.bagpipe), 2 * tp.info.max_batch_unique_rows})
    return cache_rows, "default: bagpipe's peak at every lookahead and 2 x the largest batch's unique rows"


def streamed_results(pols: list[Policy], tp: TracePass) -> list[PolicyResult]:
    """The results of the policies simulated while streaming: no cache and the lookahead's."""
    info = tp.info
    results: list[PolicyResult] = []
    names = {p.name for p in pols}
    for p in (p for p in TABLE if p.name in names):  # in the table's order
        if p.role == "reference":  # no cache: every batch fetches its unique rows
            results.append(PolicyResult(
                policy=p.name, lookahead=None, cache_rows=None, batches=info.batches,
                accesses=info.accesses, unique_accesses=info.unique_accesses,
                fetched_rows=info.unique_accesses, peak_resident_rows=info.max_batch_unique_rows,
                fetched_per_batch=np.asarray(tp.sizes, dtype=np.int64),
            ))
        elif p.setting == "lookahead":
            results.extend(tp.bagpipe)
        elif p.lookahead is not None:  # the lookahead rule at its own, fixed lookahead
            results.append(replace(tp.fixed[p.lookahead], policy=p.name))
    return results


def capacity_results(pols: list[Policy], tp: TracePass, cache_rows: list[int],
                      row_counts: DiskArray | None, optimum_at: dict[int, PolicyResult],
                      progress: ProgressFn, timing: dict[str, dict[str, float]]) -> list[PolicyResult]:
    """Every requested fixed-capacity policy at every capacity; the offline optimum's results
    are also kept in `optimum_at` (capacity -> result) for the comparison with Bagpipe."""
    nb = tp.info.batches
    results: list[PolicyResult] = []
    names = {p.name for p in pols}
    for p in policies():  # in their order
        if p.setting != "cache_rows" or p.name not in names:
            continue
        t0 = time.perf_counter()
        for r in cache_rows:
            stage = f"{p.name} R={r:,}"
            counts = row_counts[:] if p.needs_row_counts and row_counts is not None else None
            res = p.simulate(tp.trace, r, lambda n, s=stage: progress(s, n, nb), counts)
            if p.role == "optimum":
                optimum_at[r] = res
            results.append(res)
        timed(timing, p.name, t0, tp.info.accesses * len(cache_rows))
    return results


def compare_with_optimum(tp: TracePass, optimum_at: dict[int, PolicyResult],
                          progress: ProgressFn, timing: dict[str, dict[str, float]]
                          ) -> list[BagpipeComparison]:
    """Bagpipe at each lookahead against the offline optimum (Belady) at Bagpipe's peak
    (simulated if missing)."""
    nb = tp.info.batches
    best = with_role("optimum")
    comparisons: list[BagpipeComparison] = []
    t0 = time.perf_counter()
    for br in tp.bagpipe:
        r = br.peak_resident_rows
        if r not in optimum_at:
            stage = f"{best.name} R={r:,}"
            optimum_at[r] = best.simulate(tp.trace, r, lambda n, s=stage: progress(s, n, nb), None)
        comparisons.append(BagpipeComparison(
            lookahead=br.lookahead, bagpipe_fetched_rows=br.fetched_rows,
            bagpipe_peak_resident_rows=r, belady_cache_rows=r,
            belady_fetched_rows=optimum_at[r].fetched_rows,
        ))
    timed(timing, "bagpipe_vs_belady", t0, tp.info.accesses * len(comparisons))
    return comparisons
