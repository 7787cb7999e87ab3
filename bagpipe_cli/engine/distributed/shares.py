"""Every trainer's own plan of a round, made together by G threads (a partitioned cache's rank
0: bagpipe, N > 1; `rounds.py`'s `trainer_round` is one trainer's, the definition).

Trainer i's share of an iteration's Partition (`rounds.trainer_rows`) is made of three kinds
of (trainer, row) entry: a row whose home before b is i (`src`), a row whose home after b is
i and not its home before (`home`), and a (row, writer) pair of i's of a row it is home of
neither (its own pair). The trainers are cut into G contiguous groups (`trainer_groups`),
and a round is made in two phases, each G tasks on G threads:

1. **bucket** (`RoundIndex.fill`, task c): chunk c of every iteration's rows (and their
   pairs and evicted rows, about a G-th of each) has its entries put into G buckets by the
   group of their trainer (a stable radix sort of a byte a entry), and its rows' pair_row
   laid; so no task reads the whole Partition;
2. **make** (`group_rounds`, task g): group g takes its buckets of every chunk (in chunk
   order, so each in the order of the whole arrays), then sorts its trainers' entries once
   (`trainer_shares`: trainer after trainer, row after row) and cuts each trainer's plan
   out of them.

The plans are `trainer_round`'s, element for element, whatever G (tests/test_trainer_plans.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bagpipe_cli.engine.planning.partition import Partition
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan
from bagpipe_cli.engine.planning.slices import pieces

EMPTY_KEYS = np.empty(0, np.int64)
EMPTY_SLOTS = np.empty(0, np.int32)
NO_INVERSE = np.empty(0, np.int32)  # each trainer finds its own accesses' positions


def trainer_groups(n: int, groups: int) -> list[tuple[int, int]]:
    """n trainers in min(groups, n) contiguous ranges (lo, hi) of sizes within one."""
    g = max(1, min(groups, n))
    bounds = [j * n // g for j in range(g + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


@dataclass
class Buckets:
    """One iteration's entries of one group of trainers, each kind in ascending order: pair
    indices whose writer is in the group; rows whose home before b is; rows whose home after
    b is, where it is not the home before; indices in `evict_keys` of the evicted rows whose
    home is."""

    pairs: np.ndarray
    src: np.ndarray
    home: np.ndarray
    evicted: np.ndarray


def _group_of(n: int, ranges: list[tuple[int, int]]) -> np.ndarray:
    """[n + 1] each trainer's group (its index in `ranges`), len(ranges) for a trainer in
    none of them; the last entry (a trainer of -1: no home, fetched) is in none."""
    g = len(ranges)
    table = np.full(n + 1, g, dtype=np.uint8 if g < 255 else np.uint16)
    for j, (lo, hi) in enumerate(ranges):
        table[lo:hi] = j
    return table


def _bucketed(part: Partition, table: np.ndarray, g: int, r0: int, r1: int,
              pair_row: np.ndarray | None = None, uniq: np.ndarray | None = None,
              evict_keys: np.ndarray = EMPTY_KEYS) -> list[Buckets]:
    """Rows r0..r1-1 of an iteration's Partition, their pairs and, given U_b (`uniq`), its
    evicted rows among them, bucketed by group (and their part of `pair_row` laid where it
    is given)."""
    first, pairs = part.first, len(part.writers)
    p0, p1 = (int(first[r]) if r < len(first) else pairs for r in (r0, r1))
    if pair_row is not None:
        pair_row[p0:p1] = np.repeat(np.arange(r0, r1), part.count[r0:r1].astype(np.int64))
    src, home = part.src[r0:r1], part.home[r0:r1]
    moved = table[home]
    moved[home == src] = g  # such a row's entry is its `src` one
    e0 = e1 = 0
    if len(evict_keys) and r1 > r0:  # the evicted rows among r0..r1-1 (evict_keys is sorted)
        e0 = int(np.searchsorted(evict_keys, uniq[r0], "left"))
        e1 = int(np.searchsorted(evict_keys, uniq[r1 - 1], "right"))
    at = np.searchsorted(uniq[r0:r1], evict_keys[e0:e1]) + r0 if e1 > e0 else np.empty(0, np.int64)
    return [Buckets(*x) for x in zip(pieces(table[part.writers[p0:p1]], g, p0),
                                      pieces(table[src], g, r0), pieces(moved, g, r0),
                                      pieces(table[part.home[at]], g, e0), strict=True)]


class RoundIndex:
    """Phase 1 of making a round's plans (see the module docstring): `fill(c)` buckets chunk c
    of every iteration, `buckets(j)` is then group j's of every iteration."""

    def __init__(self, rp: RoundPlan, n: int, ranges: list[tuple[int, int]]):
        self.rp, self.g, self.table = rp, len(ranges), _group_of(n, ranges)
        self.chunks: list[list[list[Buckets]]] = [[] for _ in range(self.g)]  # [chunk][iter][group]
        self.bounds = []  # per iteration, the chunks' row bounds (about a G-th of the pairs each)
        self.rows = []  # per iteration, pair_row to lay (None: known already)
        for p in rp.iters:
            part = p.part
            cuts = np.arange(self.g + 1) * len(part.writers) // self.g
            b = np.searchsorted(part.first, cuts).tolist()
            b[-1] = len(part.count)
            self.bounds.append(b)
            self.rows.append(np.empty(len(part.writers), np.int64) if part._row is None else None)

    def fill(self, c: int) -> None:
        for p, b, row in zip(self.rp.iters, self.bounds, self.rows, strict=True):
            self.chunks[c].append(_bucketed(p.part, self.table, self.g, b[c], b[c + 1], row,
                                            p.uniq, p.evict_keys))

    def done(self) -> None:
        """After every `fill`: the laid pair_rows are the Partitions'."""
        for p, row in zip(self.rp.iters, self.rows, strict=True):
            if row is not None:
                p.part._row = row

    def buckets(self, j: int) -> list[Buckets]:
        """Group j's entries of every iteration, the chunks' in chunk order."""
        return [Buckets(*(np.concatenate([getattr(ch[it][j], f) for ch in self.chunks])
                          for f in ("pairs", "src", "home", "evicted")))
                for it in range(len(self.rp.iters))]


def index(part: Partition, n: int, lo: int, hi: int, uniq: np.ndarray | None = None,
          evict_keys: np.ndarray = EMPTY_KEYS) -> Buckets:
    """Trainers lo..hi-1's entries of an iteration (`_bucketed` in one chunk, on one thread)."""
    if (lo, hi) == (0, n):  # every trainer's
        return Buckets(np.arange(len(part.writers)), np.flatnonzero(part.src >= 0),
                       np.flatnonzero(part.home != part.src), np.arange(len(evict_keys)))
    return _bucketed(part, _group_of(n, [(lo, hi)]), 1, 0, len(part.count), None, uniq, evict_keys)[0]


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


def _entries(part: Partition, bk: Buckets) -> tuple[np.ndarray, ...]:
    """A group's entries (`bk`) as (its `src` rows, its `home` rows, its own pairs: those whose
    writer is home of neither, and whether the first two kinds' trainers read their rows at b:
    are writers of them). A row's writers are distinct (`pairs_of`), so no two kinds meet."""
    mine = bk.pairs
    row, w = part.pair_row[mine], part.writers[mine]
    by_src, by_home = w == part.src[row], w == part.home[row]
    s, h = bk.src, bk.home
    src_reads, home_reads = np.zeros(len(part.count), bool), np.zeros(len(part.count), bool)
    src_reads[row[by_src]] = True
    home_reads[row[by_home]] = True
    s_reads, h_reads = src_reads[s], home_reads[h]
    return s, h, mine[~(by_src | by_home)], s_reads, h_reads


def trainer_shares(part: Partition, n: int, lo: int = 0, hi: int | None = None,
                   bk: Buckets | None = None) -> Shares:
    """The `trainer_rows` of every one of trainers lo..hi-1 of n (default: all n) at once, in
    one pass whatever their number, from their entries (`bk`, or found here): each an int64
    code (trainer, row, its own pair's place in the row + 1 or 0 where it homes the row,
    whether it reads the row), sorted once, so trainer after trainer and row after row; a
    trainer's pairs are then its homed rows' ranges of pairs and its own pairs, in pair order.
    `at` and `pair_at` then count from trainer lo."""
    hi = n if hi is None else hi
    s, h, own, s_reads, h_reads = _entries(part, index(part, n, lo, hi) if bk is None else bk)
    rows, first = len(part.count), part.first
    bits = max(n, 1).bit_length() + 1  # (own place + 1, reads): a row has at most n writers
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


def own_round(rp: RoundPlan, iters: list[IterPlan], keys: type) -> RoundPlan:
    """Round `rp` as a trainer gets it, with its own `iters`: no fetched rows (it finds them in
    its rows' sources), their number."""
    return replace(rp, fetch_keys=EMPTY_KEYS, fetch_slots=EMPTY_SLOTS, fetch_owner=None,
                   fetched_rows=rp.fetch_count, pre_evict_keys=rp.pre_evict_keys.astype(keys),
                   iters=iters)


def group_rounds(rp: RoundPlan, n: int, keys: type, ids: type, lo: int, hi: int,
                 buckets: list[Buckets] | None = None) -> list[RoundPlan]:
    """The `trainer_round`s of trainers lo..hi-1 of n (from their entries of each iteration,
    `buckets`, or found here)."""
    if buckets is None:
        buckets = [index(p.part, n, lo, hi, p.uniq, p.evict_keys) for p in rp.iters]
    iters = [_trainer_iters(p, n, keys, ids, lo, hi, bk) for p, bk in zip(rp.iters, buckets, strict=True)]
    return [own_round(rp, [each[i] for each in iters], keys) for i in range(hi - lo)]


def group_encoded(rp: RoundPlan, n: int, keys: type, ids: type, lo: int, hi: int,
                  buckets: list[Buckets] | None = None) -> list[Any]:
    """`group_rounds`, each plan encoded for the wire (`wire.encode`)."""
    from bagpipe_cli.engine.distributed.wire import encode  # torch: not for --help

    return [encode(plan) for plan in group_rounds(rp, n, keys, ids, lo, hi, buckets)]


def trainer_rounds(rp: RoundPlan, n: int, keys: type, ids: type, groups: int = 1,
                   encoded: bool = False) -> list[Any]:
    """[n] every trainer's `trainer_round` of `rp`, element for element (`encoded`: each as
    `wire.encode` encodes it), made by `groups` threads in two phases (the module docstring)."""
    ranges = trainer_groups(n, groups)
    make = group_encoded if encoded else group_rounds
    if len(ranges) == 1 or not rp.iters:
        return make(rp, n, keys, ids, 0, n)
    ix = RoundIndex(rp, n, ranges)
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="plans") as pool:
        list(pool.map(ix.fill, range(len(ranges))))
        ix.done()
        made = pool.map(lambda j: make(rp, n, keys, ids, *ranges[j], ix.buckets(j)), range(len(ranges)))
        return [plan for plans in made for plan in plans]


def _trainer_iters(p: IterPlan, n: int, keys: type, ids: type, lo: int, hi: int,
                   bk: Buckets) -> list[IterPlan]:
    """The `trainer_round` iterations of `p` of trainers lo..hi-1, from their entries `bk`."""
    part, sh = p.part, trainer_shares(p.part, n, lo, hi, bk)
    writers, home, src = part.writers[sh.pairs], part.home[sh.rows], part.src[sh.rows]
    row_class, cross = p.row_class[sh.rows], np.flatnonzero(~sh.reads)  # rows it does not read
    key, key_at = p.uniq[sh.rows[cross]], np.searchsorted(cross, sh.at)  # their keys cross
    ours = bk.evicted  # evicted rows homed here, by trainer
    by = part.home[np.searchsorted(p.uniq, p.evict_keys[ours])]
    evicted = p.evict_keys[ours[np.argsort(by, kind="stable")]]
    ev_at = np.concatenate([[0], np.cumsum(np.bincount(by - lo, minlength=hi - lo))])
    out = []
    for i in range(hi - lo):
        r, q = slice(*sh.at[i:i + 2]), slice(*sh.pair_at[i:i + 2])
        own = Partition(*(a.astype(ids) for a in (sh.count[r], writers[q], home[r], src[r])))
        out.append(replace(p, uniq=key[slice(*key_at[i:i + 2])].astype(keys), inverse=NO_INVERSE,
                           slots=EMPTY_SLOTS, evict_keys=evicted[slice(*ev_at[i:i + 2])].astype(keys),
                           evict_slots=EMPTY_SLOTS, owner=None, row_class=row_class[r].copy(),
                           subset_of=len(p.uniq), part=own))
    return out


def trainer_sizes(p: IterPlan, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[n] per trainer, the lengths of its plan of iteration `p` (`trainer_round`): its rows,
    their keys that cross (the rows it does not read), its (row, writer) pairs, its evictions;
    counted on every trainer's entries at once (`_entries`)."""
    part = p.part
    s, h, own, _, _ = _entries(part, index(part, n, 0, n))
    t, pairs = (part.src[s], part.home[h], part.writers[own]), (part.count[s], part.count[h], None)
    size = sum(np.bincount(x, minlength=n) for x in t)
    pairs = sum(np.bincount(x, weights=c, minlength=n) for x, c in zip(t, pairs, strict=True))
    reads = np.bincount(part.writers.astype(np.int64), minlength=n)
    evicted = np.bincount(part.home[np.searchsorted(p.uniq, p.evict_keys)].astype(np.int64),
                          minlength=n)
    return size, size - reads, pairs.astype(np.int64), evicted
