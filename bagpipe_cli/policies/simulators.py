"""Trace-driven simulators of the embedding-cache policies.

Every simulator takes a trace (a `Trace`, or a list of per-batch arrays of unique row
keys in first-access order) and returns a `PolicyResult`. A policy *fetches* a row when
it must transfer it from the embedding servers into the trainer cache; `fetched_rows`
counts every such transfer. Definitions (batch granular; `U_b` = unique rows of batch b):

- none: no cache, every batch fetches all of `U_b`.
- bagpipe(L): a row of `U_b` is fetched iff it is in none of `U_{b-L} .. U_{b-1}`. A row
  stays resident from its fetch through the last use of its chain of uses that are at
  most L batches apart; `peak_resident_rows` is the most rows resident at one batch.
- prefetch: bagpipe(1), the one-batch prefetch pipeline (TorchRec, FBGEMM): a row of
  `U_b` is fetched unless `U_{b-1}` used it, while batch b-1 trains.
- lru(R): before batch b the missing rows of `U_b` are fetched, all of `U_b` becomes most
  recently used, then rows outside `U_b` are evicted, least recently used first, until at
  most R remain. Ties (rows last used in the same batch): the row whose first access
  within that batch came earlier is evicted first (its first access within its last-use
  batch, not its first access ever).
- lfu(R): as lru, evicting the lowest access count first. The count of a row is the
  number of its accesses (every sample's, not once per batch) in all batches so far,
  the current one included; it persists across evictions (perfect LFU). Ties (equal
  counts): the row with the earlier last-use batch is evicted first, then, within that
  batch, the row whose first access came earlier.
- belady(R): as lru, evicting the row whose next use is furthest in the future (rows
  never used again first). Ties (the same next use, or none): as lfu's ties. The offline
  optimum at a fixed capacity.
- fae(R): the R most-accessed rows of the whole trace (by access count; ties go to the
  smaller (table, id), that is the smaller row key; rows never accessed are not loaded)
  are loaded once at the start (counted as fetched) and stay; every other row of `U_b`
  is fetched for each batch. `peak_resident_rows` = loaded rows + the most non-hot rows
  of one batch.

lru, lfu and belady share one engine (`bagpipe_cli.policies.eviction.EvictingCache`): a
queue of (priority, stamp) keys sorted ascending, with lazy deletion. `stamp` is the
access's position in the concatenated trace (so it orders by batch, then first access in
the batch) and the priority is 0 (lru), the access count (lfu) or `batches - next use`
(belady). Each batch costs a few vectorised passes over `U_b`, the evicted rows and
(lfu, belady) a merge into the queue, whose size stays below about 2R.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.eviction import EvictingCache
from bagpipe_cli.policies.trace import Column, Trace, add_counts, as_trace, spill_like

TraceLike = Trace | Iterable[Sequence[int] | np.ndarray]
BatchProgress = Callable[[int], None]  # called with the number of batches just simulated
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class PolicyResult:
    """What one policy at one setting did over a whole trace."""

    policy: str  # a name of the policies table (`policies/table.py`)
    lookahead: int | None  # bagpipe's L, else None
    cache_rows: int | None  # capacity R of lru/lfu/fae/belady, else None
    batches: int  # number of batches simulated
    accesses: int  # every (sample, table) access (= unique_accesses if not known)
    unique_accesses: int  # sum over batches of |U_b|
    fetched_rows: int  # rows transferred from the embedding servers into the cache
    peak_resident_rows: int  # most rows held by the trainer cache at one batch
    fetched_per_batch: np.ndarray = field(repr=False, compare=False, default=None)  # int64 [batches]

    @property
    def hit_rate(self) -> float:
        """1 - fetched_rows / unique_accesses (fae can go below 0: its initial load counts)."""
        return 1.0 - self.fetched_rows / self.unique_accesses if self.unique_accesses else 0.0

    def fetched_bytes(self, dim: int = 64, bytes_per_value: int = 4) -> int:
        """Bytes transferred at embedding dimension `dim` (fp32 by default)."""
        return self.fetched_rows * dim * bytes_per_value

    JSON_FIELDS = ("policy", "lookahead", "cache_rows", "batches", "fetched_rows", "accesses",
                   "unique_accesses", "hit_rate", "peak_resident_rows", "fetched_bytes")

    def to_json(self, dim: int = 64) -> dict:
        return {
            "policy": self.policy,
            "lookahead": self.lookahead,
            "cache_rows": self.cache_rows,
            "batches": self.batches,
            "fetched_rows": self.fetched_rows,
            "accesses": self.accesses,
            "unique_accesses": self.unique_accesses,
            "hit_rate": self.hit_rate,
            "peak_resident_rows": self.peak_resident_rows,
            "fetched_bytes": self.fetched_bytes(dim),
        }


def _result(policy: str, trace: Trace, fetched: np.ndarray, peak: int,
            lookahead: int | None = None, cache_rows: int | None = None) -> PolicyResult:
    return PolicyResult(
        policy=policy, lookahead=lookahead, cache_rows=cache_rows, batches=len(trace),
        accesses=trace.accesses, unique_accesses=trace.unique_accesses,
        fetched_rows=int(fetched.sum()), peak_resident_rows=int(peak),
        fetched_per_batch=fetched,
    )


def check_lookahead(lookahead: int) -> None:
    if int(lookahead) != lookahead or lookahead < 1:
        raise ConfigError(f"--lookahead must be an integer >= 1 (got {lookahead})")


def check_capacity(capacity: int, max_batch_rows: int, batch: int | None = None) -> None:
    """A cache must hold one whole batch: R >= max |U_b|."""
    if int(capacity) != capacity or capacity < 1:
        raise ConfigError(f"--cache-rows must be an integer >= 1 (got {capacity})")
    if capacity < max_batch_rows:
        where = f" (batch {batch})" if batch is not None else ""
        raise ConfigError(
            f"--cache-rows {capacity:,} is below the largest batch's {max_batch_rows:,} unique "
            f"rows{where}; raise --cache-rows or lower --batch-size"
        )


# --------------------------------------------------------------------------- none


def simulate_none(trace: TraceLike) -> PolicyResult:
    """No cache: every batch fetches all its unique rows."""
    tr = as_trace(trace)
    sizes = tr.batch_sizes.astype(np.int64)
    return _result("none", tr, sizes, tr.max_batch_rows)


# --------------------------------------------------------------------------- bagpipe


class BagpipeSimulator:
    """Streams batches through the lookahead rule for several lookaheads at once.

    State is one int32 per row (the last batch that used it), so memory is bounded by the
    rows. `step(U_b)` per batch in order, then `results(...)`.
    """

    def __init__(self, lookaheads: Sequence[int], num_rows: int):
        for lk in lookaheads:
            check_lookahead(lk)
        self.lookaheads = [int(x) for x in lookaheads]
        self.last = np.full(num_rows, -1, dtype=np.int32)  # last batch using the row, -1 never
        self.batches = 0
        self._fetched: list[list[int]] = [[] for _ in self.lookaheads]
        # Chain ends (the batch of a chain's last use) per lookahead, folded into
        # per-batch histograms every so often so memory stays bounded.
        self._ends: list[list[np.ndarray]] = [[] for _ in self.lookaheads]
        self._end_hist = [np.zeros(0, np.int64) for _ in self.lookaheads]

    def step(self, u: np.ndarray) -> None:
        b = self.batches
        prev = self.last[u]
        seen = prev >= 0
        gap = b - prev  # meaningless where not seen
        for i, lk in enumerate(self.lookaheads):
            fetch = ~seen | (gap > min(lk, _INT32_MAX))  # gaps are < 2^31: clamping is exact
            self._fetched[i].append(int(np.count_nonzero(fetch)))
            ended = prev[fetch & seen]  # a new chain starts: the old one ended at `prev`
            if ended.size:
                self._ends[i].append(ended)
        self.last[u] = b
        self.batches = b + 1
        if self.batches % 512 == 0:
            self._fold()

    def _fold(self) -> None:
        n = self.batches + 1
        for i in range(len(self.lookaheads)):
            h = self._end_hist[i]
            if h.size < n:
                h = np.concatenate([h, np.zeros(n - h.size, np.int64)])
            if self._ends[i]:
                e = np.concatenate(self._ends[i]).astype(np.int64)
                h += np.bincount(e + 1, minlength=n)[:n]
                self._ends[i] = []
            self._end_hist[i] = h

    def results(self, accesses: int, unique_accesses: int) -> list[PolicyResult]:
        self._fold()
        nb = self.batches
        # Every row's last chain ends at its last use.
        used = self.last[self.last >= 0].astype(np.int64)
        final_ends = np.bincount(used + 1, minlength=nb + 1)
        out = []
        for i, lk in enumerate(self.lookaheads):
            fetched = np.asarray(self._fetched[i], dtype=np.int64)
            diff = np.zeros(nb + 1, np.int64)
            diff[:nb] += fetched  # a chain starts at each fetch ...
            diff -= self._end_hist[i][: nb + 1] + final_ends  # ... and stops after its last use
            resident = np.cumsum(diff)[:nb]
            peak = int(resident.max()) if nb else 0
            out.append(PolicyResult(
                policy="bagpipe", lookahead=lk, cache_rows=None, batches=nb, accesses=accesses,
                unique_accesses=unique_accesses, fetched_rows=int(fetched.sum()),
                peak_resident_rows=peak, fetched_per_batch=fetched,
            ))
        return out


def simulate_bagpipe(trace: TraceLike, lookahead: int) -> PolicyResult:
    """Bagpipe's lookahead cache with lookahead `lookahead` (see the module doc)."""
    check_lookahead(lookahead)
    tr = as_trace(trace)
    sim = BagpipeSimulator([lookahead], tr.num_rows)
    for u in tr:
        sim.step(u)
    return sim.results(tr.accesses, tr.unique_accesses)[0]


# --------------------------------------------------------------------------- fae


def hot_rows(row_counts: np.ndarray, capacity: int) -> np.ndarray:
    """Boolean mask of the `capacity` most-accessed rows (ties: smaller key; count > 0 only)."""
    counts = np.asarray(row_counts)
    hot = np.zeros(counts.shape[0], dtype=bool)
    accessed = np.flatnonzero(counts > 0)  # ascending keys
    c = counts[accessed]
    n = min(int(capacity), c.size)
    if n <= 0:
        return hot
    if n == c.size:
        hot[accessed] = True
        return hot
    v = np.partition(c, c.size - n)[c.size - n]  # the n-th largest count
    above = c > v
    rest = n - int(np.count_nonzero(above))
    hot[accessed[above]] = True
    hot[accessed[c == v][:rest]] = True  # ties: the smaller keys
    return hot


def trace_row_counts(trace: TraceLike) -> np.ndarray:
    """Accesses per row over the whole trace (multiplicities if known, else batches)."""
    tr = as_trace(trace)
    total = np.zeros(tr.num_rows, dtype=np.int64)
    for _, _, keys, counts in tr.chunks():
        add_counts(total, keys, counts)
    return total


def simulate_fae(trace: TraceLike, capacity: int, row_counts: np.ndarray | None = None) -> PolicyResult:
    """FAE's static hot-row cache of `capacity` rows (see the module doc).

    `row_counts` (accesses per row) defaults to the trace's own counts.
    """
    tr = as_trace(trace)
    if int(capacity) != capacity or capacity < 1:
        raise ConfigError(f"--cache-rows must be an integer >= 1 (got {capacity})")
    counts = trace_row_counts(tr) if row_counts is None else np.asarray(row_counts)
    hot = hot_rows(counts, capacity)
    loaded = int(np.count_nonzero(hot))
    per_batch = np.zeros(len(tr), dtype=np.int64)
    for b0, b1, keys, _ in tr.chunks():
        cs = np.concatenate([[0], np.cumsum(~hot[keys], dtype=np.int64)])
        off = tr.offsets[b0 : b1 + 1] - tr.offsets[b0]
        per_batch[b0:b1] = cs[off[1:]] - cs[off[:-1]]
    fetched = per_batch.copy()
    if len(fetched):
        fetched[0] += loaded  # the hot rows are loaded before the first batch
    peak = loaded + (int(per_batch.max()) if len(per_batch) else 0)
    return _result("fae", tr, fetched, peak, cache_rows=int(capacity))


def simulate_decisions(name: str, trace: TraceLike, capacity: int, decide: Callable[..., Any],
                       progress: BatchProgress | None = None) -> PolicyResult:
    """A fixed-capacity policy given only as a planner's decisions (`decide(trace, capacity,
    hot_sample)`, as a system's registry entry names them): replayed batch by batch as the
    engine's planner follows them, counting what each batch fetches and the rows resident
    once its fetch is in (the hot set, if any, from every batch: hot_sample 1)."""
    tr = as_trace(trace)
    d = decide(tr, int(capacity), 1.0)
    nb = len(tr)
    fetched = np.zeros(nb, dtype=np.int64)
    resident = peak = 0
    for b in range(nb):
        x = d.step(b, np.sort(tr.batch(b)))
        resident += len(x.fetch) - len(x.before)
        peak = max(peak, resident)
        resident -= len(x.after)
        fetched[b] = len(x.fetch)
        if progress and (b + 1) % 64 == 0:
            progress(64)
    if progress and nb % 64:
        progress(nb % 64)
    return _result(name, tr, fetched, peak, cache_rows=int(capacity))


# --------------------------------------------------------------------------- lru, lfu, belady


def _run_evicting(policy: str, tr: Trace, capacity: int,
                  primary: Callable[[int, int, np.ndarray], np.ndarray | None], primary_max: int,
                  progress: BatchProgress | None) -> PolicyResult:
    check_capacity(capacity, tr.max_batch_rows, int(np.argmax(tr.batch_sizes)) if len(tr) else None)
    cache = EvictingCache(capacity, tr, primary_max)
    nb = len(tr)
    fetched = np.zeros(nb, dtype=np.int64)
    for b in range(nb):
        lo, u = int(tr.offsets[b]), tr.batch(b)
        fetched[b] = cache.step(u, lo, primary(b, lo, u))
        if progress and (b + 1) % 64 == 0:
            progress(64)
    if progress and nb % 64:
        progress(nb % 64)
    return _result(policy, tr, fetched, cache.peak, cache_rows=int(capacity))


def simulate_lru(trace: TraceLike, capacity: int, progress: BatchProgress | None = None) -> PolicyResult:
    """Batch-granular LRU cache of `capacity` rows (see the module doc)."""
    tr = as_trace(trace)
    return _run_evicting("lru", tr, capacity, lambda b, lo, u: None, 0, progress)


def simulate_lfu(trace: TraceLike, capacity: int, progress: BatchProgress | None = None) -> PolicyResult:
    """LFU cache of `capacity` rows counting every access so far (see the module doc)."""
    tr = as_trace(trace)
    return _run_evicting("lfu", tr, capacity, lfu_priority(tr), lfu_count_bound(tr), progress)


def lfu_count_bound(tr: Trace) -> int:
    """A bound on any row's access count over the trace, LFU's largest priority: the sum
    over batches of the batch's largest multiplicity (about the samples, not the accesses,
    so the priority keys stay within 62 bits on Terabyte-size days)."""
    total = 0
    for b0, b1, _, counts in tr.chunks():
        if counts is None:  # no multiplicities: a row counts once per batch
            total += b1 - b0
            continue
        off = tr.offsets[b0 : b1 + 1] - tr.offsets[b0]
        starts = off[:-1][off[1:] > off[:-1]]  # the non-empty batches
        if starts.size:
            total += int(np.maximum.reduceat(counts, starts).sum(dtype=np.int64))
    return max(total, 1)


def lfu_priority(tr: Trace) -> Callable[[int, int, np.ndarray], np.ndarray]:
    """LFU's eviction priority of batch b's rows `u`: their access counts so far, b included."""
    count = np.zeros(tr.num_rows, dtype=np.int64)

    def primary(b: int, lo: int, u: np.ndarray) -> np.ndarray:
        count[u] += tr.batch_counts(b)
        return count[u]

    return primary


def next_use(trace: TraceLike) -> Column:
    """For each position of the trace, the next batch using the same row (len(trace) if none).

    int32 (batches < 2^31); on disk next to the keys when the trace is spilled.
    """
    tr = as_trace(trace)
    nb = len(tr)
    if nb > _INT32_MAX:
        raise ConfigError("trace too long for this simulator (over 2^31 batches)")
    nxt = np.full(tr.num_rows, nb, dtype=np.int32)
    out = spill_like(tr, "next_use", np.int32)
    for b in range(nb - 1, -1, -1):  # backwards: one vectorised step per batch
        u = tr.batch(b)
        out[tr.offsets[b] : tr.offsets[b + 1]] = nxt[u]
        nxt[u] = b
    return out


def simulate_belady(trace: TraceLike, capacity: int, progress: BatchProgress | None = None) -> PolicyResult:
    """Belady's offline-optimal cache of `capacity` rows (see the module doc)."""
    tr = as_trace(trace)
    nb = len(tr)
    nu = next_use(tr)

    def primary(b: int, lo: int, u: np.ndarray) -> np.ndarray:
        return nb - nu[lo : lo + len(u)].astype(np.int64)  # furthest next use -> smallest key -> evicted first

    return _run_evicting("belady", tr, capacity, primary, max(nb, 1), progress)
