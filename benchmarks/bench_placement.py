"""Does the trainer keep its compute on one machine? bagpipe against local, per placement.

On a cluster the oracle and the embedding servers run elsewhere; on one machine their
threads compete with torch's for the cores, and Bagpipe's hidden prefetch turns into slower
forward/backward passes. This trains sync, bagpipe and local in-process at `bagpipe train`'s
settings (the 1/100 Criteo-like data, DLRM, batch 1024, E = 32, L = 16) at several emulated
bandwidths, with `--placement off` (torch's default threads, nothing pinned: the engine
before placement), `--placement off --threads 1`, and `--placement auto` (the default).
Repeats are interleaved; the table gives median samples/s, bagpipe/local, and the share of
bagpipe's time spent waiting for rows (its prefetch is hidden when that is under 5%).

    python benchmarks/bench_placement.py [--gbps 0.1,1,10] [--repeat 3] [--iterations 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.launch.placement import available_cores

SYSTEMS = ("sync", "bagpipe", "local")
VARIANTS = {"off": dict(placement="off"), "off, 1 thread": dict(placement="off", threads=1),
            "auto": dict(placement="auto")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="an existing dataset (default: generate one)")
    ap.add_argument("--gbps", default="0.1,1,10", help="emulated bandwidths (Gbit/s), 200 us latency")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "data"
            generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=200_000, seed=0), data)
        res = measure(args, data)
    report(args, res)
    return 0


def measure(args, data: Path) -> dict:
    res: dict[tuple[str, float, str], list[dict]] = {}
    for r in range(args.repeat):
        for gbps in map(float, args.gbps.split(",")):
            for variant, extra in VARIANTS.items():
                for system in SYSTEMS:
                    cfg = TrainConfig(data=str(data), system=system, batch_size=1024, emb_dim=32,
                                      lookahead=16, iterations=args.iterations, net_gbps=gbps,
                                      net_latency_us=200, **extra)
                    r = train(cfg)
                    s, t = r.summary, r.summary["median_time_ms"]
                    m = r.metrics.iloc[cfg.warmup:]
                    res.setdefault((variant, gbps, system), []).append(
                        {"sps": s["samples_per_s"], "wait": float(m["prefetch_wait"].sum() / m["time"].sum()),
                         "fwd_bwd": t["forward"] + t["backward"]})
                    print(f"repeat {r + 1} {gbps:g} Gbit/s {variant:14s} {system:8s} "
                          f"{s['samples_per_s']:9,.0f} samples/s  fwd+bwd {t['forward'] + t['backward']:.1f} ms",
                          flush=True)
    return res


def report(args, res: dict) -> None:
    med = {k: {m: statistics.median(x[m] for x in v) for m in v[0]} for k, v in res.items()}
    print(f"\nmedian of {args.repeat} repeats on {len(available_cores())} cores (samples/s; "
          "fwd+bwd ms in brackets):")
    print(f"  {'network':>10s} {'placement':14s} " + " ".join(f"{s:>20s}" for s in SYSTEMS)
          + "  bagpipe/local  bagpipe's wait (hidden < 5%)")
    for gbps in map(float, args.gbps.split(",")):
        for variant in VARIANTS:
            row = [med[(variant, gbps, s)] for s in SYSTEMS]
            cells = " ".join(f"{m['sps']:>11,.0f} [{m['fwd_bwd']:5.1f}]" for m in row)
            bag, loc = row[1], row[2]
            hidden = "hidden" if bag["wait"] < 0.05 else "exposed"
            print(f"  {gbps:>7g} Gb {variant:14s} {cells}  {bag['sps'] / loc['sps']:12.2f}x  "
                  f"{100 * bag['wait']:5.1f}% {hidden}")


if __name__ == "__main__":
    sys.exit(main())
