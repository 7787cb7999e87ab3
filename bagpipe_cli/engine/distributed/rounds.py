"""What rank 0 sends the trainers each round, and how a trainer makes its Round of it.

Rank 0 sends plans, not samples. Every trainer reads its own samples (keys, dense features
and labels of its slice of each batch) from the dataset's memory-mapped columns, then finds
the position of each of its accesses in the plan's rows itself (`RoundMaker`).

What a plan holds is what a trainer needs and cannot compute from its own samples, and two
kinds of plan cross:

- one plan for every trainer (`shared_round`), which leaves rank 0 once, down a tree of the
  trainers (`relay.py`): per round the fetched rows, their slots and private owner (each
  trainer picks its own with `RoundPlan.fetch_for`), the pre-evicted rows (and a resumed
  cache's warm rows); per iteration U_b, the slots, the LRPP classes, each row's one user
  and the evictions. A system whose trainers need no view of the global batch (sync: each
  fetches and pushes its own rows) gets |U_b| alone per iteration, so its rank 0 sends
  nothing that grows with the batch.
- a partitioned cache's (bagpipe, N > 1: `engine/planning/partition.py`) trainer j gets its
  own (`trainer_round`), point to point from rank 0: per iteration only the rows it needs
  (`trainer_rows`: those its samples read and those it is home of before or after b), with
  their LRPP classes, homes and sources, the writers of the rows it is home of (of the
  others, itself), and its own evictions; per round the number of rows fetched (the fetched
  rows themselves it finds in its iterations' sources). The round's counts (fetched,
  sync_now, sync_later, no_sync, |U_b|) stay the global ones, so every trainer takes part in
  every exchange alike. At 8 trainers a trainer's plan was about a tenth of the whole
  (docs/architecture.md, "The distributed schedule"). Rank 0 makes the N plans of a round
  together (`shares.py`'s `trainer_rounds`: K threads, each a group of the trainers' shares
  from one sort of their (trainer, row) entries), where one trainer's by its definition
  (`trainer_rows`, `trainer_round`) is a pass over the whole Partition; both give the same
  plans, element for element.

Keys travel as int32 where the key space fits, a row's user as int16, a partitioned
cache's trainer indices and counts of writers as int8 where N <= 127; the trainer widens
them back, so it computes on exactly the values in-process training does. `PlanWire` is
that rule for one run; its `nbytes` is what a round's plans cost on the wire, which an
in-process run counts as its planner's (`engine/comm/traffic.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from bagpipe_cli.engine.distributed.shares import (
    EMPTY_KEYS,
    EMPTY_SLOTS,
    NO_INVERSE,
    own_round,
    trainer_rounds,
)
from bagpipe_cli.engine.distributed.wire import Encoded, encode
from bagpipe_cli.engine.planning.feed import Round, SliceReader
from bagpipe_cli.engine.planning.keys import KeySets
from bagpipe_cli.engine.planning.partition import Partition
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan

if TYPE_CHECKING:
    from bagpipe_cli.engine.setup import RunSetup


def key_dtype(total_rows: int) -> type:
    """The narrowest integer type of a global row key."""
    return np.int32 if total_rows <= np.iinfo(np.int32).max else np.int64


def shared_round(rp: RoundPlan, global_view: bool, cached: bool, keys: type) -> RoundPlan:
    """Round `rp` as rank 0 sends it to every trainer (see the module docstring); without a
    planned cache (`cached` False) no fetch or eviction lists, which no trainer reads."""
    if not cached:
        return replace(rp, fetch_keys=EMPTY_KEYS, fetch_slots=EMPTY_SLOTS, fetch_owner=None,
                       pre_evict_keys=EMPTY_KEYS, pre_evict_slots=EMPTY_SLOTS,
                       iters=[_planless_iter(p, global_view, keys) for p in rp.iters])
    owner = rp.fetch_owner.astype(np.int16) if rp.fetch_owner is not None else None
    return replace(rp, fetch_keys=rp.fetch_keys.astype(keys), fetch_owner=owner,
                   pre_evict_keys=rp.pre_evict_keys.astype(keys),
                   warm=None if rp.warm is None else (rp.warm[0].astype(keys), rp.warm[1]),
                   iters=[_shared_iter(p, keys) for p in rp.iters])


def own_plans(s: RunSetup) -> bool:
    """Whether rank 0 sends each trainer its own plan (a partitioned cache of N > 1
    trainers: `trainer_round`), not one plan down the relay tree."""
    return s.spec.partitioned and s.cfg.trainers > 1


def trainer_rows(part: Partition, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Trainer i's share of an iteration's Partition: (positions in U_b of the rows it needs,
    sorted: those it reads at b, and those it is home of before b (it delivers them) or after
    it (it sums their partials); a mask of the (row, writer) pairs it needs: every pair of a
    row it is home of, its own of the others). The definition, one trainer at a time, each a
    pass over the whole Partition; `trainer_shares` gives every trainer's in one pass."""
    homed = (part.src == i) | (part.home == i)
    pairs = homed[part.pair_row] | (part.writers == i)
    need = homed.copy()
    need[part.pair_row[pairs]] = True
    return np.flatnonzero(need), pairs


def trainer_round(rp: RoundPlan, i: int, keys: type, ids: type) -> RoundPlan:
    """Round `rp` of a partitioned cache as rank 0 sends it to trainer i (see the module
    docstring): every list by position in its rows (`trainer_rows`), which a
    `PartitionedCache` reads as it reads U_b once `RoundMaker` has put back the keys of the
    rows it reads; a trainer, writer or count of writers as `ids` (`id_dtype`). One trainer's,
    the definition; `trainer_rounds` makes every trainer's, the same, in one pass."""
    return own_round(rp, [_trainer_iter(p, i, keys, ids) for p in rp.iters], keys)


def id_dtype(trainers: int) -> type:
    """The narrowest integer type of a trainer's index (-1 included) and of a row's count of
    writers."""
    return np.int8 if trainers <= np.iinfo(np.int8).max else np.int16


def _trainer_iter(p: IterPlan, i: int, keys: type, ids: type) -> IterPlan:
    part = p.part
    rows, pairs = trainer_rows(part, i)
    count = np.bincount(np.searchsorted(rows, part.pair_row[pairs]), minlength=len(rows))
    reads = np.zeros(len(rows), dtype=bool)
    reads[np.searchsorted(rows, part.rows_of(i))] = True
    evicted = p.evict_keys[part.home[np.searchsorted(p.uniq, p.evict_keys)] == i]  # its own
    return replace(p, uniq=p.uniq[rows[~reads]].astype(keys), inverse=NO_INVERSE,
                   slots=EMPTY_SLOTS, evict_keys=evicted.astype(keys), evict_slots=EMPTY_SLOTS,
                   owner=None, row_class=p.row_class[rows], subset_of=len(p.uniq),
                   part=Partition(*(a.astype(ids) for a in (count, part.writers[pairs],
                                                            part.home[rows], part.src[rows]))))


class PlanWire:
    """A run's rounds as the planner sends them (`shared_round` with the run's settings, or
    with `trainers` > 0 each trainer's own: `trainer_rounds`; None, the end of the plans, as
    it is, to the relay's root or to every trainer)."""

    def __init__(self, global_view: bool, cached: bool, total_rows: int, trainers: int = 0,
                 groups: int = 1):
        self.global_view, self.cached, self.keys = global_view, cached, key_dtype(total_rows)
        self.trainers, self.groups = trainers, groups

    @classmethod
    def of(cls, s: RunSetup, cached: bool) -> PlanWire:
        """The run's: each trainer its own plan where `own_plans`, made by as many threads as
        the oracle has planning workers (`builders.planners`)."""
        if not own_plans(s):
            return cls(s.spec.global_view, cached, s.total_rows)
        from bagpipe_cli.engine.planning.builders import planners

        return cls(s.spec.global_view, cached, s.total_rows, s.cfg.trainers, planners(s))

    @property
    def relayed(self) -> bool:
        """Whether one plan goes down the relay tree (else each trainer gets its own)."""
        return not self.trainers

    def _check(self, rp: RoundPlan | None) -> None:
        if rp is not None and rp.iters and (rp.iters[0].part is None) != self.relayed:
            raise ValueError(f"round {rp.r}: a partitioned cache's plans go to each trainer, "
                             "every other one down the relay tree")

    def sends(self, rp: RoundPlan | None) -> list[tuple[int, RoundPlan | None]]:
        """(trainer, plan) of each plan round `rp` (None: the end) sends: to the relay's
        root, or to each trainer its own."""
        self._check(rp)
        if self.relayed:
            return [(0, None if rp is None else shared_round(rp, self.global_view, self.cached,
                                                             self.keys))]
        if rp is None:
            return [(j, None) for j in range(self.trainers)]
        return list(enumerate(trainer_rounds(rp, self.trainers, self.keys, id_dtype(self.trainers),
                                             self.groups)))

    def encoded(self, rp: RoundPlan | None) -> list[tuple[int, Encoded]]:
        """`sends`, each plan encoded for the wire (`wire.encode`); each trainer's own plans
        made and encoded by the `groups` threads."""
        if self.relayed or rp is None:
            return [(j, encode(plan)) for j, plan in self.sends(rp)]
        self._check(rp)
        return list(enumerate(trainer_rounds(rp, self.trainers, self.keys, id_dtype(self.trainers),
                                             self.groups, encoded=True)))

    def nbytes(self, rp: RoundPlan | None) -> int:
        """The bytes round `rp` (or the end) puts on rank 0's link, every plan of it as
        `wire.send_obj` sends it."""
        return sum(enc.nbytes for _, enc in self.encoded(rp))


def _shared_iter(p: IterPlan, keys: type) -> IterPlan:
    return replace(p, uniq=p.uniq.astype(keys), inverse=NO_INVERSE, evict_keys=p.evict_keys.astype(keys),
                   owner=None if p.owner is None else p.owner.astype(np.int16))


def _planless_iter(p: IterPlan, global_view: bool, keys: type) -> IterPlan:
    """U_b alone (or only |U_b|, without a global view)."""
    uniq = p.uniq.astype(keys) if global_view else EMPTY_KEYS
    return replace(p, uniq=uniq, inverse=NO_INVERSE, slots=EMPTY_SLOTS, evict_keys=EMPTY_KEYS,
                   evict_slots=EMPTY_SLOTS, row_class=None, owner=None, part=None,
                   global_rows=None if global_view else len(p.uniq))


class RoundMaker:
    """A trainer's Rounds from rank 0's plans: its own samples read, its accesses placed."""

    def __init__(self, reader: SliceReader, i: int, total_rows: int):
        self.read, self.i = reader, i
        self.keysets = KeySets(total_rows)

    def __call__(self, rp: RoundPlan) -> Round:
        rp.fetch_keys = rp.fetch_keys.astype(np.int64)
        rp.pre_evict_keys = rp.pre_evict_keys.astype(np.int64)
        if rp.warm is not None:
            rp.warm = (rp.warm[0].astype(np.int64), rp.warm[1])
        dense, labels = [], []
        for p in rp.iters:
            keys, d, y = self.read(p.b)
            if p.subset_of is not None:  # the rows it needs of U_b, but those its samples read
                p.uniq = np.union1d(self.keysets.unique(keys)[0], p.uniq.astype(np.int64))
                p.part = Partition(*(a.astype(np.int16) for a in (p.part.count, p.part.writers,
                                                                  p.part.home, p.part.src)))
            if p.global_rows is None:  # U_b (or its rows of it) sent: each access's position in it
                p.uniq = p.uniq.astype(np.int64)
                p.evict_keys = p.evict_keys.astype(np.int64)
                p.inverse = np.searchsorted(p.uniq, keys).astype(np.int32)
            else:  # only this trainer's own rows
                p.uniq, p.inverse = self.keysets.unique(keys)
            p.inverse_of_trainers = (self.i, 1)
            dense.append(d)
            labels.append(y)
        return Round(rp, dense, labels)
