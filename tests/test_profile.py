"""`bagpipe profile`: skew statistics and cache-policy simulators against the definitions.

The reference implementations below follow the issue's definitions literally (Python
sets and dicts, one batch at a time); the library's vectorised simulators must agree
with them exactly.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe_cli.cli import cli
from bagpipe_cli.data.format import TableSpec, open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.data.writer import DatasetWriter
from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies import trace as trace_mod
from bagpipe_cli.policies.simulators import (
    lfu_count_bound,
    next_use,
    simulate_bagpipe,
    simulate_belady,
    simulate_fae,
    simulate_lfu,
    simulate_lru,
    simulate_none,
    trace_row_counts,
)
from bagpipe_cli.policies.table import TABLE
from bagpipe_cli.policies.trace import (
    DiskArray,
    SpillDir,
    Trace,
    TraceWriter,
    batch_trace,
    table_offsets,
)
from bagpipe_cli.profile import ProfileConfig, run_profile
from bagpipe_cli.profile.plots import _one_in
from bagpipe_cli.profile.skew import SortedCounts, share_label, skew_from_counts

# --------------------------------------------------------------------------- references


def ref_trace(ids: np.ndarray, cards: list[int], batch_size: int):
    """Per-batch unique keys in first-access order (row-major) and their multiplicities."""
    offs = np.concatenate([[0], np.cumsum(cards)[:-1]])
    batches, counts = [], []
    for lo in range(0, ids.shape[0], batch_size):
        d: dict[int, int] = {}  # dicts keep insertion (= first access) order
        for i in range(lo, min(lo + batch_size, ids.shape[0])):
            for t in range(ids.shape[1]):
                k = int(offs[t] + ids[i, t])
                d[k] = d.get(k, 0) + 1
        batches.append(list(d))
        counts.append(list(d.values()))
    return batches, counts


def ref_bagpipe(batches, lookahead):
    fetched, last, start, intervals = 0, {}, {}, []
    for b, u in enumerate(batches):
        for r in u:
            if r not in last or b - last[r] > lookahead:
                fetched += 1
                if r in last:
                    intervals.append((start[r], last[r]))
                start[r] = b
            last[r] = b
    intervals += [(start[r], last[r]) for r in last]
    peak = max((sum(s <= b <= e for s, e in intervals) for b in range(len(batches))), default=0)
    return fetched, peak


def ref_cache(batches, capacity, policy, counts=None):
    """lru / lfu / belady by the definitions; returns (fetched, peak)."""
    counts = counts or [[1] * len(u) for u in batches]
    uses: dict[int, list[int]] = {}
    for b, u in enumerate(batches):
        for r in u:
            uses.setdefault(r, []).append(b)

    def next_use(r, b):
        later = [x for x in uses[r] if x > b]
        return later[0] if later else math.inf

    res: dict[int, tuple[int, int]] = {}  # row -> (last-use batch, first position in it)
    acc: dict[int, int] = {}
    fetched = peak = 0
    for b, (u, c) in enumerate(zip(batches, counts, strict=True)):
        for p, (r, m) in enumerate(zip(u, c, strict=True)):
            fetched += r not in res
            res[r] = (b, p)
            acc[r] = acc.get(r, 0) + m
        cur = set(u)
        excess = len(res) - capacity
        if excess > 0:  # keys do not change while evicting: evict the `excess` smallest
            def key(r, b=b):
                if policy == "lru":
                    return res[r]
                if policy == "lfu":
                    return (acc[r], *res[r])
                return (-next_use(r, b), *res[r])  # belady

            for r in sorted((r for r in res if r not in cur), key=key)[:excess]:
                del res[r]
        peak = max(peak, len(res))
    return fetched, peak


def ref_fae(batches, capacity, counts=None):
    counts = counts or [[1] * len(u) for u in batches]
    acc: dict[int, int] = {}
    for u, c in zip(batches, counts, strict=True):
        for r, m in zip(u, c, strict=True):
            acc[r] = acc.get(r, 0) + m
    hot = set(sorted(acc, key=lambda r: (-acc[r], r))[:capacity])
    cold = [sum(r not in hot for r in u) for u in batches]
    return len(hot) + sum(cold), len(hot) + max(cold)


# --------------------------------------------------------------------------- hand-worked

# Batches 0..4. Rows 1..5.
HAND = [[1, 2, 3], [2, 4], [1, 5], [3, 2], [5]]


def test_none_hand():
    r = simulate_none(HAND)
    assert (r.fetched_rows, r.peak_resident_rows, r.unique_accesses) == (10, 3, 10)  # 3+2+2+2+1
    assert r.hit_rate == 0.0


def test_bagpipe_hand():
    # L=1: b0 fetches 1,2,3; b1: 2 was in U_0 (gap 1) -> only 4; b2: 1 (gap 2) and 5;
    # b3: 3 (gap 3) and 2 (gap 2); b4: 5 (gap 2). 3+1+2+2+1 = 9. Chains never overlap
    # more than batch 0's three rows: peak 3.
    r = simulate_bagpipe(HAND, 1)
    assert (r.fetched_rows, r.peak_resident_rows) == (9, 3)
    # L=2: b0 3; b1: 4; b2: 5 (1 has gap 2); b3: 3 (gap 3); b4: nothing (5 has gap 2) -> 6.
    # Chains: 1 [0,2], 2 [0,3], 3 [0,0] and [3,3], 4 [1,1], 5 [2,4]:
    # resident b0 {1,2,3}, b1 {1,2,4}, b2 {1,2,5}, b3 {2,3,5}, b4 {5} -> peak 3.
    r = simulate_bagpipe(HAND, 2)
    assert (r.fetched_rows, r.peak_resident_rows) == (6, 3)
    assert list(r.fetched_per_batch) == [3, 1, 1, 1, 0]
    # L=100: every row once (5). Chains 1 [0,2], 2 [0,3], 3 [0,3], 4 [1,1], 5 [2,4]:
    # b1 and b2 hold 4 rows.
    r = simulate_bagpipe(HAND, 100)
    assert (r.fetched_rows, r.peak_resident_rows) == (5, 4)


def test_lru_hand():
    # R=3. b0: fetch 1,2,3. b1: fetch 4; evict between 1 and 3 (both last used in b0):
    # 1 was accessed first -> evict 1; cache {3, 2, 4}. b2: fetch 1, 5; evict 3 (b0) and
    # 2 (b1, before 4); cache {4, 1, 5}. b3: fetch 3, 2; evict 4 (b1), then 1 (b2, first
    # access before 5); cache {5, 3, 2}. b4: 5 hits. 3+1+2+2+0 = 8.
    r = simulate_lru(HAND, 3)
    assert (r.fetched_rows, r.peak_resident_rows) == (8, 3)
    assert list(r.fetched_per_batch) == [3, 1, 2, 2, 0]


def test_lfu_hand():
    # R=3, one access per key. Counts after b1: 1:1 2:2 3:1 4:1 -> evict 1 (tie with 3,
    # earlier). b2: fetch 1 (count 2), 5; candidates 2 (2), 3 (1, b0), 4 (1, b1): evict 3, 4.
    # b3: fetch 3 (count 2), 2 hits (3); evict 5 (1) -> {2, 1, 3}. b4: fetch 5 (2); evict 1
    # (count 2, last used b2) before 3 (count 2, b3). 3+1+2+1+1 = 8.
    r = simulate_lfu(HAND, 3)
    assert (r.fetched_rows, r.peak_resident_rows) == (8, 3)
    assert list(r.fetched_per_batch) == [3, 1, 2, 1, 1]


def test_lfu_counts_every_access():
    # b0 reads row 1 five times and row 2 once. R=2. b1 fetches 3 and must evict 1 or 2:
    # LFU evicts 2 (count 1 < 5), so b2's row 1 hits: 2+1+0 = 3. LRU (and LFU without the
    # multiplicities, where 1 and 2 tie and 1 came first) evict 1 and fetch it again: 4.
    tr = Trace.from_batches([[1, 2], [3], [1]], counts=[[5, 1], [1], [1]])
    assert simulate_lfu(tr, 2).fetched_rows == 3
    assert simulate_lru(tr, 2).fetched_rows == 4
    assert simulate_lfu([[1, 2], [3], [1]], 2).fetched_rows == 4
    assert tr.accesses == 8 and tr.unique_accesses == 4


def test_belady_hand():
    # R=3. Next uses: 1: b2; 2: b1, b3; 3: b3; 4: never; 5: b4.
    # b1: fetch 4; evict 3 (next b3) over 1 (b2). b2: fetch 5; evict 4 (never) over 2 (b3).
    # b3: fetch 3; evict 1 (never) over 5 (b4). b4: 5 hits. 3+1+1+1+0 = 6.
    r = simulate_belady(HAND, 3)
    assert (r.fetched_rows, r.peak_resident_rows) == (6, 3)


def test_belady_ties_as_lru():
    # R=2. b1 fetches 3; rows 1 and 2 are never used again: evict 1 (first accessed
    # earlier). b2 then needs 2: a hit. Evicting 2 instead would fetch it: 4.
    assert simulate_belady([[1, 2], [3], [2]], 2).fetched_rows == 3


def test_fae_hand():
    # Access counts 1:2 2:3 3:2 4:1 5:2; R=2 -> hot {2, 1} (1 wins the tie at 2 by the
    # smaller key). Loaded 2, then the cold rows 3 | 4 | 5 | 3 | 5: 2+5 = 7; peak 2+1.
    r = simulate_fae(HAND, 2)
    assert (r.fetched_rows, r.peak_resident_rows) == (7, 3)
    # A capacity above the rows ever accessed loads only those (5): nothing else is fetched.
    assert simulate_fae(HAND, 50).fetched_rows == 5


def test_capacity_below_batch_is_an_error():
    with pytest.raises(ConfigError, match="--cache-rows"):
        simulate_lru(HAND, 2)
    with pytest.raises(ConfigError, match="--lookahead"):
        simulate_bagpipe(HAND, 0)


def test_trace_rejects_duplicates():
    with pytest.raises(ValueError, match="duplicate"):
        Trace.from_batches([[1, 1]])


# --------------------------------------------------------------------------- properties


@st.composite
def traces(draw):
    """Random skewed traces: 1..25 batches of up to 8 unique rows out of 40."""
    nb = draw(st.integers(1, 25))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    batches, counts = [], []
    for _ in range(nb):
        n = int(rng.integers(1, 12))
        ids = np.minimum(rng.zipf(1.3, n), 40)
        d: dict[int, int] = {}
        for i in ids:
            d[int(i)] = d.get(int(i), 0) + 1
        batches.append(list(d))
        counts.append(list(d.values()))
    return batches, counts


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.integers(0, 12), st.integers(1, 30))
def test_policies_match_references(tc, extra, lookahead):
    batches, counts = tc
    tr = Trace.from_batches(batches, counts)
    cap = tr.max_batch_rows + extra
    distinct = len({r for u in batches for r in u})
    none = simulate_none(tr).fetched_rows
    bag = simulate_bagpipe(tr, lookahead)
    assert (bag.fetched_rows, bag.peak_resident_rows) == ref_bagpipe(batches, lookahead)
    got = {}
    for name, fn in [("lru", simulate_lru), ("lfu", simulate_lfu), ("belady", simulate_belady)]:
        r = fn(tr, cap)
        assert (r.fetched_rows, r.peak_resident_rows) == ref_cache(batches, cap, name, counts), name
        got[name] = r.fetched_rows
    fae = simulate_fae(tr, cap)
    assert (fae.fetched_rows, fae.peak_resident_rows) == ref_fae(batches, cap, counts)
    # Cross-checks between policies.
    assert got["belady"] <= got["lru"] and got["belady"] <= got["lfu"]
    assert all(none >= f for f in [*got.values(), fae.fetched_rows, bag.fetched_rows])
    assert simulate_bagpipe(tr, 10**9).fetched_rows == distinct
    assert bag.peak_resident_rows <= distinct
    assert simulate_lru(tr, max(cap, distinct)).fetched_rows == distinct
    # The same trace spilled to disk gives the same results.
    sp = spilled(batches, counts, tr.num_rows)
    assert sp.spilled and sp.accesses == tr.accesses
    for p in (p for p in TABLE if p.simulate):
        name = p.name
        a, b = p.simulate(tr, cap, None, None), p.simulate(sp, cap, None, None)
        assert (a.fetched_rows, a.peak_resident_rows) == (b.fetched_rows, b.peak_resident_rows), name
        assert a.fetched_per_batch.tolist() == b.fetched_per_batch.tolist(), name
    # LFU's priority bound holds every row's count, and is no looser than the accesses.
    bound = lfu_count_bound(tr)
    assert trace_row_counts(tr).max(initial=0) <= bound <= max(tr.accesses, 1)
    assert lfu_count_bound(sp) == bound


def test_lfu_bound_is_about_the_samples_not_the_accesses():
    """A Terabyte-size day has ~2^32.1 accesses but ~2^27.4 samples; LFU's priority keys must
    be sized by the latter (a row is counted at most once per sample), or they overflow."""
    batches = [list(range(26)), list(range(26)), [0]]
    tr = Trace.from_batches(batches, [[3] * 26, [2] * 26, [1]])  # 3 and 2 samples, 26 tables
    assert tr.accesses == 131 and lfu_count_bound(tr) == 6 == trace_row_counts(tr).max()
    assert lfu_count_bound(Trace.from_batches(batches)) == 3  # no multiplicities: batches


def test_long_trace_matches_references():
    """Enough batches that the queue is compacted and its runs merge many times."""
    rng = np.random.default_rng(7)
    batches, counts = [], []
    for _ in range(160):
        ids = np.minimum(rng.zipf(1.2, 90), 4000)
        d: dict[int, int] = {}
        for i in ids:
            d[int(i)] = d.get(int(i), 0) + 1
        batches.append(list(d))
        counts.append(list(d.values()))
    tr = Trace.from_batches(batches, counts)
    assert tr.unique_accesses > 2 * 120 + 4096  # past the compaction threshold
    for name, fn in [("lru", simulate_lru), ("lfu", simulate_lfu), ("belady", simulate_belady)]:
        r = fn(tr, 120)
        assert (r.fetched_rows, r.peak_resident_rows) == ref_cache(batches, 120, name, counts), name


def spilled(batches, counts, num_rows: int) -> Trace:
    w = TraceWriter(num_rows, spill_entries=0)  # every batch is written out
    for u, c in zip(batches, counts, strict=True):
        w.add(np.asarray(u), np.asarray(c))
    return w.finish()


def test_spilled_trace_reads_and_cleans_up():
    batches = [[5, 1, 7], [2], [1, 9, 3, 4], [6, 0]]
    counts = [[1, 2, 1], [4], [1, 1, 3, 1], [2, 2]]
    sp = spilled(batches, counts, 10)
    folder = sp.keys.path.parent
    assert sp.spilled and folder.is_dir()
    assert [sp.batch(b).tolist() for b in range(4)] == batches
    assert [sp.batch_counts(b).tolist() for b in range(4)] == counts
    got = [(b0, b1, k.tolist()) for b0, b1, k, _ in sp.chunks(entries=4)]
    assert got == [(0, 2, [5, 1, 7, 2]), (2, 3, [1, 9, 3, 4]), (3, 4, [6, 0])]
    assert [u.tolist() for u in sp.prefix(2)] == batches[:2]
    mem = Trace.from_batches(batches, counts)
    assert next_use(sp)[0:10].tolist() == next_use(mem).tolist() == [4, 2, 4, 4, 4, 4, 4, 4, 4, 4]
    d = DiskArray(SpillDir(), "x", np.int64, 5)
    d[1:4] = np.array([7, 8, 9])
    assert d[0:5].tolist() == [0, 7, 8, 9, 0]
    del sp, d
    import gc
    gc.collect()
    assert not folder.exists()  # the temporary folder goes with the last array using it


# --------------------------------------------------------------------------- trace and skew


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "tiny"
    generate(SynthConfig(preset="tiny", rows=3000, seed=3, max_rows_per_table=300), out)
    return out


def test_batch_trace_matches_reference(tiny):
    ds = open_dataset(tiny)
    ids = ds.sparse_block(0, ds.rows)
    batches, counts = ref_trace(ids, ds.meta.cardinalities, 256)
    tr = batch_trace(ds, 256)
    assert len(tr) == len(batches) == 12  # 11 full batches and one of 184 samples
    for b in range(len(tr)):
        assert tr.batch(b).tolist() == batches[b]
        assert tr.batch_counts(b).tolist() == counts[b]
    assert list(table_offsets(ds.meta)[:2]) == [0, ds.meta.cardinalities[0]]


def test_profile_of_a_spilled_trace_is_the_same(tiny, monkeypatch):
    cfg = ProfileConfig(tiny, batch_size=128, cache_rows=(2000,))
    mem = run_profile(cfg).to_json()
    monkeypatch.setattr(trace_mod, "SPILL_ENTRIES", 1000)
    monkeypatch.setattr(trace_mod, "READ_ENTRIES", 700)
    disk = run_profile(cfg).to_json()
    assert mem["policies"] == disk["policies"] and mem["bagpipe_vs_belady"] == disk["bagpipe_vs_belady"]
    assert mem["trace"]["unique_accesses"] > 1000  # the second run did spill


def test_top_share_of_a_tiny_table_is_not_defined(tmp_path):
    """A table of fewer than 1/p rows has no top p: its one most-accessed row would be more
    than p of it (one row of two read 99% here). Such shares are None (null in profile.json,
    n/a where shown); a table of exactly 1/p rows has its top row's share."""
    rng = np.random.default_rng(0)
    cards = [2, 10, 100, 1000]
    counts = np.concatenate([rng.integers(1, 50, c) for c in cards])
    counts[0], counts[1] = 99, 1  # the two-row table: one row takes 99% of its accesses
    s = skew_from_counts(counts, ["two", "ten", "hundred", "thousand"], cards)
    assert [t.top_share["0.1%"] for t in s.tables][:3] == [None, None, None]
    assert [t.top_share["10%"] is None for t in s.tables] == [True, False, False, False]
    ten = counts[2:12]
    assert s.tables[1].top_share["10%"] == pytest.approx(ten.max() / ten.sum())
    thousand = counts[-1000:]
    assert s.tables[3].top_share["0.1%"] == pytest.approx(thousand.max() / thousand.sum())
    assert s.top_share["0.1%"] is not None  # 1,112 rows overall
    assert json.loads(json.dumps(s.to_json()))["tables"][0]["top_share"]["1%"] is None
    assert [share_label(v) for v in s.tables[0].top_share.values()] == ["n/a"] * 3
    assert _one_in("0.1%") == "1,000" and _one_in("10%") == "10"


def test_skew_exact(tiny):
    ds = open_dataset(tiny)
    res = run_profile(ProfileConfig(tiny, batch_size=500, policies=("none",)))
    ids = ds.sparse_block(0, ds.rows)
    cards = ds.meta.cardinalities
    offs = table_offsets(ds.meta)
    counts = np.bincount((ids + offs).reshape(-1), minlength=sum(cards))
    s = res.skew
    assert s.accesses == ds.rows * len(cards) and s.embedding_rows == sum(cards)
    for f, key in [(Fraction(1, 1000), "0.1%"), (Fraction(1, 100), "1%"), (Fraction(1, 10), "10%")]:
        k = math.ceil(f * sum(cards))
        assert s.top_rows[key] == k
        assert s.top_share[key] == pytest.approx(np.sort(counts)[::-1][:k].sum() / counts.sum(), abs=1e-15)
        for t, tab in enumerate(s.tables):
            c = counts[offs[t] : offs[t] + cards[t]]
            kt = math.ceil(f * cards[t])
            if f * cards[t] < 1:  # fewer rows than 1 / f: no top f
                assert tab.top_share[key] is None
                continue
            assert tab.top_share[key] == pytest.approx(np.sort(c)[::-1][:kt].sum() / c.sum(), abs=1e-15)
    for t, tab in enumerate(s.tables):
        c = np.sort(counts[offs[t] : offs[t] + cards[t]])[::-1]
        c = c[c > 0]
        slope = np.polyfit(np.log(np.arange(1, c.size + 1)), np.log(c), 1)[0]
        assert tab.zipf_exponent == pytest.approx(-slope, rel=1e-9)
        assert tab.accessed_rows == c.size


def test_sorted_counts_cdf_and_ties():
    sc = SortedCounts.of(np.array([0, 5, 1, 5, 2, 0, 1]))
    assert sc.values.tolist() == [5, 2, 1] and sc.rows.tolist() == [2, 1, 2]
    assert sc.top_accesses(np.arange(7)).tolist() == [0, 5, 10, 12, 13, 14, 14]
    x, y = sc.cdf()
    assert x[-1] == 1.0 and y[-1] == 1.0 and np.all(np.diff(y) >= 0)
    big = SortedCounts.of(np.array([10**9, 3, 0]))  # the sort path for huge counts
    assert big.values.tolist() == [10**9, 3] and big.top_accesses(1) == 10**9


# --------------------------------------------------------------------------- CLI


def _run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_cli_help_has_example():
    r = _run(["profile", "--help"])
    assert r.exit_code == 0 and "Example: bagpipe profile" in r.output


def test_cli_profile_writes_outputs(tiny, tmp_path):
    out = tmp_path / "p"
    r = _run(["profile", str(tiny), "--batch-size", "256", "--lookahead", "2,50",
              "--cache-rows", "2000,4000", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "rows fetched" in r.output
    names = {p.name for p in out.iterdir()}
    assert {"profile.json", "profile.csv", "skew_tables.csv", "access_cdf.csv", "per_batch.csv",
            "bagpipe_vs_belady.csv", "access_cdf.png", "table_top_share.png",
            "fetched_vs_lookahead.png", "fetched_vs_cache.png", "lookahead_reuse.csv",
            "reuse_factor.csv", "reuse_histogram.csv", "lookahead_reuse.png",
            "reuse_factor.png"} <= names
    for png in ("lookahead_reuse.png", "reuse_factor.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "what lookahead buys" in r.output and "reuse factor" in r.output
    j = json.loads((out / "profile.json").read_text())
    assert j["schema_version"] == 1
    assert j["trace"]["batches"] == 12 and j["trace"]["last_batch_rows"] == 3000 - 11 * 256
    pol = {(p["policy"], p["lookahead"], p["cache_rows"]): p for p in j["policies"]}
    per_setting = {None: 1, "lookahead": 2, "cache_rows": 2}  # --lookahead 2,50; --cache-rows 2000,4000
    assert len(pol) == sum(per_setting[p.setting] for p in TABLE)
    assert pol[("prefetch", 1, None)]["fetched_rows"] == simulate_bagpipe(
        batch_trace(open_dataset(tiny), 256), 1).fetched_rows
    assert pol[("none", None, None)]["fetched_rows"] == j["trace"]["unique_accesses"]
    b = pol[("bagpipe", 50, None)]
    # the default row width: train's --emb-dim (one default for both)
    assert b["fetched_bytes"] == b["fetched_rows"] * TrainConfig.emb_dim * 4 == b["fetched_rows"] * 16 * 4
    assert b["hit_rate"] == pytest.approx(1 - b["fetched_rows"] / b["unique_accesses"])
    for c in j["bagpipe_vs_belady"]:
        assert c["belady_fetched_rows"] <= c["bagpipe_fetched_rows"]
    df = pd.read_csv(out / "profile.csv")
    assert len(df) == len(j["policies"])
    _check_lookahead_reuse(tiny, out, j)
    # A second run refuses the non-empty directory.
    r = CliRunner().invoke(cli, ["profile", str(tiny), "--batch-size", "256", "--out", str(out)])
    assert r.exit_code == 2 and "--overwrite" in r.output


def _check_lookahead_reuse(tiny: Path, out: Path, j: dict) -> None:
    """What lookahead buys, as written, equals a count with sets on the dataset's batches
    (rows split into tables by the cardinalities); K = 11 (12 batches < --lookahead 50)."""
    ds = open_dataset(tiny)
    cards = ds.meta.cardinalities
    batches, counts = ref_trace(ds.sparse_block(0, ds.rows), cards, 256)
    ends = np.cumsum(cards)
    n, depth = len(batches), j["lookahead_reuse"]["max_k"]
    assert depth == n - 1 == 11
    csv = pd.read_csv(out / "lookahead_reuse.csv", keep_default_na=False).set_index(["table", "k"])
    assert len(csv) == (len(cards) + 1) * depth
    for t, name in [(None, "(all)"), (0, ds.meta.tables[0].name), (5, ds.meta.tables[5].name)]:
        u = [{x for x in b if t is None or int(np.searchsorted(ends, x, side="right")) == t}
             for b in batches]
        for k in (1, 2, 7, 11):
            rows = sum(len(u[b + k]) for b in range(n - k))
            inb = sum(len(u[b + k] & u[b]) for b in range(n - k))
            inw = sum(len(u[b + k] & set().union(*u[b:b + k])) for b in range(n - k))
            line = csv.loc[(name, k)]
            assert (line["rows"], line["in_batch_rows"], line["in_window_rows"]) == (rows, inb, inw)
            assert line["in_window_share"] == pytest.approx(inw / rows)
    overall = j["lookahead_reuse"]["overall"]
    assert overall["in_window_rows"] == csv.loc["(all)"]["in_window_rows"].tolist()
    full = [sum(c) / len(b) for b, c in zip(batches[:-1], counts[:-1], strict=True)]  # last: partial
    f = j["reuse_factor"]
    assert f["batches"] == 11 and f["median"] == pytest.approx(np.median(full))
    assert (f["p10"], f["p90"]) == pytest.approx(tuple(np.percentile(full, [10, 90])))
    hist = pd.read_csv(out / "reuse_histogram.csv")
    assert hist["batches"].sum() == 11 and hist["low"].iloc[0] == pytest.approx(min(full))
    per_batch = pd.read_csv(out / "reuse_factor.csv")
    assert per_batch["reuse_factor"].tolist() == pytest.approx(full + [sum(counts[-1]) / len(batches[-1])])


@pytest.mark.parametrize("args, option", [
    (["--batch-size", "100000"], "--batch-size"),
    (["--batch-size", "256", "--cache-rows", "10"], "--cache-rows"),
    (["--lookahead", "0"], "--lookahead"),
    (["--policies", "lru,magic"], "--policies"),
])
def test_cli_bad_input(tiny, tmp_path, args, option):
    r = CliRunner().invoke(cli, ["profile", str(tiny), "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and option in lines[0], r.output
    assert not (tmp_path / "o").exists()


def test_cli_not_a_dataset(tmp_path):
    r = CliRunner().invoke(cli, ["profile", str(tmp_path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and "not a bagpipe dataset" in r.output


# --------------------------------------------------------------------------- real Criteo head


def _encode_criteo(tsv: Path, out: Path) -> None:
    """A small stand-alone encoder: ids 1..n by decreasing frequency (ties: first seen), '' -> 0."""
    df = pd.read_csv(tsv, sep="\t", header=None, dtype=str, keep_default_na=False)
    labels = df[0].astype(np.float32).to_numpy()
    dense = np.stack([np.log1p(np.maximum(pd.to_numeric(df[c]).fillna(0).to_numpy(), 0))
                      for c in range(1, 14)], axis=1).astype(np.float32)
    tables, cols = [], []
    for j, c in enumerate(range(14, 40)):
        v = df[c]
        nonempty = v[v != ""]
        first = {x: i for i, x in reversed(list(enumerate(nonempty)))}
        freq = nonempty.value_counts()
        order = sorted(freq.index, key=lambda x: (-freq[x], first[x]))
        mapping = {x: i + 1 for i, x in enumerate(order)}
        cols.append(np.array([mapping.get(x, 0) for x in v], dtype=np.int32))
        tables.append(TableSpec(f"C{j + 1}", len(order) + 1))
    w = DatasetWriter(out, tables, [f"I{i}" for i in range(1, 14)], label="label")
    w.write(dense, cols, labels)
    w.finish(name="criteo-head")


def test_criteo_head_profile_matches_definitions(real_data, tmp_path):
    data = tmp_path / "criteo"
    _encode_criteo(real_data / "criteo_kaggle_train_head1999.tsv", data)
    out = tmp_path / "profile"
    r = _run(["profile", str(data), "--batch-size", "100", "--lookahead", "1,3,1000", "--out", str(out)])
    assert r.exit_code == 0, r.output
    j = json.loads((out / "profile.json").read_text())

    ds = open_dataset(data)
    ids, cards = ds.sparse_block(0, ds.rows), ds.meta.cardinalities
    assert ds.rows == 1999 and len(cards) == 26
    batches, counts = ref_trace(ids, cards, 100)
    distinct = len({r for u in batches for r in u})
    assert j["trace"] == {
        "batch_size": 100, "batches": 20, "last_batch_rows": 99, "accesses": 1999 * 26,
        "unique_accesses": sum(map(len, batches)), "max_batch_unique_rows": max(map(len, batches)),
        "distinct_rows": distinct,
    }
    # Skew by brute force.
    offs = np.concatenate([[0], np.cumsum(cards)[:-1]])
    row_counts = np.bincount((ids + offs).reshape(-1), minlength=sum(cards))
    desc = np.sort(row_counts)[::-1]
    for key, f in [("0.1%", Fraction(1, 1000)), ("1%", Fraction(1, 100)), ("10%", Fraction(1, 10))]:
        k = math.ceil(f * sum(cards))
        assert j["skew"]["top_share"][key] == pytest.approx(desc[:k].sum() / (1999 * 26), abs=1e-12)
    # Every policy by the reference implementations.
    caps = j["config"]["cache_rows"]
    peaks = {ref_bagpipe(batches, lk)[1] for lk in (1, 3, 1000)}
    assert caps == sorted(peaks | {2 * max(map(len, batches))})
    pol = {(p["policy"], p["lookahead"], p["cache_rows"]): p for p in j["policies"]}
    assert pol[("none", None, None)]["fetched_rows"] == sum(map(len, batches))
    for lk in (1, 3, 1000):
        p = pol[("bagpipe", lk, None)]
        assert (p["fetched_rows"], p["peak_resident_rows"]) == ref_bagpipe(batches, lk)
    assert pol[("bagpipe", 1000, None)]["fetched_rows"] == distinct
    for cap in caps:
        for name in ("lru", "lfu", "belady"):
            p = pol[(name, None, cap)]
            assert (p["fetched_rows"], p["peak_resident_rows"]) == ref_cache(batches, cap, name, counts)
        p = pol[("fae", None, cap)]
        assert (p["fetched_rows"], p["peak_resident_rows"]) == ref_fae(batches, cap, counts)
    for c in j["bagpipe_vs_belady"]:
        assert c["belady_fetched_rows"] == ref_cache(batches, c["belady_cache_rows"], "belady")[0]


def test_a_profile_of_too_few_batches_warns_and_goes_on(tmp_path):
    """Its defaults (B = 4096, L = 200) on 5,000 rows simulate 2 batches: a warning says so."""
    data = tmp_path / "small"
    generate(SynthConfig(preset="tiny", rows=5000, seed=1), data)
    r = CliRunner().invoke(cli, ["profile", str(data), "--policies", "none,bagpipe",
                                 "--out", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("Warning:")]
    assert len(warnings) == 1 and "2 batches of 4,096, fewer than the lookahead (200) and 10" in warnings[0]
    assert json.loads((tmp_path / "p" / "profile.json").read_text())["warnings"] == [warnings[0][9:]]
    # Enough batches for the lookahead and for 10: no warning.
    assert run_profile(ProfileConfig(data, batch_size=100, lookaheads=(20,),
                                     policies=("none", "bagpipe"))).warnings == []
    # The lookahead counts only for a policy that reads it.
    w = run_profile(ProfileConfig(data, batch_size=400, lookaheads=(20,), policies=("none",))).warnings
    assert w == []
    w = run_profile(ProfileConfig(data, batch_size=400, lookaheads=(20,))).warnings
    assert len(w) == 1 and "13 batches of 400, fewer than the lookahead (20):" in w[0]
