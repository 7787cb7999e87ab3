"""The feed alone: how many samples a second the planner (rank 0) hands the training loop.

Times the very feed the in-process runner uses (`LocalPlanner` over `planned_rounds`: read a
batch, find U_b and the inverse, plan it, queue the round), with no model, for local, sync
and bagpipe at L = 16 and 200, for each number of loader workers, on Criteo-Kaggle-shaped
synthetic data (the 26 Kaggle tables, scaled) at B = 16,384. A GPU trainer eats such a
batch in a few milliseconds, so the feed must outrun that: the targets are 4M samples/s on
16 cores and 2M on a 2-core machine. What comes before the first round is reported apart:
`planning_s`, the plan builder's work before the feed starts (the baselines' pass over the
whole run; bagpipe plans as it goes), and `first_round_s`, from then to the first round
ready. Repeats are interleaved and the median is reported.

    python benchmarks/bench_feed.py [--scale 0.1] [--rows 4000000] [--workers 1,2] [--json]

Prints a table, or with --json one JSON object a line: system, lookahead, batch_size,
workers, samples_per_s (and ms_per_batch, planning_s, first_round_s, repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig
from bagpipe_cli.engine.local.planner import LocalPlanner
from bagpipe_cli.engine.planning.feed import planned_rounds
from bagpipe_cli.engine.setup import prepare

SYSTEMS = ("local", "sync", "bagpipe")  # the default --systems (at --lookaheads 16,200)


def feed_rate(data: Path, system: str, lookahead: int, batch_size: int, iterations: int,
              workers: int) -> tuple[float, float, float]:
    """(samples/s of the feed, seconds of planning before it, seconds to its first round)."""
    cfg = TrainConfig(data=str(data), system=system, batch_size=batch_size, iterations=iterations,
                      lookahead=lookahead, eval_rows=0, device="cpu")
    s = prepare(cfg)
    t0 = time.perf_counter()
    planning = s.spec.plan(s, 0)
    planning_s = time.perf_counter() - t0
    feed = LocalPlanner(planned_rounds(s.ds, cfg, s.train_rows, planning.planner, s.offsets, 0,
                                     workers))
    t0 = time.perf_counter()
    samples = 0
    first = None
    try:
        for rnd in feed:
            first = time.perf_counter() - t0 if first is None else first
            samples += batch_size * len(rnd.plan.iters)
    finally:
        feed.close()
    return samples / (time.perf_counter() - t0), planning_s, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a dataset (default: generate Kaggle-shaped data)")
    ap.add_argument("--scale", type=float, default=0.1, help="table sizes x Kaggle's (synth)")
    ap.add_argument("--rows", type=int, default=4_000_000, help="samples (synth)")
    ap.add_argument("--batch-size", type=int, default=16_384)
    ap.add_argument("--iterations", type=int, default=240)
    ap.add_argument("--workers", default=f"1,{os.cpu_count()}", help="loader workers to try")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--systems", help="comma-separated systems to time (default: local, sync, bagpipe)")
    ap.add_argument("--lookaheads", default="16,200", help="comma-separated lookaheads")
    ap.add_argument("--json", action="store_true", help="one JSON object a line, no table")
    args = ap.parse_args()
    workers = sorted({int(w) for w in args.workers.split(",")})
    systems = args.systems.split(",") if args.systems else SYSTEMS
    lookaheads = [int(x) for x in args.lookaheads.split(",")]
    settings = [(s, la) for la in lookaheads for s in systems]
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "kaggle"
            generate(SynthConfig(preset="criteo-kaggle", scale=args.scale, rows=args.rows, seed=0), data)
        rates: dict[tuple, list[float]] = {}
        plan_s: dict[tuple, list[float]] = {}
        first_s: dict[tuple, list[float]] = {}
        for _ in range(args.repeats):  # interleaved: drifts of a shared machine hit all alike
            for system, lookahead in settings:
                for w in workers:
                    r, p, f = feed_rate(data, system, lookahead, args.batch_size, args.iterations, w)
                    rates.setdefault((system, lookahead, w), []).append(r)
                    plan_s.setdefault((system, lookahead, w), []).append(p)
                    first_s.setdefault((system, lookahead, w), []).append(f)
    rows = [{"system": s, "lookahead": la, "batch_size": args.batch_size, "workers": w,
             "samples_per_s": statistics.median(v), "ms_per_batch": 1e3 * args.batch_size / statistics.median(v),
             "planning_s": statistics.median(plan_s[(s, la, w)]),
             "first_round_s": statistics.median(first_s[(s, la, w)]), "repeats": len(v)}
            for (s, la, w), v in rates.items()]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print(f"feed alone, B = {args.batch_size:,}, {os.cpu_count()} cores, median of {args.repeats}")
    print(f"{'system':8} {'L':>4} {'workers':>7} {'M samples/s':>12} {'ms/batch':>9} {'planning s':>11} "
          f"{'1st round s':>11}")
    for r in rows:
        print(f"{r['system']:8} {r['lookahead']:>4} {r['workers']:>7} {r['samples_per_s'] / 1e6:>12.2f} "
              f"{r['ms_per_batch']:>9.2f} {r['planning_s']:>11.2f} {r['first_round_s']:>11.2f}")


if __name__ == "__main__":
    main()
