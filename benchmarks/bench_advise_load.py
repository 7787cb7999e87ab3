"""`bagpipe advise` on an idle machine and under load, side by side: the same fastest system
and speed-ups within 15% (issue: work measured in CPU time).

Runs `bagpipe advise DATA --trainers N --net-gbps G` as it is, then again with 2 busy
processes per core beside it (`--busy`), and prints each run's fastest system, its
speed-up over sync and the runner-up's, and the ratio of the two runs' figures.

    python benchmarks/bench_advise_load.py DATA [--trainers 16] [--net-gbps 25] [--busy 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _spin(stop: float) -> None:
    while time.time() < stop:
        pass


def advise(data: str, out: Path, a: argparse.Namespace) -> tuple[dict, float]:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bagpipe_cli", "advise", data, "--trainers", str(a.trainers),
                    "--net-gbps", str(a.net_gbps), "--out", str(out)], check=True,
                   capture_output=True, text=True)
    return json.loads((out / "advice.json").read_text()), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("--trainers", type=int, default=16)
    ap.add_argument("--net-gbps", type=float, default=25.0)
    ap.add_argument("--busy", type=int, default=2, help="busy processes per core under load")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-advise-") as tmp:
        idle, s_idle = advise(a.data, Path(tmp) / "idle", a)
        rows.append(("idle", idle, s_idle))
        spinners = [mp.Process(target=_spin, args=(time.time() + 3600,)) for _ in range(a.busy * cores)]
        for p in spinners:
            p.start()
        try:
            loaded, s_loaded = advise(a.data, Path(tmp) / "loaded", a)
        finally:
            for p in spinners:
                p.terminate()
                p.join()
        rows.append((f"{a.busy} busy a core", loaded, s_loaded))
    print(f"{'machine':<16} {'fastest':<12} {'x sync':>7} {'runner-up':<12} {'margin':>7} "
          f"{'confidence':<10} {'seconds':>8}")
    for name, r, s in rows:
        print(f"{name:<16} {r['fastest']:<12} {r['speedup_over_sync']:>7.2f} {r['runner_up'] or '-':<12} "
              f"{r['margin_over_runner_up']:>7.2f} {r['confidence']:<10} {s:>8.1f}")
    i, lo = rows[0][1], rows[1][1]
    print(f"same fastest: {i['fastest'] == lo['fastest']}; speed-up over sync loaded / idle: "
          f"{lo['speedup_over_sync'] / i['speedup_over_sync']:.3f}")


if __name__ == "__main__":
    main()
