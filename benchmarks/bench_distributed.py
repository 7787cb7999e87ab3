"""sync vs bagpipe over torch.distributed (gloo), for each way the trainers sum, side by side.

Each run is a real job launched with `bagpipe train --procs` (1 planner, 1 embedding
server, N trainers), for N = 2 and 4, with no network and with every rank's link shaped by
the kernel to 1 Gbit/s (`--net-shape`, needs root; `--no-shape` skips it), and for each
collective (exact, allgather, allreduce: engine/comm/collective.py). Repeats are interleaved;
medians are printed: samples/s and bagpipe/sync, each trainer's collective bytes per
iteration (against 2(N-1)/N of the vector a ring moves), the exposed sync ms (median of
the `sync` column) and rank 0's bytes per iteration (the rounds it sends). The run folders
stay in --out, so `bagpipe simulate --validate OUT` checks the model against them (--validate
runs it).

    python benchmarks/bench_distributed.py [--out results/bench-dist] [--repeat 2]
        [--trainers 2,4] [--collectives exact,allgather,allreduce] [--no-shape] [--validate]
        [--device cuda [--backend nccl]] [--old REV]

With `--old REV` every job also runs with git revision REV (a worktree of it), interleaved,
and the table gives that revision's bagpipe/sync beside this tree's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from bench_revisions import checkout, remove

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine.registry import SYSTEMS as SYSTEMS_BY_NAME

SYSTEMS = ("sync", "bagpipe")


def _planner(roles: dict) -> dict:
    """Rank 0's role (named `oracle` by revisions before the rename)."""
    return roles["planner"] if "planner" in roles else roles["oracle"]


def run(data: Path, out: Path, a: argparse.Namespace, system: str, n: int, net: list[str],
        kind: str, tree: Path | None = None) -> dict:
    """One job; `tree`: a checkout of another revision to run it with (None: this one)."""
    cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), "--system", system,
           "--batch-size", str(a.batch_size), "--iterations", str(a.iterations),
           *(["--lookahead", str(a.lookahead)] if "lookahead" in SYSTEMS_BY_NAME[system].reads else []),
           "--trainers", str(n), "--servers", "1",
           "--procs", str(2 + n), "--eval-rows", "0", "--warmup", "5", "--collective", kind, *net,
           "--device", a.device, "--backend", a.backend, "--out", str(out)]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=tree)
    s = json.loads((out / "summary.json").read_text())
    m = pd.read_csv(out / "metrics.csv").iloc[5:]
    trainers = [v for k, v in s["roles"].items() if k.startswith("trainer")]
    iters = len(pd.read_csv(out / "metrics.csv"))
    return {"sps": s["samples_per_s"], "sync_ms": 1e3 * float(m["sync"].median()),
            "coll_mb": statistics.mean(t["collective_bytes_sent"] for t in trainers) / iters / 1e6,
            "planner_mb": _planner(s["roles"])["bytes_per_iteration"] / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="keep the runs here [default: a temporary folder]")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--trainers", default="2,4")
    ap.add_argument("--collectives", default="exact,allgather,allreduce")
    ap.add_argument("--net-gbps", type=float, default=1.0, help="the shaped links' rate")
    ap.add_argument("--no-shape", action="store_true", help="no shaped-network runs (not root)")
    ap.add_argument("--validate", action="store_true", help="run simulate --validate over the runs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--old", metavar="REV", help="also run every job with git revision REV, "
                    "interleaved, and print its bagpipe/sync beside this tree's")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-dist-"))
    data = out / "data"
    if not (data / "meta.json").is_file():
        generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=a.rows, seed=0), data)
    nets = {"no network": []}
    if not a.no_shape:
        nets[f"shaped {a.net_gbps:g}G"] = ["--net-gbps", str(a.net_gbps), "--net-shape"]
    kinds = a.collectives.split(",")
    ns = [int(x) for x in a.trainers.split(",")]
    trees = {"": None}
    if a.old:
        trees[f"-{a.old}"] = checkout(a.old, Path(tempfile.mkdtemp(prefix="bench-dist-old-")))
    try:
        res = measure(a, data, out, nets, kinds, ns, trees)
    finally:  # the old revision's worktree goes, however the runs end
        for tree in trees.values():
            if tree is not None:
                remove(tree)
                shutil.rmtree(tree.parent, ignore_errors=True)
    report(res, ns, nets, kinds, a)
    if a.validate:
        subprocess.run([sys.executable, "-m", "bagpipe_cli", "simulate", "--validate", str(out / "runs")],
                       check=False)
    print(f"\nruns kept in {out / 'runs'}; check the model: bagpipe simulate --validate {out / 'runs'}")


def measure(a: argparse.Namespace, data: Path, out: Path, nets: dict, kinds: list[str], ns: list[int],
            trees: dict[str, Path | None]) -> dict[tuple, list[dict]]:
    """Every job, repeats interleaved; the runs' figures by (N, network, collective, system)."""
    res: dict[tuple, list[dict]] = {}
    for rep in range(a.repeat):  # interleaved: a shared machine's drifts hit every setting alike
        for n in ns:
            for net_name, net in nets.items():
                for kind in kinds:
                    for rev, tree in trees.items():
                        for system in SYSTEMS:
                            tag = f"{system}-N{n}-{net_name.split()[0]}-{kind}{rev}-r{rep}"
                            runs = out / ("runs" if tree is None else "runs-old")
                            r = run(data, runs / tag, a, system, n, net, kind, tree)
                            res.setdefault((n, net_name, kind, system + rev), []).append(r)
                            print(f"  {tag:48s} {r['sps']:>9,.0f} samples/s", file=sys.stderr,
                                  flush=True)
    return res


def report(res: dict, ns: list[int], nets: dict, kinds: list[str], a: argparse.Namespace) -> None:
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in res.items()}
    print(f"\nbagpipe vs sync over torch.distributed: 1 oracle + 1 server + N trainers, batch "
          f"{a.batch_size}, L={a.lookahead}, {a.iterations} iterations, medians of {a.repeat} "
          f"interleaved repeats; trainers on {a.device}, {a.backend}")
    print(f"{'N':>2} {'network':12} {'collective':10} {'sync sps':>9} {'bagpipe sps':>11} {'bag/sync':>8} "
          f"{'coll MB/it sync':>15} {'coll MB/it bag':>14} {'sync ms sync':>12} {'sync ms bag':>11} "
          f"{'rank0 MB/it':>11}")
    old = f"-{a.old}" if a.old else None
    if old:
        print(f"  (revision {a.old} beside it: its bagpipe/sync, its bagpipe's collective MB/it)")
    for n in ns:
        for net in nets:
            for kind in kinds:
                s, b = med[(n, net, kind, "sync")], med[(n, net, kind, "bagpipe")]
                line = (f"{n:>2} {net:12} {kind:10} {s['sps']:>9,.0f} {b['sps']:>11,.0f} "
                        f"{b['sps'] / s['sps']:>7.2f}x {s['coll_mb']:>15.3f} {b['coll_mb']:>14.3f} "
                        f"{s['sync_ms']:>12.2f} {b['sync_ms']:>11.2f} {b['planner_mb']:>11.3f}")
                if old:
                    so, bo = med[(n, net, kind, "sync" + old)], med[(n, net, kind, "bagpipe" + old)]
                    line += f"   old: {bo['sps'] / so['sps']:>5.2f}x {bo['coll_mb']:>7.3f}"
                print(line)


if __name__ == "__main__":
    main()
