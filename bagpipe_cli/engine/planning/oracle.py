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
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

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
from bagpipe_cli.errors import ConfigError

NEVER = np.iinfo(np.int32).min // 2
__all__ = ["NO_SYNC", "SYNC_LATER", "SYNC_NOW", "Oracle", "plan_peak"]


@dataclass
class _Read:
    """A batch in the oracle's window: U_b, the inverse, and each row's position in the next
    batch's U (-1 where it does not use the row; known once the next batch is read)."""

    uniq: np.ndarray
    inverse: np.ndarray
    next_pos: np.ndarray | None = None
    codes: np.ndarray | None = None  # its (row, writer) pairs, where the cache is partitioned
    #                                   (`Oracle._pairs`)

    @property
    def in_next(self) -> np.ndarray:
        """Which rows the next batch uses (sync_now)."""
        return self.next_pos >= 0 if self.next_pos is not None else np.zeros(len(self.uniq), dtype=bool)


class Oracle:
    """Consumes global batches' keys and yields RoundPlans (see the module docstring).

    Stages (all on the oracle's thread): read batch b+L (update `latest`), finish the
    per-iteration view of b (fetched / evicted / sync lists), and at each round boundary
    free the previous round's slots and allocate the new round's.
    """

    def __init__(self, total_rows: int, lookahead: int, round_len: int | None, trainers: int,
                 capacity: int | None, grow: bool = False, lrpp: bool = True):
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
        self.home_of = np.zeros(total_rows if self.partitioned else 0, dtype=np.int16)
        self.latest = np.full(total_rows, NEVER, dtype=np.int32)  # last read batch using a row
        self.last_used = np.full(total_rows, NEVER, dtype=np.int32)  # last planned use
        self.slot_of = np.full(total_rows, -1, dtype=np.int32)
        self.where = np.zeros(total_rows, dtype=np.int32)  # a row's position in its latest batch
        self.keysets = KeySets(total_rows)
        self._trainers = np.empty(0, np.int16)
        # Free slots, a stack (the top at nfree - 1); None: no cache plan (no slots).
        self.free = np.arange(capacity - 1, -1, -1, dtype=np.int32) if capacity is not None else None
        self.nfree = capacity or 0
        self.peak_resident = 0
        self.resident = 0
        self.seconds = 0.0
        self.iterations_planned = 0

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
        while True:
            t0 = time.perf_counter()
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
            uniq = cur.uniq
            prev = self.last_used[uniq]
            fetch_mask = prev < b - self.L
            self.last_used[uniq] = b
            evict_mask = self.latest[uniq] == b
            in_next = cur.in_next
            part = None
            if self.partitioned:  # in order of b: each row's home carries to its next use
                nxt = ((cur.next_pos, self._pairs(window[0]), len(window[0].uniq))
                       if window and cur.next_pos is not None else None)
                part = partition(uniq, self._pairs(cur), self.N, fetch_mask, self.home_of, nxt)
            pending.append((b, uniq, cur.inverse, fetch_mask, evict_mask, in_next, part))
            self.seconds += time.perf_counter() - t0
            b += 1
            if len(pending) == self.C or (done and not window):
                t0 = time.perf_counter()
                rp = self._close_round(pending, pending_evicted_slots)
                self.seconds += time.perf_counter() - t0
                self.iterations_planned += len(pending)
                pending = []
                yield rp

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
        last = self.latest[uniq]
        if before is not None:
            again = np.flatnonzero(last == j - 1)
            before.next_pos = np.full(len(before.uniq), -1, dtype=np.int32)
            before.next_pos[self.where[uniq[again]]] = again
        self.latest[uniq] = j
        self.where[uniq] = np.arange(len(uniq), dtype=np.int32)
        return _Read(uniq, inverse)

    def _pairs(self, r: _Read) -> np.ndarray:
        """A batch's (row, writer) pairs, made when it is next but one to plan (so that the
        window holds two batches' pairs, not L)."""
        if r.codes is None:
            r.codes = pairs_of(r.inverse, len(r.uniq), self._trainer_of(len(r.inverse)), self.N)
        return r.codes

    def _close_round(self, pending: list[tuple], evicted_slots: list[np.ndarray]) -> RoundPlan:
        r = pending[0][0] // self.C
        # Free the slots of rows evicted during the previous round.
        if evicted_slots and self.free is not None:
            freed = np.concatenate(evicted_slots)
            self.free[self.nfree:self.nfree + len(freed)] = freed
            self.nfree += len(freed)
        evicted_slots.clear()
        fetch_keys = np.concatenate([u[f] for (_, u, _, f, _, _, _) in pending])
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
        for b, uniq, inverse, fetch_mask, evict_mask, in_next, part in pending:
            slots = self.slot_of[uniq] if self.free is not None else np.empty(0, np.int32)
            ev_keys = uniq[evict_mask]
            ev_slots = slots[evict_mask] if self.free is not None else np.empty(0, np.int32)
            if self.free is not None:
                self.slot_of[ev_keys] = -1
                evicted_slots.append(ev_slots)
            self.resident -= len(ev_keys)
            it = self._iter_plan(b, uniq, inverse, slots, int(fetch_mask.sum()),
                                 ev_keys, ev_slots, evict_mask, in_next, part)
            it.part = part
            # Fetched for b and no_sync at b: the row lives in the cache for b alone, on one trainer.
            owner = (np.where(it.row_class[fetch_mask] == NO_SYNC, it.owner[fetch_mask], -1)
                     if self.lrpp else np.full(int(fetch_mask.sum()), -1, np.int64))
            it.private_fetched = np.bincount(owner[owner >= 0], minlength=self.N)
            owners.append(owner)
            rp.iters.append(it)
        rp.fetch_owner = np.concatenate(owners)
        return rp

    def _iter_plan(self, b, uniq, inverse, slots, fetched, ev_keys, ev_slots, evict_mask, in_next,
                   part: Partition | None):
        if not self.lrpp:  # no row's users: every row synchronised (or pushed), none private
            n_now = int(in_next.sum())
            return IterPlan(b, uniq, inverse, slots, fetched, ev_keys, ev_slots, sync_now=n_now,
                            sync_later=len(uniq) - n_now, no_sync=0,
                            no_sync_owner_rows=np.zeros(self.N, np.int64))
        # Which trainers use each row: trainer i holds samples [i*B/N, (i+1)*B/N).
        owner_rows = np.zeros(self.N, dtype=np.int64)
        if self.N == 1:
            single = np.ones(len(uniq), dtype=bool)
            owner = np.zeros(len(uniq), dtype=np.int64)
        else:  # N > 1 with LRPP is partitioned: a row's one user, where it has one, is its writer
            single = part.count == 1
            owner = part.writers[np.cumsum(part.count, dtype=np.int64) - part.count].astype(np.int64)
        no_sync = single & evict_mask
        owner_rows += np.bincount(owner[no_sync], minlength=self.N)
        n_now = int(in_next.sum())
        n_none = int(no_sync.sum())
        row_class = np.full(len(uniq), SYNC_LATER, dtype=np.int8)
        row_class[in_next] = SYNC_NOW
        row_class[no_sync] = NO_SYNC
        return IterPlan(b, uniq, inverse, slots, fetched, ev_keys, ev_slots,
                        sync_now=n_now, sync_later=len(uniq) - n_now - n_none, no_sync=n_none,
                        no_sync_owner_rows=owner_rows, row_class=row_class, owner=owner)

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
