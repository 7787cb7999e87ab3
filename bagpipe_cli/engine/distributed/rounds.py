"""What rank 0 sends the trainers each round, and how a trainer makes its Round of it.

Rank 0 sends plans, not samples. A round's plan leaves rank 0 once, down a tree of the
trainers (`relay.py`), and every trainer reads its own samples (keys, dense features and
labels of its slice of each batch) from the dataset's memory-mapped columns, then finds the
position of each of its accesses in U_b itself (`RoundMaker`).

The plan (`shared_round`) holds what every trainer needs and cannot compute from its own
samples: per round the fetched rows, their slots and private owner (each trainer picks its
own with `RoundPlan.fetch_for`), the pre-evicted rows (and a resumed cache's warm rows); per
iteration U_b, the slots, the LRPP classes, each row's one user and the evictions. Keys travel as int32 where the key
space fits, a row's user as int16; the trainer widens them back, so it computes on exactly
the values in-process training does. A system whose trainers need no view of the global
batch (sync: each fetches and pushes its own rows) gets |U_b| alone per iteration, so its
rank 0 sends nothing that grows with the batch. `PlanWire` is that rule for one run; its
`nbytes` is what a plan costs on the wire, which an in-process run counts as its planner's
(`engine/comm/traffic.py`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bagpipe_cli.engine.distributed.wire import encode
from bagpipe_cli.engine.planning.feed import Round, SliceReader
from bagpipe_cli.engine.planning.keys import KeySets
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan

_EMPTY_KEYS = np.empty(0, np.int64)
_EMPTY_SLOTS = np.empty(0, np.int32)
_NO_INVERSE = np.empty(0, np.int32)  # each trainer finds its own accesses' positions


def key_dtype(total_rows: int) -> type:
    """The narrowest integer type of a global row key."""
    return np.int32 if total_rows <= np.iinfo(np.int32).max else np.int64


def shared_round(rp: RoundPlan, global_view: bool, cached: bool, keys: type) -> RoundPlan:
    """Round `rp` as rank 0 sends it to every trainer (see the module docstring); without a
    planned cache (`cached` False) no fetch or eviction lists, which no trainer reads."""
    if not cached:
        return replace(rp, fetch_keys=_EMPTY_KEYS, fetch_slots=_EMPTY_SLOTS, fetch_owner=None,
                       pre_evict_keys=_EMPTY_KEYS, pre_evict_slots=_EMPTY_SLOTS,
                       iters=[_planless_iter(p, global_view, keys) for p in rp.iters])
    owner = rp.fetch_owner.astype(np.int16) if rp.fetch_owner is not None else None
    slots = rp.fetch_slots
    if rp.iters and rp.iters[0].part is not None:  # partitioned: each trainer's slots are its own
        owner, slots = None, _EMPTY_SLOTS
    return replace(rp, fetch_keys=rp.fetch_keys.astype(keys), fetch_owner=owner, fetch_slots=slots,
                   pre_evict_keys=rp.pre_evict_keys.astype(keys),
                   warm=None if rp.warm is None else (rp.warm[0].astype(keys), rp.warm[1]),
                   iters=[_shared_iter(p, keys) for p in rp.iters])


class PlanWire:
    """A run's rounds as the planner sends them (`shared_round` with the run's settings;
    None, the end of the plans, as it is)."""

    def __init__(self, global_view: bool, cached: bool, total_rows: int):
        self.global_view, self.cached, self.keys = global_view, cached, key_dtype(total_rows)

    def __call__(self, rp: RoundPlan | None) -> RoundPlan | None:
        return None if rp is None else shared_round(rp, self.global_view, self.cached, self.keys)

    def nbytes(self, rp: RoundPlan | None) -> int:
        """The bytes of round `rp` (or of the end) on the wire, as `wire.send_obj` sends it."""
        return encode(self(rp)).nbytes


def _shared_iter(p: IterPlan, keys: type) -> IterPlan:
    out = replace(p, uniq=p.uniq.astype(keys), inverse=_NO_INVERSE,
                  evict_keys=p.evict_keys.astype(keys))
    if p.part is not None:  # each trainer's slots are its own; the partition says who reads
        out.slots, out.evict_slots, out.owner = _EMPTY_SLOTS, _EMPTY_SLOTS, None
    elif p.owner is not None:
        out.owner = p.owner.astype(np.int16)
    return out


def _planless_iter(p: IterPlan, global_view: bool, keys: type) -> IterPlan:
    """U_b alone (or only |U_b|, without a global view)."""
    uniq = p.uniq.astype(keys) if global_view else _EMPTY_KEYS
    return replace(p, uniq=uniq, inverse=_NO_INVERSE, slots=_EMPTY_SLOTS, evict_keys=_EMPTY_KEYS,
                   evict_slots=_EMPTY_SLOTS, row_class=None, owner=None, part=None,
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
            if p.global_rows is None:  # U_b sent: each access's position in it
                p.uniq = p.uniq.astype(np.int64)
                p.evict_keys = p.evict_keys.astype(np.int64)
                p.inverse = np.searchsorted(p.uniq, keys).astype(np.int32)
            else:  # only this trainer's own rows
                p.uniq, p.inverse = self.keysets.unique(keys)
            p.inverse_of_trainers = (self.i, 1)
            dense.append(d)
            labels.append(y)
        return Round(rp, dense, labels)
