"""What lookahead buys (`bagpipe_cli/profile/reuse.py`): the streamed counts equal a count
with Python sets, per table and overall, for every distance k, on hand-written and random
traces; the window share is what Bagpipe keeps; the reuse factor is accesses per distinct
row of every batch."""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe_cli.policies.simulators import simulate_bagpipe
from bagpipe_cli.policies.trace import Trace
from bagpipe_cli.profile import reuse as reuse_mod
from bagpipe_cli.profile.reuse import MAX_K, ReuseCounter, reuse_depth

# Two tables: keys 0..3 are table "a"'s rows, 4..9 table "b"'s. Every access of a batch,
# in order (a row may repeat).
STARTS = [0, 4]
NAMES = ["a", "b"]
HAND = [
    [1, 5, 1],
    [1, 2, 6, 6, 6],
    [5, 7, 1, 7],
    [2],
    [1, 5, 6, 8, 9, 1, 9],
    [6, 1],
    [3, 5, 2, 2],
    [0, 7, 6],
]


def brute(batches: list[list[int]], depth: int) -> dict[str | None, tuple[list[int], ...]]:
    """(rows, in_batch, in_window) for k = 1..depth: per table name and overall (None)."""
    n = len(batches)
    out = {}
    for name, keep in [(None, lambda x: True), ("a", lambda x: x < 4), ("b", lambda x: x >= 4)]:
        u = [{x for x in b if keep(x)} for b in batches]
        ks = range(1, depth + 1)
        out[name] = ([sum(len(u[b + k]) for b in range(n - k)) for k in ks],
                     [sum(len(u[b + k] & u[b]) for b in range(n - k)) for k in ks],
                     [sum(len(u[b + k] & set().union(*u[b:b + k])) for b in range(n - k)) for k in ks])
    return out


def counted(batches: list[list[int]], depth: int, starts: list[int] = STARTS,
            num_rows: int = 10, partial_last: bool = False):
    c = ReuseCounter(depth, np.array(starts), num_rows)
    for b in batches:
        keys, first, mult = np.unique(np.array(b, np.int64), return_index=True, return_counts=True)
        order = np.argsort(first)  # first-access order, as the trace gives them
        c.step(keys[order].astype(np.int32), mult[order].astype(np.int32))
    return c.results(200, NAMES[: len(starts)], partial_last)


@pytest.mark.parametrize("depth", [1, 3, len(HAND) - 1])
def test_hand_trace_equals_a_count_with_sets(depth, monkeypatch):
    monkeypatch.setattr(reuse_mod, "MIN_RING_SLOTS", 2)  # the ring grows several times
    reuse, factor = counted(HAND, depth)
    ref = brute(HAND, depth)
    overall = reuse.overall()
    assert [overall[n].tolist() for n in ("rows", "in_batch", "in_window")] == list(ref[None])
    for t, name in enumerate(NAMES):
        assert [reuse.rows[t].tolist(), reuse.in_batch[t].tolist(),
                reuse.in_window[t].tolist()] == list(ref[name])
    # The shares as written: profile.json and lookahead_reuse.csv.
    j = reuse.to_json()
    rows, inb, inw = ref[None]
    assert j["k"] == list(range(1, depth + 1)) and j["max_k"] == depth
    assert j["overall"]["in_batch_share"] == pytest.approx([x / r for x, r in zip(inb, rows, strict=True)])
    assert j["overall"]["in_window_share"] == pytest.approx([x / r for x, r in zip(inw, rows, strict=True)])
    df = reuse.frame().set_index(["table", "k"])
    rows_b, _, inw_b = ref["b"]
    assert df.loc[("b", depth), "in_window_share"] == pytest.approx(inw_b[-1] / rows_b[-1])
    assert df.loc[("(all)", 1), "in_batch_rows"] == inb[0]
    # The reuse factor of every batch: its accesses per distinct row.
    assert factor.factor.tolist() == pytest.approx([len(b) / len(set(b)) for b in HAND])


def test_the_first_distances_by_hand():
    """Batch 1 holds {1, 2, 6}; batch 0 held {1, 5}, so at k = 1 row 1 is in batch b:
    1 of its 3 rows. Over every b at k = 1, batches 1..7 against batches 0..6: rows 1, 1,
    none, none, 6 and 1, none, none: 4 of 3+3+1+5+2+3+3 = 20."""
    reuse, _ = counted(HAND[:2], 1)
    assert reuse.in_batch.sum() == 1 and reuse.rows.sum() == 3
    reuse, _ = counted(HAND, 1)
    assert (reuse.overall()["in_batch"][0], reuse.overall()["rows"][0]) == (4, 20)


def test_random_traces_equal_a_count_with_sets(monkeypatch):
    rng = np.random.default_rng(7)
    for trial in range(12):
        monkeypatch.setattr(reuse_mod, "MIN_RING_SLOTS", int(rng.integers(1, 40)))
        n = int(rng.integers(2, 90))
        batches = [list(dict.fromkeys(((rng.zipf(1.3, int(rng.integers(1, 40))) - 1) % 10).tolist()))
                   for _ in range(n)]
        depth = reuse_depth(int(rng.integers(1, 100)), n)  # up to MAX_K: every bit of the mask
        reuse, _ = counted(batches, depth)
        ref = brute(batches, depth)
        overall = reuse.overall()
        assert [overall[k].tolist() for k in ("rows", "in_batch", "in_window")] == list(ref[None]), trial
        assert [reuse.rows[1].tolist(), reuse.in_batch[1].tolist(),
                reuse.in_window[1].tolist()] == list(ref["b"]), trial


def test_the_window_share_is_what_bagpipe_keeps():
    """Bagpipe at lookahead k fetches a row of batch b+k iff none of batches b..b+k-1 read
    it: its fetches in batches k.. are the rows there less `in_window`."""
    rng = np.random.default_rng(3)
    batches = [list(dict.fromkeys(rng.integers(0, 300, 80).tolist())) for _ in range(70)]
    reuse, _ = counted(batches, MAX_K, starts=[0, 100], num_rows=300)
    o = reuse.overall()
    for k in (1, 5, 64):
        fetched = simulate_bagpipe(Trace.from_batches(batches), k).fetched_per_batch
        assert int(fetched[k:].sum()) == o["rows"][k - 1] - o["in_window"][k - 1]


def test_depth_is_capped_and_the_partial_batch_is_left_out_of_the_summary():
    assert reuse_depth(200, 1000) == MAX_K == 64
    assert reuse_depth(5, 3) == 2 and reuse_depth(200, 1) == 0
    reuse, factor = counted(HAND, 0, partial_last=True)
    assert reuse.frame().empty and reuse.to_json()["k"] == []
    full = [len(b) / len(set(b)) for b in HAND[:-1]]
    s = factor.summary()
    assert s["median"] == pytest.approx(np.median(full)) and s["max"] == pytest.approx(max(full))
    assert factor.histogram()[1].sum() == len(HAND) - 1
    assert factor.frame()["counted"].tolist() == [True] * (len(HAND) - 1) + [False]
    # One batch, partial: it is the only one, so it counts.
    _, one = counted(HAND[:1], 0, partial_last=True)
    assert one.summary()["median"] == pytest.approx(1.5)


def test_pointers_widen_when_the_ring_outgrows_them(monkeypatch):
    """The slot pointers are int32 until the ring passes 2^31 slots; here int16 and 40,000."""
    monkeypatch.setattr(reuse_mod, "MIN_RING_SLOTS", 40_000)
    c = ReuseCounter(3, np.array(STARTS), 10)
    c.latest = c.latest.astype(np.int16)
    for b in HAND:
        keys = np.array(list(dict.fromkeys(b)), np.int32)
        c.step(keys, np.ones(keys.size, np.int32))
    assert c.latest.dtype == np.int64 and c.cap == 40_000
    reuse, _ = c.results(200, NAMES, False)
    assert reuse.in_batch.sum(axis=0).tolist() == brute(HAND, 3)[None][1]
