"""Did a change slow the engine down? Train the same runs with two git revisions, side by side.

Each revision is checked out into a temporary worktree; every run is a fresh process with
that worktree first on PYTHONPATH (the same venv, torch and data). Revisions alternate,
run by run, so drifts of a shared machine hit both alike; the table gives median samples/s
per (system, setting) and the ratio new/old.

    python benchmarks/bench_revisions.py --old 61fdcd7 --new HEAD
    python benchmarks/bench_revisions.py --old HEAD~1 --new WORKTREE --systems sync,bagpipe --repeat 5

`WORKTREE` means the files as they are now (uncommitted changes included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# One run in a fresh interpreter: both the old and the new engine have TrainConfig and train.
RUN = """
import json, sys, torch
from bagpipe_cli.engine import TrainConfig, train
kw = json.loads(sys.argv[1])
torch.set_num_threads(kw.pop("threads_"))
r = train(TrainConfig(**kw))
import bagpipe_cli
print(json.dumps({"samples_per_s": r.summary["samples_per_s"], "loss": r.metrics["loss"].tolist(),
                  "ms": r.summary["median_time_ms"], "package": bagpipe_cli.__file__}))
"""
SETTINGS = {"no-net": {}, "1Gbps": {"net_gbps": 1.0, "net_latency_us": 50.0}}


def checkout(rev: str, tmp: Path) -> Path:
    if rev == "WORKTREE":
        return ROOT
    where = tmp / rev.replace("/", "_").replace("~", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev],
                   check=True, capture_output=True)
    return where


def remove(tree: Path) -> None:
    """Remove a worktree `checkout` made (this tree itself stays)."""
    if tree != ROOT:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       capture_output=True)


def run_once(tree: Path, kw: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # cwd: `python -c` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", RUN, json.dumps(kw)], capture_output=True,
                         text=True, env=env, cwd=tree, timeout=900)
    if out.returncode:
        raise SystemExit(f"run failed in {tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="WORKTREE")
    ap.add_argument("--data", type=Path, help="an existing dataset (default: generate one)")
    ap.add_argument("--systems", default="sync,bagpipe,lru,local")
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bagpipe_cli.data.synth import SynthConfig, generate

    with tempfile.TemporaryDirectory(prefix="bench-revisions-") as t:
        tmp = Path(t)
        data = args.data
        if data is None:
            data = tmp / "data"
            generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=300_000, seed=0), data)
        trees = {"old": checkout(args.old, tmp), "new": checkout(args.new, tmp)}
        try:
            results = measure(args, data, trees)
        finally:
            for tree in trees.values():
                remove(tree)
    report(args, results)
    return 0


def measure(args, data: Path, trees: dict[str, Path]) -> dict:
    results: dict[tuple[str, str, str], list[dict]] = {}
    for r in range(args.repeat):
        for system in args.systems.split(","):
            for setting, net in SETTINGS.items():
                kw = dict(data=str(data), system=system, batch_size=args.batch_size,
                          iterations=args.iterations, warmup=10, lookahead=16, trainers=args.trainers,
                          optimizer="adagrad", lr=0.05, eval_rows=20_000, threads_=args.threads, **net)
                for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    res = run_once(trees[name], dict(kw))
                    if not res["package"].startswith(str(trees[name])):
                        raise SystemExit(f"{name}: ran {res['package']}, not the worktree {trees[name]}")
                    results.setdefault((system, setting, name), []).append(res)
                    print(f"repeat {r + 1} {name} {system:8s} {setting:7s} "
                          f"{res['samples_per_s']:10,.0f} samples/s", flush=True)
    return results


def report(args, results: dict) -> None:
    print(f"\nmedian samples/s of {args.repeat} repeats, old={args.old} new={args.new} "
          f"({args.trainers} trainers in one process, batch {args.batch_size}, "
          f"{args.threads} torch thread(s)):")
    print(f"  {'system':8s} {'setting':7s} {'old':>10s} {'new':>10s} {'new/old':>8s}  same loss")
    for system in args.systems.split(","):
        for setting in SETTINGS:
            old, new = results[(system, setting, "old")], results[(system, setting, "new")]
            mo = statistics.median(x["samples_per_s"] for x in old)
            mn = statistics.median(x["samples_per_s"] for x in new)
            same = old[0]["loss"] == new[0]["loss"]
            print(f"  {system:8s} {setting:7s} {mo:10,.0f} {mn:10,.0f} {mn / mo:7.2f}x  {same}")
    print("\nmedian ms per iteration of each phase (median over repeats), old -> new:")
    for system in args.systems.split(","):
        for setting in SETTINGS:
            old, new = results[(system, setting, "old")], results[(system, setting, "new")]
            parts = []
            for k in old[0]["ms"]:
                a = statistics.median(x["ms"][k] for x in old)
                b = statistics.median(x["ms"][k] for x in new)
                parts.append(f"{k} {a:.2f}->{b:.2f}")
            print(f"  {system:8s} {setting:7s} " + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
