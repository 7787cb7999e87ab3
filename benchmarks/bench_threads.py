"""Does the default thread setting hold up on a busy machine? Default against --threads.

A user's bench on a shared 2-core machine (load average 8-13) gave bagpipe 0.05x sync: with
torch's default threads, bagpipe, local and prefetch ran 10-50x slower than at `--threads 1`
(sync and het barely changed), so the ratios were artefacts. This script trains each system
with `bagpipe train` (a fresh process per run, as a user runs it) at the default threads and
at each `--threads` from 1 to the cores, on an idle machine and under a load of
`--load-per-core` busy processes per core (pure-Python spin loops, started and ended here).
Repeats are interleaved; the table gives median samples/s per setting and default / best
`--threads` (the target: at least 0.8 everywhere). Each run's placement (compute and helper
cores, torch threads, the load it saw) is printed beside its figure.

    python benchmarks/bench_threads.py [--systems sync,bagpipe,local,prefetch] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bagpipe_cli.launch.placement import available_cores

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


def start_load(n: int, seconds: float) -> list[subprocess.Popen]:
    """`n` busy processes that end by themselves after `seconds` (and are killed at the end)."""
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)]) for _ in range(n)]


def train(data: Path, out: Path, system: str, args: argparse.Namespace, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), "--system", system,
           "--iterations", str(args.iterations), "--warmup", "8", "--batch-size",
           str(args.batch_size), "--out", str(out), "--overwrite", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.strip()[-600:]}")
    s = json.loads((out / "summary.json").read_text())
    p = json.loads((out / "config.json").read_text())["layout"]["placement"][0]
    s["placed"] = (f"compute {p['compute']} helpers {p['helpers']} torch {p['torch_threads']}"
                   + (f" load {p['load']:.1f}" if p.get("load") is not None else ""))
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="an existing dataset (default: generate one)")
    ap.add_argument("--systems", default="sync,bagpipe,local,prefetch")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--load-per-core", type=int, default=2)
    ap.add_argument("--loads", default="idle,busy", help="idle, busy or both")
    ap.add_argument("--threads", default=None,
                    help="the --threads settings to compare with the default [1 to the cores]")
    args = ap.parse_args(argv)
    cores = len(available_cores())
    counts = [int(t) for t in args.threads.split(",")] if args.threads else range(1, cores + 1)
    variants = {"default": []} | {f"--threads {t}": ["--threads", str(t)] for t in counts}
    systems = args.systems.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "data"
            subprocess.run([sys.executable, "-m", "bagpipe_cli", "synth", "--preset",
                            "criteo-kaggle", "--scale", "0.01", "--rows", "300000", "--out",
                            str(data)], check=True, capture_output=True)
        for load in args.loads.split(","):
            # the load ends by itself when this script would have (a killed script's too)
            busy = start_load(cores * args.load_per_core, 60 * args.repeat * len(systems)
                              * len(variants)) if load == "busy" else []
            try:
                got: dict[tuple[str, str], list[float]] = {}
                for r in range(args.repeat):
                    for system in systems:
                        for name, extra in variants.items():
                            s = train(data, Path(tmp) / "run", system, args, extra)
                            got.setdefault((system, name), []).append(s["samples_per_s"])
                            print(f"  {load} {system:9s} {name:12s} #{r + 1}: "
                                  f"{s['samples_per_s']:10,.0f} samples/s  ({s['placed']})",
                                  flush=True)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
            for system in systems:
                med = {n: statistics.median(got[(system, n)]) for n in variants}
                best = max(v for n, v in med.items() if n != "default")
                rows.append((load, system, med, med["default"] / best))
    label = f"{cores} cores, load {args.load_per_core}/core when busy, median of {args.repeat}"
    print(f"\nsamples/s ({label})")
    print(f"{'load':6s} {'system':9s} " + " ".join(f"{n:>12s}" for n in variants)
          + f" {'default/best':>13s}")
    for load, system, med, ratio in rows:
        print(f"{load:6s} {system:9s} " + " ".join(f"{med[n]:12,.0f}" for n in variants)
              + f" {ratio:13.2f}")
    worst = min(r[3] for r in rows)
    print(f"worst default/best: {worst:.2f} (target >= 0.80)")
    return 0 if worst >= 0.8 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # a SIGTERM or SIGHUP ends the load too (the `finally` above runs)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    sys.exit(main())
