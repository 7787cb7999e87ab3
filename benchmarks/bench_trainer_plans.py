"""Rank 0's time to make every trainer's own plan of an iteration (bagpipe, N > 1), trainer by
trainer as it was, and grouped in one pass as it is now (`engine/distributed/rounds.py`).

A partitioned cache's rank 0 sends each trainer its own share of every iteration
(`trainer_round`). It used to make them one trainer at a time, each a pass over the whole
Partition (`trainer_rows`): O(N (|U_b| + pairs)) per iteration. `trainer_rounds` makes all N
from one sort of every trainer's (trainer, row) entries (`trainer_shares`). Both are timed
on the same synthetic iteration, made with numpy: |U_b| rows, each read by 1 to N trainers
(most by one or two, a hot few by about 63% of them; about `--pairs` (row, writer) pairs a
row), a home among its writers, a source that is the servers (-1) for 30% of the rows, the
home for half, else any trainer; 10% of the rows evicted. Also `trainer_sizes` (what
`bagpipe simulate` counts per iteration), its old per-trainer way kept here as it was. Both
ways are first checked equal (the plans byte for byte as encoded), then called in turn
`--repeat` times (interleaved: a shared machine's load falls on both alike): medians. Each N
runs in a fresh process.

    python benchmarks/bench_trainer_plans.py [--trainers 8,32,64] [--rows 600000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np

from bagpipe_cli.engine.distributed.rounds import id_dtype, trainer_round, trainer_rows
from bagpipe_cli.engine.distributed.shares import trainer_rounds, trainer_sizes
from bagpipe_cli.engine.distributed.wire import encode
from bagpipe_cli.engine.planning.partition import Partition
from bagpipe_cli.engine.planning.plans import IterPlan, RoundPlan


def iteration(n: int, rows: int, pairs: float, seed: int = 0) -> IterPlan:
    """A synthetic iteration of a partitioned cache: |U_b| about `rows`, about `pairs` (row,
    writer) pairs a row (each row's wanted writers drawn with replacement, then made distinct)."""
    rng = np.random.default_rng(seed)
    cold = 1.35  # distinct writers of a row drawn 1 + geometric times, about
    hot = rng.random(rows) < (pairs - cold) / max(0.63 * n - cold, 1)  # read by about 63% of N
    want = np.where(hot, n, rng.geometric(0.7, rows))
    row = np.repeat(np.arange(rows, dtype=np.int64), want)
    codes = np.unique(row * n + rng.integers(0, n, len(row)))
    r, w = np.divmod(codes, n)
    count = np.bincount(r, minlength=rows)
    first = np.cumsum(count) - count
    writers = w.astype(np.int16)
    home = writers[first + rng.integers(0, 1 << 30, rows) % count]
    other = rng.integers(0, n, rows).astype(np.int16)
    src = np.where(rng.random(rows) < 0.3, -1, np.where(rng.random(rows) < 0.5 / 0.7, home, other))
    part = Partition(count.astype(np.int16), writers, home, src.astype(np.int16))
    uniq = np.sort(rng.choice(rows * 20, rows, replace=False)).astype(np.int64)
    evict = np.sort(rng.choice(uniq, rows // 10, replace=False))
    row_class = rng.integers(0, 3, rows).astype(np.int8)
    return IterPlan(b=0, uniq=uniq, inverse=np.empty(0, np.int32), slots=np.arange(rows, dtype=np.int32),
                    fetched=int((src < 0).sum()), evict_keys=evict,
                    evict_slots=np.zeros(len(evict), np.int32), sync_now=0, sync_later=0, no_sync=0,
                    no_sync_owner_rows=np.zeros(n, np.int64), row_class=row_class,
                    owner=np.zeros(rows, np.int16), private_fetched=np.zeros(n, np.int64), part=part)


def old_sizes(p: IterPlan, n: int) -> tuple[np.ndarray, ...]:
    """`trainer_sizes` as it was: `trainer_rows` for every trainer."""
    rows, pairs = zip(*(trainer_rows(p.part, i) for i in range(n)), strict=True)
    reads = np.bincount(p.part.writers.astype(np.int64), minlength=n)
    evicted = np.bincount(p.part.home[np.searchsorted(p.uniq, p.evict_keys)].astype(np.int64),
                          minlength=n)
    size = np.array([len(r) for r in rows])
    return size, size - reads, np.array([int(m.sum()) for m in pairs]), evicted


def timed(fns: list, repeat: int) -> list[float]:
    """Median ms of each of `fns` over `repeat` rounds, one call of each a round (interleaved:
    a shared machine's load falls on all of them alike)."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for f, ms in zip(fns, out, strict=True):
            t0 = time.perf_counter()
            f()
            ms.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(ms) for ms in out]


def row(n: int, rows: int, pairs: float, repeat: int) -> str:
    """One line of the table: N trainers' plans of a synthetic iteration, both ways."""
    p = iteration(n, rows, pairs)
    _ = p.part.pair_row  # derived once per Partition, by either way
    rp = RoundPlan(r=0, fetch_keys=p.uniq[p.part.src < 0], fetch_slots=np.empty(0, np.int32), iters=[p])
    keys, ids = np.int32, id_dtype(n)

    def old() -> list[RoundPlan]:
        return [trainer_round(rp, i, keys, ids) for i in range(n)]

    def new() -> list[RoundPlan]:
        return trainer_rounds(rp, n, keys, ids)

    for a, b in zip(old(), new(), strict=True):  # the same bytes on the wire
        x, y = encode(a), encode(b)
        assert x.body.numpy().tobytes() == y.body.numpy().tobytes()
        assert all(u.equal(v) for u, v in zip(x.raw, y.raw, strict=True))
    assert all(np.array_equal(u, v) for u, v in zip(old_sizes(p, n), trainer_sizes(p, n), strict=True))
    t_old, t_new, s_old, s_new = timed([old, new, lambda: old_sizes(p, n), lambda: trainer_sizes(p, n)],
                                       repeat)
    return (f"| {n} | {len(p.uniq):,} | {len(p.part.writers):,} | {t_old:.1f} | {t_new:.1f} | "
            f"{t_old / t_new:.1f}x | {s_old:.1f} | {s_new:.1f} | {s_old / s_new:.1f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainers", default="8,32,64")
    ap.add_argument("--rows", type=int, default=600_000, help="|U_b|")
    ap.add_argument("--pairs", type=float, default=2.0, help="about this many pairs a row")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a line, in this process
    args = ap.parse_args()
    if args.one:
        print(row(args.one, args.rows, args.pairs, args.repeat))
        return
    print("| N | |U_b| | pairs | plans, old ms/iter | plans, new ms/iter | old / new "
          "| sizes, old ms/iter | sizes, new ms/iter | old / new |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.trainers.split(","):  # each N in a process of its own: one N's heap (the
        #                                 allocator's state) does not weigh on the next one's
        out = subprocess.run([sys.executable, __file__, "--one", n, "--rows", str(args.rows),
                              "--pairs", str(args.pairs), "--repeat", str(args.repeat)],
                             check=True, capture_output=True, text=True)
        print(out.stdout, end="", flush=True)


if __name__ == "__main__":
    main()
