"""sync vs bagpipe over torch.distributed (gloo, loopback), side by side in one run.

Each run is a real job of 4 processes (1 oracle/loader, 1 embedding server, 2 trainers)
launched with `bagpipe train --procs 4`, with and without an emulated network (default
10 Gbit/s, 50 us). Prints samples/s (median over repeats), the bagpipe/sync ratio, and
per-role utilisation from each run's summary.json.

    python benchmarks/bench_distributed.py [--rows 200000] [--iterations 60] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--net-gbps", type=float, default=10.0)
    ap.add_argument("--net-latency-us", type=float, default=50.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    data = tmp / "data"
    generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=a.rows, seed=0), data)
    settings = {"no network": [], "emulated": ["--net-gbps", str(a.net_gbps), "--net-latency-us",
                                               str(a.net_latency_us)]}
    sps: dict[tuple[str, str], list[float]] = {}
    roles: dict[tuple[str, str], dict] = {}
    for rep in range(a.repeat):
        for setting, net in settings.items():
            for system in ("sync", "bagpipe"):
                out = tmp / f"{system}-{setting.replace(' ', '')}-{rep}"
                cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), "--system", system,
                       "--batch-size", str(a.batch_size), "--iterations", str(a.iterations),
                       "--lookahead", str(a.lookahead), "--trainers", "2", "--servers", "1",
                       "--procs", "4", "--eval-rows", "0", "--warmup", "5", *net, "--out", str(out)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                s = json.loads((out / "summary.json").read_text())
                sps.setdefault((setting, system), []).append(s["samples_per_s"])
                roles[(setting, system)] = s["roles"]
                print(f"  repeat {rep + 1} {setting:10s} {system:8s} {s['samples_per_s']:>9,.0f} samples/s",
                      file=sys.stderr)
    print(f"\ndistributed benchmark: 1 oracle + 1 server + 2 trainers over gloo (loopback), "
          f"batch {a.batch_size}, L={a.lookahead}, {a.iterations} iterations, medians of {a.repeat}")
    print(f"{'setting':12s}{'sync':>12s}{'bagpipe':>12s}{'bagpipe/sync':>14s}")
    for setting in settings:
        m = {s: statistics.median(sps[(setting, s)]) for s in ("sync", "bagpipe")}
        print(f"{setting:12s}{m['sync']:>12,.0f}{m['bagpipe']:>12,.0f}{m['bagpipe'] / m['sync']:>13.2f}x")
    print("\nper-role utilisation (last repeat): busy s / waiting s / MB sent")
    for (setting, system), r in roles.items():
        parts = [f"{name} {v['busy_s']:.1f}/{v['waiting_s']:.1f}/{v['bytes_sent'] / 1e6:.1f}"
                 for name, v in r.items()]
        print(f"  {setting:10s} {system:8s} " + ", ".join(parts))


if __name__ == "__main__":
    main()
