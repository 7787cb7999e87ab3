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
  together (`trainer_rounds`): per iteration it groups every trainer's share in one pass
  (`trainer_shares`: one sort of all the shares' (trainer, row) entries, about |U_b| + pairs
  of them whatever N), where one trainer's by its definition (`trainer_rows`,
  `trainer_round`) is a pass over the whole Partition; both give the same plans, element for
  element.

Keys travel as int32 where the key space fits, a row's user as int16, a partitioned
cache's trainer indices and counts of writers as int8 where N <= 127; the trainer widens
them back, so it computes on exactly the values in-process training does. `PlanWire` is
that rule for one run; its `nbytes` is what a round's plans cost on the wire, which an
in-process run counts as its planner's (`engine/comm/traffic.py`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from bagpipe_cli.engine.distributed.wire import Encoded, encode
from bagpipe_cli.engine.planning.feed import Round, SliceReader
from bagpipe_cli.engine.planning.keys import KeySets
from bagpipe_cli.engine.planning.partition import Partition
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan

if TYPE_CHECKING:
    from bagpipe_cli.engine.setup import RunSetup

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


@dataclass
class Shares:
    """Every trainer's share of one iteration's Partition (`trainer_shares`), trainer after
    trainer: trainer i's rows are entries at[i]:at[i + 1] of `rows`, `count` and `reads`, its
    pairs pair_at[i]:pair_at[i + 1] of `pairs`."""

    rows: np.ndarray  # positions in U_b: `trainer_rows`'s rows, trainer after trainer
    count: np.ndarray  # of each row's pairs, those the trainer gets (all, where it homes the row)
    reads: np.ndarray  # whether the trainer reads the row at b (is one of its writers)
    pairs: np.ndarray  # pair indices, ascending per trainer: where `trainer_rows`'s mask is True
    at: np.ndarray  # [N + 1]
    pair_at: np.ndarray  # [N + 1]


def _entries(part: Partition, lo: int, hi: int) -> tuple[np.ndarray, ...]:
    """The (trainer, row) entries of the shares of trainers lo..hi-1, each once, in three
    groups: each row with a home before b among them, for that trainer (`src`; -1 is none);
    each row for its home after b, where that is another trainer; each (row, writer) pair
    whose writer is home of neither, for that writer. A row's writers are distinct
    (`pairs_of`), so no two meet. Returns (the first group's rows, the second's, the third's
    pairs, and whether the first two groups' trainers read their rows at b: are writers of
    them). Cheap comparisons over the whole Partition; the rest over these trainers' pairs."""
    mine = np.flatnonzero((part.writers >= lo) & (part.writers < hi))  # these trainers' pairs
    row, w = part.pair_row[mine], part.writers[mine]
    by_src, by_home = w == part.src[row], w == part.home[row]
    src_reads, home_reads = np.zeros(len(part.count), bool), np.zeros(len(part.count), bool)
    src_reads[row[by_src]] = True
    home_reads[row[by_home]] = True
    s = np.flatnonzero((part.src >= max(lo, 0)) & (part.src < hi))
    h = np.flatnonzero((part.home >= max(lo, 0)) & (part.home < hi) & (part.home != part.src))
    return s, h, mine[~(by_src | by_home)], src_reads[s], home_reads[h]


def trainer_shares(part: Partition, n: int, lo: int = 0, hi: int | None = None) -> Shares:
    """The `trainer_rows` of every one of trainers lo..hi-1 of n (default: all n) at once, in
    one pass whatever their number (`trainer_rows` is a pass over the whole Partition per
    trainer): each entry of their shares (`_entries`, about |U_b| + pairs of them for all n)
    an int64 code (trainer, row, its own pair's place in the row + 1 or 0 where it homes the
    row, whether it reads the row), sorted once, so trainer after trainer and row after row;
    a trainer's pairs are then its homed rows' ranges of pairs and its own pairs, in pair
    order. `at` and `pair_at` then count from trainer lo."""
    hi = n if hi is None else hi
    s, h, own, s_reads, h_reads = _entries(part, lo, hi)
    rows, count = len(part.count), part.count.astype(np.int64)
    first = np.cumsum(count) - count
    bits = int(count.max(initial=0)).bit_length() + 1  # (own place + 1, reads)
    shift = bits + max(rows - 1, 1).bit_length()  # (trainer, row, ...)
    if (max(n, 1) - 1).bit_length() + shift > 62:
        raise ValueError(f"{n} trainers of {rows} rows: their codes do not fit int64")
    own_row = part.pair_row[own]
    code = np.sort(np.concatenate([
        (part.src[s].astype(np.int64) << shift) | (s << bits) | s_reads,
        (part.home[h].astype(np.int64) << shift) | (h << bits) | h_reads,
        (part.writers[own].astype(np.int64) << shift) | (own_row << bits)
        | ((own - first[own_row] + 1) << 1) | 1]))
    at = np.searchsorted(code, np.arange(lo, hi + 1, dtype=np.int64) << shift)
    row = code >> bits
    row &= (1 << (shift - bits)) - 1
    place = code >> 1  # in place from here on: these arrays are the size of every share
    place &= (1 << (bits - 1)) - 1
    homed = place == 0
    pairs_of_row = part.count[row].astype(np.int64) - 1
    pairs_of_row *= homed  # all the row's pairs where it homes the row, else its own one
    pairs_of_row += 1
    ends = np.cumsum(pairs_of_row)
    place -= ~homed  # an own pair's place in its row
    start = first[row]
    start += place  # the row's first pair, or the trainer's own
    start -= ends
    start += pairs_of_row
    pairs = np.repeat(start, pairs_of_row)
    pairs += np.arange(len(pairs))
    return Shares(row, pairs_of_row, (code & 1).astype(bool), pairs, at,
                  np.concatenate([[0], ends])[at])


def _own_round(rp: RoundPlan, iters: list[IterPlan], keys: type) -> RoundPlan:
    return replace(rp, fetch_keys=_EMPTY_KEYS, fetch_slots=_EMPTY_SLOTS, fetch_owner=None,
                   fetched_rows=rp.fetch_count, pre_evict_keys=rp.pre_evict_keys.astype(keys),
                   iters=iters)


def trainer_round(rp: RoundPlan, i: int, keys: type, ids: type) -> RoundPlan:
    """Round `rp` of a partitioned cache as rank 0 sends it to trainer i (see the module
    docstring): every list by position in its rows (`trainer_rows`), which a
    `PartitionedCache` reads as it reads U_b once `RoundMaker` has put back the keys of the
    rows it reads; a trainer, writer or count of writers as `ids` (`id_dtype`). One trainer's,
    the definition; `trainer_rounds` makes every trainer's, the same, in one pass."""
    return _own_round(rp, [_trainer_iter(p, i, keys, ids) for p in rp.iters], keys)


def trainer_rounds(rp: RoundPlan, n: int, keys: type, ids: type, groups: int = 1,
                   encoded: bool = False) -> list[Any]:
    """[n] every trainer's `trainer_round` of `rp`, element for element (`encoded`: each as
    `wire.encode` encodes it for the wire), made by `groups` threads, each the trainers of
    one of `trainer_groups` (numpy releases the GIL on their arrays), each iteration's from
    one `trainer_shares` of its trainers."""
    def made(lo: int, hi: int) -> list[Any]:
        return (group_encoded if encoded else group_rounds)(rp, n, keys, ids, lo, hi)

    ranges = trainer_groups(n, groups)
    if len(ranges) == 1:
        return made(0, n)
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="plans") as pool:
        return [plan for plans in pool.map(lambda r: made(*r), ranges) for plan in plans]


def trainer_groups(n: int, groups: int) -> list[tuple[int, int]]:
    """n trainers in min(groups, n) contiguous ranges (lo, hi) of sizes within one."""
    g = max(1, min(groups, n))
    bounds = [j * n // g for j in range(g + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def group_rounds(rp: RoundPlan, n: int, keys: type, ids: type, lo: int, hi: int) -> list[RoundPlan]:
    """The `trainer_round`s of trainers lo..hi-1 of n."""
    iters = [_trainer_iters(p, n, keys, ids, lo, hi) for p in rp.iters]
    return [_own_round(rp, [each[i] for each in iters], keys) for i in range(hi - lo)]


def group_encoded(rp: RoundPlan, n: int, keys: type, ids: type, lo: int, hi: int) -> list[Encoded]:
    """The `trainer_round`s of trainers lo..hi-1 of n, each encoded for the wire."""
    return [encode(plan) for plan in group_rounds(rp, n, keys, ids, lo, hi)]


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
    return replace(p, uniq=p.uniq[rows[~reads]].astype(keys), inverse=_NO_INVERSE,
                   slots=_EMPTY_SLOTS, evict_keys=evicted.astype(keys), evict_slots=_EMPTY_SLOTS,
                   owner=None, row_class=p.row_class[rows], subset_of=len(p.uniq),
                   part=Partition(*(a.astype(ids) for a in (count, part.writers[pairs],
                                                            part.home[rows], part.src[rows]))))


def _trainer_iters(p: IterPlan, n: int, keys: type, ids: type, lo: int, hi: int) -> list[IterPlan]:
    """The `_trainer_iter`s of `p` of trainers lo..hi-1, from one `trainer_shares`."""
    part, sh = p.part, trainer_shares(p.part, n, lo, hi)
    writers, home, src = part.writers[sh.pairs], part.home[sh.rows], part.src[sh.rows]
    row_class, cross = p.row_class[sh.rows], np.flatnonzero(~sh.reads)  # rows it does not read
    key, key_at = p.uniq[sh.rows[cross]], np.searchsorted(cross, sh.at)  # their keys cross
    by = part.home[np.searchsorted(p.uniq, p.evict_keys)]  # each evicted row's home
    ours = np.flatnonzero((by >= lo) & (by < hi))
    evicted = p.evict_keys[ours[np.argsort(by[ours], kind="stable")]]
    ev_at = np.concatenate([[0], np.cumsum(np.bincount(by[ours] - lo, minlength=hi - lo))])
    out = []
    for i in range(hi - lo):
        r, q = slice(*sh.at[i:i + 2]), slice(*sh.pair_at[i:i + 2])
        own = Partition(*(a.astype(ids) for a in (sh.count[r], writers[q], home[r], src[r])))
        out.append(replace(p, uniq=key[slice(*key_at[i:i + 2])].astype(keys), inverse=_NO_INVERSE,
                           slots=_EMPTY_SLOTS, evict_keys=evicted[slice(*ev_at[i:i + 2])].astype(keys),
                           evict_slots=_EMPTY_SLOTS, owner=None, row_class=row_class[r].copy(),
                           subset_of=len(p.uniq), part=own))
    return out


def trainer_sizes(p: IterPlan, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[n] per trainer, the lengths of its plan of iteration `p` (`trainer_round`): its rows,
    their keys that cross (the rows it does not read), its (row, writer) pairs, its evictions;
    counted on every trainer's entries at once (`_entries`)."""
    part = p.part
    s, h, own, _, _ = _entries(part, 0, n)
    t, pairs = (part.src[s], part.home[h], part.writers[own]), (part.count[s], part.count[h], None)
    size = sum(np.bincount(x, minlength=n) for x in t)
    pairs = sum(np.bincount(x, weights=c, minlength=n) for x, c in zip(t, pairs, strict=True))
    reads = np.bincount(part.writers.astype(np.int64), minlength=n)
    evicted = np.bincount(part.home[np.searchsorted(p.uniq, p.evict_keys)].astype(np.int64),
                          minlength=n)
    return size, size - reads, pairs.astype(np.int64), evicted


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
    return replace(p, uniq=p.uniq.astype(keys), inverse=_NO_INVERSE, evict_keys=p.evict_keys.astype(keys),
                   owner=None if p.owner is None else p.owner.astype(np.int16))


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
