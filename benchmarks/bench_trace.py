"""What `--trace` costs: training throughput with tracing on and off, side by side.

Runs the in-process engine on one dataset and model, each configuration with tracing off
and on, interleaved (off, on, off, on, ...) and repeated, and prints each one's throughput
as batch / median iteration time (the median over repeats of each run's median over its
measured iterations: on a shared machine a mean is at the mercy of other jobs' bursts),
their ratio (target: on >= 0.95x off, issue 25), the same ratio of the runs' samples/s, the
ratio of the process's CPU seconds per run (what tracing adds is CPU work, and CPU time is
less at the mercy of other jobs than wall time), and the events a traced iteration records.
Last, the cost of one traced slice and of one untraced hook, alone, and what the first
costs an iteration. --eval-every is off in both: it is timed apart.

    python benchmarks/bench_trace.py [--rows 300000] [--batch-size 2048] [--iterations 60]
                                     [--repeat 5] [--data DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.records.trace import NO_TRACE, Tracer

# (label, system, settings): no network, and an emulated one where the servers' threads
# record a slice per request.
CASES = [
    ("bagpipe", "bagpipe", {}),
    ("sync", "sync", {}),
    ("bagpipe, 0.25 Gbit/s", "bagpipe", {"net_gbps": 0.25, "net_latency_us": 50}),
    ("bagpipe, 2 trainers", "bagpipe", {"trainers": 2}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--data", type=Path, default=None, help="existing dataset (default: generate)")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    data = a.data
    if data is None:
        data = Path(tmp.name) / "synth"
        generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=a.rows, seed=0), data)
    base = dict(data=str(data), batch_size=a.batch_size, iterations=a.iterations, warmup=8,
                lookahead=a.lookahead, optimizer="adagrad", lr=0.05, eval_rows=10_000)
    sps: dict[tuple[str, bool], list[float]] = {}
    med: dict[tuple[str, bool], list[float]] = {}
    cpu: dict[tuple[str, bool], list[float]] = {}
    events: dict[str, float] = {}
    for rep in range(a.repeat):
        for label, system, extra in CASES:
            for on in (False, True):
                trace = "trace.json" if on else None
                cfg = TrainConfig(system=system, trace=trace, **base, **extra)
                c = time.process_time()
                r = train(cfg)
                cpu.setdefault((label, on), []).append(time.process_time() - c)
                sps.setdefault((label, on), []).append(r.summary["samples_per_s"])
                med.setdefault((label, on), []).append(r.summary["median_iter_ms"])
                if on:
                    n = sum(e["ph"] != "M" for e in r.trace["traceEvents"])
                    events[label] = n / a.iterations
        print(f"repeat {rep + 1}/{a.repeat} done", file=sys.stderr, flush=True)
    print(f"\nIn-process, batch {a.batch_size:,}, {a.iterations} iterations (8 warm-up), "
          f"L = {a.lookahead}, medians of {a.repeat} interleaved repeats; samples/s = batch / "
          "median iteration time:\n")
    print("| case | tracing off | tracing on | on / off | on / off (runs' samples/s) "
          "| CPU s a run: off / on | events per iteration |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, _, _ in CASES:
        off, on = (a.batch_size * 1e3 / statistics.median(med[(label, t)]) for t in (False, True))
        ratio = statistics.median(sps[(label, True)]) / statistics.median(sps[(label, False)])
        c_off, c_on = (statistics.median(cpu[(label, t)]) for t in (False, True))
        print(f"| {label} | {off:,.0f} | {on:,.0f} | {on / off:.3f}x | {ratio:.3f}x "
              f"| {c_off:.2f} / {c_on:.2f} ({c_on / c_off:.3f}x) | {events[label]:.1f} |")
    per_slice, per_hook = _hook_costs()
    iter_us = statistics.median(med[(CASES[0][0], False)]) * 1e3
    print(f"\nOne traced slice costs {per_slice:.2f} µs, one untraced hook {per_hook:.3f} µs: "
          f"{events[CASES[0][0]]:.1f} slices are {events[CASES[0][0]] * per_slice:.0f} µs of a "
          f"{iter_us:,.0f} µs {CASES[0][0]} iteration "
          f"({100 * events[CASES[0][0]] * per_slice / iter_us:.2f}%).")
    tmp.cleanup()


def _hook_costs(n: int = 200_000) -> tuple[float, float]:
    """µs of one `with tracer.span(...)` recording a slice, and of one with NO_TRACE."""
    out = []
    for tracer in (Tracer(), NO_TRACE):
        tracer.name_thread("trainer 0", "main")
        t = time.perf_counter()
        for _ in range(n):
            with tracer.span("forward", "forward", rows=1):
                pass
        out.append((time.perf_counter() - t) / n * 1e6)
    return out[0], out[1]


if __name__ == "__main__":
    main()
