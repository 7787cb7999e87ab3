"""A partitioned cache's plans, every trainer's at once (engine/distributed/rounds.py): one
grouping pass per iteration (`trainer_shares`, `trainer_rounds`, `trainer_sizes`) gives, for
every trainer, element for element and dtype for dtype, what its own definition does
(`trainer_rows`, `trainer_round`), on random Partitions and on the oracle's plans."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from bagpipe_cli.engine.distributed.rounds import PlanWire, id_dtype, trainer_round, trainer_rows
from bagpipe_cli.engine.distributed.shares import (
    trainer_groups,
    trainer_rounds,
    trainer_shares,
    trainer_sizes,
)
from bagpipe_cli.engine.distributed.wire import Encoded, encode
from bagpipe_cli.engine.planning.oracle import Oracle
from bagpipe_cli.engine.planning.partition import Partition
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan


def _random_partition(rng: np.random.Generator, n: int, rows: int, homes_write: bool = True) -> Partition:
    """Rows of 1..n distinct writers in trainer order; a home among them (or, not
    `homes_write`, any trainer); a source that is -1, the home, or any trainer."""
    count = rng.integers(1, n + 1, rows)
    writers = np.concatenate([np.empty(0, np.int64)] + [np.sort(rng.choice(n, c, replace=False))
                                                         for c in count]).astype(np.int16)
    first = np.cumsum(count) - count
    home = writers[first + rng.integers(0, 1 << 20, rows) % count] if homes_write else \
        rng.integers(0, n, rows).astype(np.int16)
    pick = rng.random(rows)
    src = np.where(pick < 0.3, -1, np.where(pick < 0.6, home, rng.integers(0, n, rows)))
    return Partition(count.astype(np.int16), writers, home, src.astype(np.int16))


def _random_round(rng: np.random.Generator, n: int, part: Partition) -> RoundPlan:
    rows = len(part.count)
    uniq = np.sort(rng.choice(50 * rows + 1, rows, replace=False)).astype(np.int64)
    evict = np.sort(rng.choice(uniq, rows // 3, replace=False))
    p = IterPlan(b=3, uniq=uniq, inverse=rng.integers(0, max(rows, 1), 4 * rows).astype(np.int32),
                 slots=np.arange(rows, dtype=np.int32), fetched=int((part.src < 0).sum()),
                 evict_keys=evict, evict_slots=np.arange(len(evict), dtype=np.int32), sync_now=1,
                 sync_later=2, no_sync=3, no_sync_owner_rows=np.arange(n), part=part,
                 row_class=rng.integers(0, 3, rows).astype(np.int8),
                 owner=rng.integers(-1, n, rows).astype(np.int16), private_fetched=np.zeros(n, np.int64))
    return RoundPlan(r=1, fetch_keys=uniq[part.src < 0], fetch_slots=np.zeros(int((part.src < 0).sum()), np.int32),
                     iters=[p], pre_evict_keys=uniq[:2].copy(), fetch_owner=np.full(int((part.src < 0).sum()), -1))


def _same(a, b, where: str = "") -> None:
    """Equal in every field, recursively: arrays in dtype and every element."""
    assert type(a) is type(b), where
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{k}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    else:
        assert a == b, where


def _same_on_the_wire(a: Any, b: Any) -> None:
    """The same bytes on the wire (a plan, or what is already encoded)."""
    x, y = (v if isinstance(v, Encoded) else encode(v) for v in (a, b))
    assert x.body.numpy().tobytes() == y.body.numpy().tobytes()
    assert len(x.raw) == len(y.raw) and all(u.equal(v) for u, v in zip(x.raw, y.raw, strict=True))


def _sizes_one_by_one(p: IterPlan, n: int) -> list[np.ndarray]:
    """`trainer_sizes` by its definition: each trainer's own plan, measured."""
    own = [trainer_round(RoundPlan(r=0, fetch_keys=p.uniq[:0], fetch_slots=np.empty(0, np.int32), iters=[p]),
                         i, np.int64, id_dtype(n)).iters[0] for i in range(n)]
    return [np.array([len(q.row_class) for q in own]), np.array([len(q.uniq) for q in own]),
            np.array([len(q.part.writers) for q in own]), np.array([len(q.evict_keys) for q in own])]


@pytest.mark.parametrize("homes_write", [True, False])
def test_every_trainers_share_in_one_pass_is_its_own(homes_write):
    """On random Partitions of 1 to 9 trainers: `trainer_shares` gives each trainer the rows
    and pairs `trainer_rows` does, whether it reads each row, and its pairs of each row; and
    `trainer_rounds`, `trainer_sizes` equal their one-trainer definitions, field for field.
    (homes_write False: a home that is not a writer, which the oracle never makes.)"""
    rng = np.random.default_rng(7 + homes_write)
    seen = {"not read": 0, "homed": 0, "own": 0, "fetched": 0}
    for n in range(1, 10):
        for rows in (0, 1, 40, 300):
            part = _random_partition(rng, n, rows, homes_write)
            sh = trainer_shares(part, n)
            assert len(sh.at) == len(sh.pair_at) == n + 1
            for i in range(n):
                need, mask = trainer_rows(part, i)
                r, q = slice(*sh.at[i:i + 2]), slice(*sh.pair_at[i:i + 2])
                _same(sh.rows[r], need, f"n={n} rows={rows} trainer {i} rows")
                _same(sh.pairs[q], np.flatnonzero(mask), f"n={n} rows={rows} trainer {i} pairs")
                assert np.array_equal(sh.reads[r], np.isin(need, part.rows_of(i)))
                assert np.array_equal(sh.count[r], np.bincount(np.searchsorted(need, part.pair_row[mask]),
                                                               minlength=len(need)))
                homed = (part.src[need] == i) | (part.home[need] == i)
                seen["not read"] += int((~sh.reads[r]).sum())
                seen["homed"] += int(homed.sum())
                seen["own"] += int((~homed).sum())
                seen["fetched"] += int((part.src[need] < 0).sum())
            for lo, hi in trainer_groups(n, 3):  # a group of trainers' shares: the same
                g = trainer_shares(part, n, lo, hi)
                for i in range(lo, hi):
                    r, q, k = slice(*sh.at[i:i + 2]), slice(*sh.pair_at[i:i + 2]), i - lo
                    rg, qg = slice(*g.at[k:k + 2]), slice(*g.pair_at[k:k + 2])
                    for x, y in ((sh.rows[r], g.rows[rg]), (sh.pairs[q], g.pairs[qg]),
                                 (sh.reads[r], g.reads[rg]), (sh.count[r], g.count[rg])):
                        _same(x, y, f"n={n} rows={rows} trainer {i} in {lo}..{hi - 1}")
            if rows:
                rp = _random_round(rng, n, part)
                one_by_one = [trainer_round(rp, i, np.int32, id_dtype(n)) for i in range(n)]
                for groups in (1, 2, 4, 9):  # made by that many threads
                    for a, b in zip(trainer_rounds(rp, n, np.int32, id_dtype(n), groups), one_by_one,
                                    strict=True):
                        _same(a, b, f"n={n} rows={rows} groups={groups}")
                        _same_on_the_wire(a, b)
                _same(list(trainer_sizes(rp.iters[0], n)), _sizes_one_by_one(rp.iters[0], n))
    assert min(seen.values()) > 100, seen  # every kind of entry, many times


def _oracle_rounds(n: int, seed: int) -> list[RoundPlan]:
    rng = np.random.default_rng(seed)
    per, tables, rows = 16, 3, 400
    batches = [(rng.zipf(1.2, size=per * n * tables) % rows).astype(np.int64) for _ in range(10)]
    return list(Oracle(rows, 6, 2, n, None, grow=True).plan(batches))


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_every_trainers_round_in_one_pass_is_its_own_on_the_oracles_plans(n):
    """The oracle's rounds: `PlanWire.sends` (every trainer's plan of a round, grouped) sends
    each trainer exactly `trainer_round`'s plan, every field, dtype and byte on the wire; its
    `nbytes` counts them; `trainer_sizes` measures them; the end of the plans goes to each."""
    wire = PlanWire(True, True, 400, trainers=n, groups=(n + 1) // 2)  # made by threads
    for rp in _oracle_rounds(n, n):
        sent = wire.sends(rp)
        assert [j for j, _ in sent] == list(range(n))
        encoded = wire.encoded(rp)  # made and encoded by the threads, as rank 0 sends them
        assert [j for j, _ in encoded] == list(range(n))
        for (i, plan), (_, enc) in zip(sent, encoded, strict=True):
            own = trainer_round(rp, i, np.int32, id_dtype(n))
            _same(plan, own, f"round {rp.r} trainer {i}")
            _same_on_the_wire(plan, own)
            _same_on_the_wire(enc, own)
        assert wire.nbytes(rp) == sum(encode(trainer_round(rp, i, np.int32, id_dtype(n))).nbytes
                                      for i in range(n))
        for p in rp.iters:
            _same(list(trainer_sizes(p, n)), _sizes_one_by_one(p, n))
    assert wire.sends(None) == [(j, None) for j in range(n)]


def test_trainer_groups_cover_every_trainer_once():
    for n in range(1, 70):
        for g in (1, 2, 3, 7, 13, 100):
            ranges = trainer_groups(n, g)
            assert len(ranges) == min(g, n)
            assert [i for lo, hi in ranges for i in range(lo, hi)] == list(range(n))
            assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


def test_the_model_times_both_phases_of_the_making_on_the_oracles_plans(monkeypatch):
    """`simulate`'s PlanMaking runs what rank 0's threads run (shares.py's two phases: every
    chunk bucketed, then every group's plans made from its buckets) and charges the busiest
    task of each; the Partitions it leaves behind still make the same plans."""
    from bagpipe_cli.engine.distributed import shares
    from bagpipe_cli.simulate.planning import PlanMaking

    n, filled, made = 5, [], []
    fill, group = shares.RoundIndex.fill, shares.group_rounds
    monkeypatch.setattr(shares.RoundIndex, "fill", lambda self, c: filled.append(c) or fill(self, c))
    monkeypatch.setattr(shares, "group_rounds", lambda rp, n_, k, i, lo, hi, bk=None:
                        made.append((lo, hi, bk is not None)) or group(rp, n_, k, i, lo, hi, bk))
    timing = PlanMaking(n, 400, groups=3)
    rounds = _oracle_rounds(n, 11)
    for rp in rounds:
        timing.time(rp)
    assert len(timing.per_batch) == min(len(rounds), 8) and min(timing.per_batch) > 0
    assert sorted(set(filled)) == [0, 1, 2]
    assert sorted(set(made)) == [(0, 1, True), (1, 3, True), (3, 5, True)]
    for rp in rounds:
        for i, plan in enumerate(trainer_rounds(rp, n, np.int32, id_dtype(n))):
            _same(plan, trainer_round(rp, i, np.int32, id_dtype(n)))
