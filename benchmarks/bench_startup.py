"""Start-up time of the command line: `bagpipe --help` and every `bagpipe CMD --help`.

Each is a fresh `python -m bagpipe_cli ... --help` process, timed from start to exit, side by
side with `python -c pass` (the interpreter alone) and `python -c "import torch"` (what a
command that trains pays anyway). The target is under 1 s for every line. Repeats are
interleaved and the median is reported (with the fastest); `--source DIR` times another
checkout's package (e.g. an older revision) with the same interpreter.

    python benchmarks/bench_startup.py [--repeats 7] [--source DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["synth", "preprocess", "profile", "train", "bench", "report", "simulate"]


def cases() -> list[tuple[str, list[str]]]:
    py = [sys.executable]
    return ([("python -c pass", [*py, "-c", "pass"]),
             ("python -c 'import torch'", [*py, "-c", "import torch"]),
             ("bagpipe --help", [*py, "-m", "bagpipe_cli", "--help"])]
            + [(f"bagpipe {c} --help", [*py, "-m", "bagpipe_cli", c, "--help"]) for c in COMMANDS])


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the checkout whose bagpipe_cli is timed [default: this one]")
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    args = ap.parse_args()
    source = args.source.resolve()  # `python -m` looks in the working directory first
    env = {**os.environ, "PYTHONPATH": str(source)}
    todo = cases()
    samples: dict[str, list[float]] = {name: [] for name, _ in todo}
    for _ in range(args.repeats):  # interleaved: a slow moment of the machine hits every line
        for name, cmd in todo:
            samples[name].append(timed(cmd, env, source))
    base = statistics.median(samples["python -c pass"])
    if not args.json:
        print(f"start-up of {args.source} ({args.repeats} runs each; median, fastest; seconds)")
        print(f"{'command':<28} {'median':>8} {'fastest':>8} {'over python':>12}")
    for name, xs in samples.items():
        med = statistics.median(xs)
        if args.json:
            print(json.dumps({"command": name, "median_s": med, "min_s": min(xs),
                              "over_python_s": med - base, "repeats": len(xs)}))
        else:
            print(f"{name:<28} {med:>8.3f} {min(xs):>8.3f} {med - base:>+12.3f}")


if __name__ == "__main__":
    main()
