"""Throughput of `bagpipe profile`'s stages, in accesses (sample x table) per second.

    python benchmarks/bench_profile.py [--rows 10000000] [--prefix-rows N]

Generates (once, then reuses) a criteo-kaggle preset synthetic dataset (26 tables, the
real Criteo Kaggle cardinalities, 33.8M embedding rows) under --cache-dir, then times:
skew (per-row counts and statistics), none and bagpipe (streamed with the trace
deduplication included) over the whole dataset, and fae, lru, lfu and belady on the
trace of the first --prefix-rows samples (default: all; the rate is over what was
simulated and excludes building the trace, which costs what `none` costs).
Capacities: Bagpipe's peak at L and 2 x the largest batch's unique rows (as the
`bagpipe profile` defaults).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.policies.simulators import (
    BagpipeSimulator,
    simulate_belady,
    simulate_fae,
    simulate_lfu,
    simulate_lru,
)
from bagpipe_cli.policies.trace import batch_trace, iter_batch_keys
from bagpipe_cli.profile.skew import access_counts, skew_stats

TARGETS = {"skew": 50e6, "none": None, "bagpipe": 20e6, "fae": None, "lru": 2e6, "lfu": 2e6,
           "belady": 2e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="samples in the dataset")
    ap.add_argument("--prefix-rows", type=int, default=None,
                    help="samples simulated by fae, lru, lfu and belady [default: all]")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--lookahead", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path,
                    default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bagpipe-bench")
    args = ap.parse_args()

    data = args.cache_dir / f"criteo-kaggle-{args.rows}"
    if not (data / "meta.json").is_file():
        print(f"generating {data} ...", flush=True)
        t0 = time.perf_counter()
        generate(SynthConfig(preset="criteo-kaggle", rows=args.rows, seed=0), data, overwrite=True)
        print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    ds = open_dataset(data)
    meta = ds.meta
    t = meta.num_tables
    accesses = meta.rows * t
    print(f"dataset {data}: {meta.rows:,} samples x {t} tables = {accesses:,} accesses, "
          f"{sum(meta.cardinalities):,} embedding rows; batch {args.batch_size}, L={args.lookahead}")
    rows: list[tuple[str, str, float, float]] = []

    def report(name: str, setting: str, n: int, dt: float) -> None:
        rows.append((name, setting, n / dt, dt))
        tgt = TARGETS.get(name)
        verdict = "" if tgt is None else ("  ok" if n / dt >= tgt else "  BELOW TARGET")
        tgt_s = "" if tgt is None else f"(target {tgt / 1e6:.0f}M/s)"
        print(f"{name:8s} {setting:22s} {n / dt / 1e6:8.1f} M accesses/s {tgt_s:18s} "
              f"{dt:7.2f} s over {n:,} accesses{verdict}", flush=True)

    access_counts(ds)  # warm the page cache so that every stage reads from memory
    t0 = time.perf_counter()
    skew = skew_stats(ds)
    report("skew", "", accesses, time.perf_counter() - t0)

    t0 = time.perf_counter()
    n_unique = 0
    for u, _ in iter_batch_keys(ds, args.batch_size):
        n_unique += u.size
    report("none", "(= trace dedup)", accesses, time.perf_counter() - t0)

    t0 = time.perf_counter()
    bag = BagpipeSimulator([args.lookahead], sum(meta.cardinalities))
    for u, _ in iter_batch_keys(ds, args.batch_size):
        bag.step(u)
    res = bag.results(accesses, n_unique)[0]
    report("bagpipe", f"L={args.lookahead}", accesses, time.perf_counter() - t0)
    print(f"         fetched {res.fetched_rows:,} of {n_unique:,} unique accesses, "
          f"peak {res.peak_resident_rows:,} rows")

    prefix = meta.rows if args.prefix_rows is None else min(args.prefix_rows, meta.rows)
    tr = batch_trace(ds, args.batch_size, rows=prefix)
    n = prefix * t
    bag = BagpipeSimulator([args.lookahead], tr.num_rows)
    for u in tr:
        bag.step(u)
    peak = bag.results(n, tr.unique_accesses)[0].peak_resident_rows
    caps = sorted({peak, 2 * tr.max_batch_rows})
    print(f"prefix: {prefix:,} samples, {len(tr)} batches, {tr.unique_accesses:,} unique accesses; "
          f"capacities {', '.join(f'{c:,}' for c in caps)}")
    for cap in caps:
        t0 = time.perf_counter()
        simulate_fae(tr, cap, row_counts=skew.row_counts)
        report("fae", f"R={cap:,}", n, time.perf_counter() - t0)
        for name, fn in [("lru", simulate_lru), ("lfu", simulate_lfu), ("belady", simulate_belady)]:
            t0 = time.perf_counter()
            r = fn(tr, cap)
            report(name, f"R={cap:,}", n, time.perf_counter() - t0)
            print(f"         fetched {r.fetched_rows:,}")


if __name__ == "__main__":
    main()
