"""The Oracle Cacher: looks L batches ahead and plans every cache action of the run.

For every iteration b, with U_b the unique global row keys of the global batch:

- fetched(b) = rows of U_b whose previous use was more than L iterations ago (or never):
  only those can be missing from the cache; a row reused within L iterations stays cached.
- evicted(b) = rows of U_b not used again in (b, b+L]; they are written back after b.
  Consistency follows: a row is only fetched again more than L iterations after its
  eviction, long after its write-back has landed.
- sync lists (LRPP, docs/architecture.md): sync_now = U_b ∩ U_{b+1}; no_sync = rows used by one
  trainer only and evicted after b; sync_later = the rest.
- private rows (the physical partition of LRPP): rows fetched for b that are no_sync at b.
  Their whole stay in the cache is iteration b on one trainer, so only that trainer
  fetches, updates and writes them back (`RoundPlan.fetch_owner`); every other fetched row
  goes to every trainer, which keeps the logically replicated cache exact.

Fetches and evictions are grouped in rounds of C iterations (C <= L): a round's rows are
inserted into the cache before its first iteration, into slots freed by the previous
round's evictions. Slots are assigned here, deterministically, so trainers only gather by
slot. The oracle tracks the peak number of occupied slots. With a fixed capacity it refuses
a round that needs more; a growing cache (`grow`) takes more slots instead (at least an
eighth more at a time), and each round says the capacity its slots need (`RoundPlan.capacity`),
so the trainers grow their caches with it: nothing needs a pass over the whole run first.

Vectorised with numpy: per batch a unique by marking (`engine/planning/keys.py`) and a few
gathers/scatters over arrays indexed by global key (memory bounded by the number of rows).
Every decision is per row, so `planners` workers make it in slices of the key space
(`engine/planning/slices.py`), each its rows' window pass and partition, laid into the
batch's arrays by position in U_b: the same plan whatever the number of workers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe_cli.engine.planning.classes import BatchClasses, BatchLists, joined
from bagpipe_cli.engine.planning.keys import KeySets, UniqueKeys
from bagpipe_cli.engine.planning.partition import (
    NO_SYNC,
    SYNC_LATER,
    SYNC_NOW,
    Partition,
    pairs_of,
    partition,
)
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan
from bagpipe_cli.engine.planning.slices import (
    ALL,
    Split,
    Workers,
    bucket,
    mark_accesses,
    positions,
    size,
    slice_pairs,
    split,
    take,
)
from bagpipe_cli.errors import ConfigError

NEVER = np.iinfo(np.int32).min // 2
__all__ = ["NO_SYNC", "SYNC_LATER", "SYNC_NOW", "Oracle", "plan_peak"]


@dataclass
class _Read:
    """A batch in the oracle's window: U_b, the inverse, and each row's position in the next
    batch's U (-1 where it does not use the row; known once the next batch is read)."""

    uniq: np.ndarray
    inverse: np.ndarray
    split: Split  # its rows by planning worker (`slices.split`)
    next_pos: np.ndarray | None = None
    codes: list[np.ndarray] | None = None  # its (row, writer) pairs, slice by slice, where
    #                                         the cache is partitioned (`Oracle._pairs`)

    @property
    def in_next(self) -> np.ndarray:
        """Which rows the next batch uses (sync_now)."""
        return self.next_pos >= 0 if self.next_pos is not None else np.zeros(len(self.uniq), dtype=bool)


class Oracle:
    """Consumes global batches' keys and yields RoundPlans (see the module docstring).

    Stages: read batch b+L (update `latest`), make b's pairs, fetched and evicted rows,
    partition and LRPP classes, each by the `planners` workers on their slices of the rows
    (on a thread pool, or one after the other on the oracle's thread without `threads`);
    then, on the oracle's thread, the slices gathered and laid together, and at each round
    boundary the previous round's slots freed and the new round's allocated. `workers.cpu` is each
    worker's thread CPU time, `serial_cpu` the oracle thread's own (batches' reading left out).
    """

    def __init__(self, total_rows: int, lookahead: int, round_len: int | None, trainers: int,
                 capacity: int | None, grow: bool = False, lrpp: bool = True, planners: int = 1,
                 threads: bool = True):
        if lookahead < 1:
            raise ConfigError(f"--lookahead must be >= 1 (got {lookahead})")
        c = round_len if round_len is not None else max(1, lookahead // 4)
        # Round r+1 is fetched at the start of round r: a row evicted more than L iterations
        # before its next use must have been written back by then, hence 2C <= L + 1.
        if not 1 <= c <= max(1, (lookahead + 1) // 2):
            raise ConfigError(
                f"--round {c}: must be between 1 and (lookahead + 1) / 2 = {(lookahead + 1) // 2}"
            )
        self.L, self.C, self.N = lookahead, c, trainers
        if grow and capacity is None:
            capacity = 0
        self.capacity, self.grow = capacity, grow
        self.lrpp = lrpp  # classify rows for LRPP (each row's users); False: U_b alone suffices
        # LRPP's physical partition (engine/planning/partition.py): each row's writers and home.
        self.partitioned = lrpp and trainers > 1
        # Written (np.full) rather than left to the OS to zero page by page as rows are first
        # read: every page is touched here once, not by whichever worker reaches it first.
        self.home_of = np.full(total_rows if self.partitioned else 0, 0, dtype=np.int16)
        self.latest = np.full(total_rows, NEVER, dtype=np.int32)  # last read batch using a row
        self.last_used = np.full(total_rows, NEVER, dtype=np.int32)  # last planned use
        self.slot_of = np.full(total_rows, -1, dtype=np.int32)
        self.where = np.full(total_rows, 0, dtype=np.int32)  # a row's position in its latest batch
        self.keysets = KeySets(total_rows)
        self._trainers = np.empty(0, np.int16)
        self._mark = np.zeros(0, dtype=bool)  # the batch's (row, trainer) marks (`_pairs`)
        self._lists: tuple[np.ndarray, ...] = ()  # a batch's private and evicted rows (`_step`)
        # Free slots, a stack (the top at nfree - 1); None: no cache plan (no slots).
        self.free = np.arange(capacity - 1, -1, -1, dtype=np.int32) if capacity is not None else None
        self.nfree = capacity or 0
        self.peak_resident = 0
        self.resident = 0
        self.seconds = 0.0
        self.iterations_planned = 0
        if planners < 1:
            raise ConfigError(f"--planners must be >= 1 (got {planners})")
        self.workers = Workers(planners, threads)
        self.serial_cpu = 0.0

    @property
    def planners(self) -> int:
        return self.workers.k

    def plan(self, batches: Iterable[np.ndarray | UniqueKeys]) -> Iterator[RoundPlan]:
        """`batches` yields each iteration's global keys [B*T] (or their UniqueKeys) in order;
        yields round plans."""
        window: deque[_Read] = deque()  # batches read, not yet planned: b .. b_read
        it = iter(batches)
        b_read = -1
        done = False
        pending: list[tuple] = []  # per-iteration views of the current round
        pending_evicted_slots: list[np.ndarray] = []
        b = 0
        try:
            while True:
                t0, c0, w0 = time.perf_counter(), time.thread_time(), self._inline_cpu()
                # Read ahead until batch b+L is in the window (or the stream ends).
                while not done and b_read < b + self.L:
                    try:
                        keys = next(it)
                    except StopIteration:
                        done = True
                        break
                    b_read += 1
                    window.append(self._read(b_read, keys, window[-1] if window else None))
                if not window:
                    break
                cur = window.popleft()
                lists, part, classes = self._step(b, cur, window[0] if window else None)
                pending.append((b, cur.uniq, cur.inverse, lists, classes, part))
                b += 1
                if len(pending) == self.C or (done and not window):
                    rp = self._close_round(pending, pending_evicted_slots)
                    self.iterations_planned += len(pending)
                    pending = []
                else:
                    rp = None
                self.seconds += time.perf_counter() - t0
                self.serial_cpu += time.thread_time() - c0 - (self._inline_cpu() - w0)
                if rp is not None:
                    yield rp
        finally:
            self.workers.close()

    def _inline_cpu(self) -> float:
        """The workers' CPU time so far where they run on the oracle's thread (else 0)."""
        return 0.0 if self.workers.threads else float(self.workers.cpu.sum())

    def _step(self, b: int, cur: _Read, nxt: _Read | None
              ) -> tuple[BatchLists, Partition | None, BatchClasses]:
        """Batch b's fetched and evicted rows, its LRPP classes and, partitioned, its
        Partition (each row's home carries to its next use, so in order of b), made slice by
        slice (`slices.py`)."""
        uniq, rows, k = cur.uniq, len(cur.uniq), self.workers.k
        sliced = cur.split.local is not None
        classes = BatchClasses(rows, self.N) if self.lrpp else BatchClasses.unclassed(cur.in_next, self.N)
        codes = codes1 = None
        if self.partitioned:
            codes = self._pairs(cur)
            if nxt is not None and cur.next_pos is not None:
                codes1 = self._pairs(nxt)
            count, home, src, first = (np.empty(rows if sliced else 0, dtype=t)
                                       for t in (np.int16, np.int16, np.int16, np.int64))

            def touch(c: int) -> None:  # pages first touched chunk by chunk, not by one slice
                for a in (count, home, src, first):
                    a[c * rows // k:(c + 1) * rows // k] = 0

            if sliced:
                self.workers.run(touch)
        # K slices: each row's private trainer where it is fetched (-1: none), else -2, and
        # whether it is evicted, by position in U_b, each slice writing its own rows
        if not self._lists or len(self._lists[0]) < rows:  # kept from batch to batch
            self._lists = np.empty(rows + rows // 4, np.int64), np.empty(rows + rows // 4, bool)
        private, evicted = (a[:rows] for a in self._lists)

        def task(s: int) -> tuple[Partition | None, tuple]:
            at = cur.split.parts[s]
            u = uniq[at]
            f = self.last_used[u] < b - self.L
            self.last_used[u] = b
            e = self.latest[u] == b
            in_next = cur.next_pos[at] >= 0 if cur.next_pos is not None else np.zeros(len(u), bool)
            p = None
            if codes is not None:
                nx = None
                if codes1 is not None:  # each row's position in b+1's slice, or -1
                    pos = cur.next_pos[at]
                    if nxt.split.local is not None:
                        pos = np.where(pos >= 0, nxt.split.local[pos], -1)
                    nx = (pos, codes1[s], size(nxt.split.parts[s], len(nxt.uniq)))
                p = partition(u, codes[s], self.N, f, self.home_of, nx)
                if sliced:
                    count[at], home[at], src[at] = p.count, p.home, p.src
            # one trainer (no partition): every row's one user
            own = classes.add(at, e, in_next, p, f) if self.lrpp else np.full(int(f.sum()), -1, np.int64)
            if not sliced:
                return p, (np.flatnonzero(f), np.flatnonzero(e), own)
            private[at] = -2
            private[at[f]] = own
            evicted[at] = e
            return p, ()

        done, per = zip(*self.workers.run(task), strict=True)
        if not sliced:
            return BatchLists(*per[0]), done[0], classes
        return (*joined(self.workers, cur.split.parts, done, private, evicted,
                        (count, home, src, first) if codes is not None else None), classes)

    def _grow(self, short: int) -> None:
        """`short` more slots at least, an eighth of the capacity at least (so a cache grows
        a few times, not every round); the new slots go under the free ones."""
        cap = self.capacity
        new = cap + max(short, cap // 8)
        free = np.empty(new, dtype=np.int32)
        added = new - cap
        free[:added] = np.arange(new - 1, cap - 1, -1, dtype=np.int32)
        free[added:added + self.nfree] = self.free[:self.nfree]
        self.free, self.capacity = free, new
        self.nfree += added

    def _read(self, j: int, keys: np.ndarray | UniqueKeys, before: _Read | None) -> _Read:
        """Batch j enters the window: its U_j and inverse; `latest` of its rows becomes j; and
        the rows of U_{j-1} that U_j uses again (sync_now of j-1: they were last read by j-1,
        at their positions there) get their positions in U_j in batch j-1's `next_pos`."""
        uniq, inverse = self.keysets.of(keys)
        r = _Read(uniq, inverse, split(uniq, self.workers.k))
        if r.split.local is not None:
            self.workers.run(lambda c: bucket(r.split, uniq, c))
        if before is not None:
            before.next_pos = np.full(len(before.uniq), -1, dtype=np.int32)

        def task(s: int) -> None:
            at = take(r.split, s)
            u = uniq[at]
            if before is not None:
                again = self.latest[u] == j - 1
                before.next_pos[self.where[u[again]]] = positions(at, again)
            self.latest[u] = j
            self.where[u] = np.arange(len(uniq), dtype=np.int32) if at is ALL else at

        self.workers.run(task)
        r.split.pieces = None  # every slice has taken its rows
        return r

    def _pairs(self, r: _Read) -> list[np.ndarray]:
        """A batch's (row, writer) pairs, slice by slice, made when it is next but one to plan
        (so that the window holds two batches' pairs, not L): each worker marks a K-th of
        the trainers' accesses, then reads its slice's (`slices.py`)."""
        if r.codes is None:
            trainers = self._trainer_of(len(r.inverse))
            if r.split.local is None:  # one worker: the whole batch's
                r.codes = self.workers.run(lambda s: pairs_of(r.inverse, len(r.uniq), trainers, self.N))
            else:  # trainer-aligned shares of the accesses, then each slice's pairs
                k, a, n, cells = self.workers.k, len(r.inverse), self.N, len(r.uniq) * self.N
                cuts = [a // n * (n * w // k) for w in range(k + 1)]
                if len(self._mark) < cells:  # kept from batch to batch: its pages touched once
                    self._mark = np.zeros(cells + cells // 4, dtype=bool)
                mark = self._mark[:cells]
                sp = r.split
                self.workers.run(lambda w: mark_accesses(mark, r.inverse, sp.at, trainers, n, cuts[w], cuts[w + 1]))
                r.codes = self.workers.run(
                    lambda s: slice_pairs(mark, sp.starts[s], sp.starts[s + 1] - sp.starts[s], n))
        return r.codes

    def _close_round(self, pending: list[tuple], evicted_slots: list[np.ndarray]) -> RoundPlan:
        r = pending[0][0] // self.C
        # Free the slots of rows evicted during the previous round.
        if evicted_slots and self.free is not None:
            freed = np.concatenate(evicted_slots)
            self.free[self.nfree:self.nfree + len(freed)] = freed
            self.nfree += len(freed)
        evicted_slots.clear()
        fetch_keys = np.concatenate([u[x.fetched] for (_, u, _, x, _, _) in pending])
        self.resident += len(fetch_keys)
        self.peak_resident = max(self.peak_resident, self.resident)
        if self.free is not None:
            if len(fetch_keys) > self.nfree and self.grow:
                self._grow(len(fetch_keys) - self.nfree)
            if len(fetch_keys) > self.nfree:
                raise ConfigError(
                    f"cache capacity {self.capacity} rows is below the lookahead's need of at "
                    f"least {self.resident} rows (round {r}); raise --cache-rows or lower --lookahead"
                )
            self.nfree -= len(fetch_keys)
            fetch_slots = self.free[self.nfree:self.nfree + len(fetch_keys)][::-1].copy()
            self.slot_of[fetch_keys] = fetch_slots
        else:
            fetch_slots = np.empty(0, np.int32)
        rp = RoundPlan(r, fetch_keys, fetch_slots, resident_after_insert=self.resident,
                       capacity=self.capacity)
        owners = []
        for b, uniq, inverse, lists, classes, part in pending:
            slots = self.slot_of[uniq] if self.free is not None else np.empty(0, np.int32)
            ev_keys = uniq[lists.evicted]
            ev_slots = slots[lists.evicted] if self.free is not None else np.empty(0, np.int32)
            if self.free is not None:
                self.slot_of[ev_keys] = -1
                evicted_slots.append(ev_slots)
            self.resident -= len(ev_keys)
            c = classes
            it = IterPlan(b, uniq, inverse, slots, len(lists.fetched), ev_keys, ev_slots,
                          sync_now=c.now, sync_later=len(uniq) - c.now - c.none, no_sync=c.none,
                          no_sync_owner_rows=c.owner_rows, row_class=c.row_class, owner=c.owner,
                          part=part)
            owner = lists.private
            it.private_fetched = np.bincount(owner[owner >= 0], minlength=self.N)
            owners.append(owner)
            rp.iters.append(it)
        rp.fetch_owner = np.concatenate(owners)
        return rp

    def _trainer_of(self, accesses: int) -> np.ndarray:
        """The trainer of each access of a global batch (trainer i: samples [iB/N, (i+1)B/N))."""
        if len(self._trainers) != accesses:
            self._trainers = (np.arange(accesses) // (accesses // self.N)).astype(np.int16)
        return self._trainers

    @property
    def ms_per_batch(self) -> float:
        return 1e3 * self.seconds / max(1, self.iterations_planned)


def plan_peak(batches: Iterable[np.ndarray | UniqueKeys], total_rows: int, lookahead: int,
              round_len: int | None) -> tuple[int, int]:
    """(peak occupied slots, rows fetched) of a run, without slot assignment."""
    o = Oracle(total_rows, lookahead, round_len, 1, None)
    fetched = 0
    for rp in o.plan(batches):
        fetched += len(rp.fetch_keys)
    return o.peak_resident, fetched
