"""sync vs bagpipe (and any other system) over torch.distributed (gloo, loopback), side by side.

Each run is a real job of 4 processes (1 oracle/loader, 1 embedding server, 2 trainers)
launched with `bagpipe train --procs 4`, with and without an emulated network (default
10 Gbit/s, 50 us). Repeats are interleaved. Prints samples/s (median over repeats) and the
ratio to sync, how many rows bagpipe's trainers fetched against a physically replicated
cache (every trainer fetching every row), and per-role utilisation from each run's
summary.json.

    python benchmarks/bench_distributed.py [--rows 200000] [--iterations 60] [--repeat 3]
        [--systems sync,bagpipe,lru,local] [--device cuda [--backend nccl]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from bagpipe_cli.data.synth import SynthConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--net-gbps", type=float, default=10.0)
    ap.add_argument("--net-latency-us", type=float, default=50.0)
    ap.add_argument("--systems", default="sync,bagpipe", help="comma-separated; sync is always run")
    ap.add_argument("--device", default="cpu", help="where the trainers compute (cpu, cuda, cuda:K)")
    ap.add_argument("--backend", default="gloo", help="the trainers' collectives (gloo, nccl)")
    ap.add_argument("--net-shape", action="store_true",
                    help="also run with the links shaped by the kernel (--net-shape, needs root)")
    a = ap.parse_args()
    systems = ["sync"] + [s for s in a.systems.split(",") if s and s != "sync"]
    trainers = 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    data = tmp / "data"
    generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=a.rows, seed=0), data)
    emulated = ["--net-gbps", str(a.net_gbps), "--net-latency-us", str(a.net_latency_us)]
    settings = {"no network": [], "emulated": emulated}
    if a.net_shape:  # the same bandwidth, TCP shaped by tc on every rank's link
        settings["shaped"] = [*emulated, "--net-shape"]
    sps: dict[tuple[str, str], list[float]] = {}
    last: dict[tuple[str, str], tuple[dict, pd.DataFrame]] = {}
    for rep in range(a.repeat):
        for setting, net in settings.items():
            for system in systems:
                out = tmp / f"{system}-{setting.replace(' ', '')}-{rep}"
                cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), "--system", system,
                       "--batch-size", str(a.batch_size), "--iterations", str(a.iterations),
                       "--lookahead", str(a.lookahead), "--trainers", str(trainers), "--servers", "1",
                       "--procs", str(2 + trainers), "--eval-rows", "0", "--warmup", "5", *net,
                       "--device", a.device, "--backend", a.backend, "--out", str(out)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                s = json.loads((out / "summary.json").read_text())
                sps.setdefault((setting, system), []).append(s["samples_per_s"])
                last[(setting, system)] = (s, pd.read_csv(out / "metrics.csv"))
                print(f"  repeat {rep + 1} {setting:10s} {system:8s} {s['samples_per_s']:>9,.0f} samples/s",
                      file=sys.stderr)
    print(f"\ndistributed benchmark: 1 oracle + 1 server + {trainers} trainers over gloo (loopback), "
          f"batch {a.batch_size}, L={a.lookahead}, {a.iterations} iterations, medians of {a.repeat}; "
          f"emulated = {a.net_gbps:g} Gbit/s, {a.net_latency_us:g} us (a sleep per server transfer)"
          + ("; shaped = the same rate on every rank's link by tc, the latency slept"
             if a.net_shape else "") + f"; trainers on {a.device}, {a.backend}")
    print(f"{'setting':12s}" + "".join(f"{s:>12s}" for s in systems)
          + "".join(f"{s + '/sync':>15s}" for s in systems[1:]))
    for setting in settings:
        m = {s: statistics.median(sps[(setting, s)]) for s in systems}
        print(f"{setting:12s}" + "".join(f"{m[s]:>12,.0f}" for s in systems)
              + "".join(f"{m[s] / m['sync']:>14.2f}x" for s in systems[1:]))
    if ("emulated", "bagpipe") in last:
        s, met = last[("emulated", "bagpipe")]
        logical = int((met["unique_rows"] - met["cache_hits"]).sum())  # rows the oracle fetches
        got = int(met["rows_fetched"].sum())
        print(f"\nbagpipe's trainers fetched {got:,} rows; a physically replicated cache fetches "
              f"{trainers} x {logical:,} = {trainers * logical:,} ({got / (trainers * logical):.2f}x: the "
              "private rows went to their user only)")
    print("\nper-role utilisation (last repeat): busy s / waiting s / MB sent")
    for (setting, system), (s, _) in last.items():
        parts = [f"{name} {v['busy_s']:.1f}/{v.get('waiting_s', 0.0):.1f}/{v.get('bytes_sent', 0) / 1e6:.1f}"
                 for name, v in s["roles"].items()]
        print(f"  {setting:10s} {system:8s} " + ", ".join(parts))


if __name__ == "__main__":
    main()
