"""The plan types: what rank 0 (the planner) decides for a round and each of its iterations.

Every plan builder (`engine/planning/builders.py`: the Oracle, a policy's planner) produces
`RoundPlan`s of `IterPlan`s; the trainer loop, every system and both runtimes read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bagpipe_cli.engine.planning.partition import NO_SYNC, SYNC_LATER, SYNC_NOW, Partition

__all__ = ["NO_SYNC", "SYNC_LATER", "SYNC_NOW", "IterPlan", "RoundPlan"]  # row classes: partition.py


@dataclass
class IterPlan:
    """What one iteration does: its rows, where they are in the cache, what to sync/evict."""

    b: int
    uniq: np.ndarray  # U_b: sorted unique global keys of the global batch
    inverse: np.ndarray  # [B*T] position of each (sample, table) access in uniq
    slots: np.ndarray  # [|U_b|] cache slot of each row of uniq (-1 without a cache plan)
    fetched: int  # rows of U_b fetched for this iteration (first use, or reuse gap > L)
    evict_keys: np.ndarray  # rows written back after this iteration
    evict_slots: np.ndarray
    sync_now: int  # |U_b ∩ U_{b+1}|: all-reduced on the critical path
    sync_later: int  # all-reduced asynchronously
    no_sync: int  # used by one trainer only and evicted: never synchronised
    no_sync_owner_rows: np.ndarray  # [N] how many no_sync rows each trainer owns
    row_class: np.ndarray | None = None  # [|U_b|] SYNC_NOW / SYNC_LATER / NO_SYNC per row of uniq
    owner: np.ndarray | None = None  # [|U_b|] the one trainer using a row (meaningful for NO_SYNC)
    private_fetched: np.ndarray | None = None  # [N] rows fetched for b that only trainer i holds
    # The trainers whose accesses `inverse` holds, (first, count) of N: None, all of them; a
    # trainer rank receives only its own (`engine/distributed/rounds.py`).
    inverse_of_trainers: tuple[int, int] | None = None
    # |U_b| where `uniq` holds only one trainer's own rows (a sync trainer rank: it needs no
    # more of the global batch); None: `uniq` is U_b.
    global_rows: int | None = None
    part: Partition | None = None  # the physical partition of U_b (engine/planning/partition.py)
    # |U_b| where `uniq` (and `row_class`, `part`, `evict_keys`) hold only the rows one trainer
    # of a partitioned cache needs (its plan on a trainer rank: `distributed/rounds.py`'s
    # `trainer_round`); None: `uniq` is U_b (or, with `global_rows`, a trainer's own rows).
    subset_of: int | None = None

    @property
    def unique_rows(self) -> int:
        """|U_b|: distinct rows of the global batch."""
        if self.global_rows is not None:
            return self.global_rows
        return len(self.uniq) if self.subset_of is None else self.subset_of

    def accesses_of(self, first: int, count: int, total: int) -> np.ndarray:
        """Positions in U_b of the accesses of trainers first..first+count-1 of `total`
        (trainer i: samples [i B/N, (i+1) B/N), sample by sample)."""
        if self.inverse_of_trainers is not None:
            if self.inverse_of_trainers != (first, count):
                raise ValueError(f"this plan holds the accesses of trainers {self.inverse_of_trainers}")
            return self.inverse
        per = len(self.inverse) // total
        return self.inverse[first * per:(first + count) * per]

    def fetched_by(self, i: int, count: int = 1) -> int:
        """Rows trainers i..i+count-1 fetch for this iteration (the others' private rows excluded)."""
        if self.private_fetched is None:
            return self.fetched
        mine = int(self.private_fetched[i:i + count].sum())
        return self.fetched - int(self.private_fetched.sum()) + mine


@dataclass
class RoundPlan:
    """A round of C iterations: the rows to prefetch (and their slots), then its iterations."""

    r: int
    fetch_keys: np.ndarray
    fetch_slots: np.ndarray
    iters: list[IterPlan] = field(default_factory=list)
    resident_after_insert: int = 0  # occupied slots once this round's rows are inserted
    # Rows evicted (written back) at the round's start, before its rows are inserted
    # (lru/lfu victims); the oracle evicts after iterations instead and leaves these empty.
    pre_evict_keys: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    pre_evict_slots: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    # [len(fetch_keys)] the one trainer a fetched row is private to, -1: every trainer's
    # (None: every row goes to every trainer).
    fetch_owner: np.ndarray | None = None
    capacity: int | None = None  # cache slots the plan needs from this round on (None: no cache)
    # A resumed fixed-capacity cache's first round: (keys, slots) of the rows a run never
    # stopped would hold here, fetched into their slots before anything else (`builders.py`).
    warm: tuple[np.ndarray, np.ndarray] | None = None
    # len(fetch_keys) of the round where `fetch_keys` is left out: a partitioned cache's
    # trainer rank finds its own fetches in its iterations' plans (`distributed/rounds.py`);
    # None: `fetch_keys` is the round's.
    fetched_rows: int | None = None

    @property
    def fetch_count(self) -> int:
        """Rows fetched for the round, by every trainer together (every trainer takes part
        in a round's server exchange when this is not 0)."""
        return len(self.fetch_keys) if self.fetched_rows is None else self.fetched_rows

    def fetch_for(self, i: int, count: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """(keys, slots) trainers i..i+count-1 fetch: every row except the other trainers'
        private ones."""
        if self.fetch_owner is None:
            return self.fetch_keys, self.fetch_slots
        owner = self.fetch_owner
        m = (owner < 0) | ((owner >= i) & (owner < i + count))
        slots = self.fetch_slots[m] if len(self.fetch_slots) else self.fetch_slots  # no cache plan
        return self.fetch_keys[m], slots
