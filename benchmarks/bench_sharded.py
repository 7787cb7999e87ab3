"""sharded against sharded-hot over torch.distributed: what their all-to-alls move.

Runs `bagpipe train --procs` for both (and sync, the reference) on Kaggle-shaped data at 1/10
of the table sizes (`synth --preset criteo-kaggle --scale 0.1 --rows 1000000`, generated if
missing), 4 trainers, 1 server, 4,096 samples a trainer, E = 16. Prints, per system, from
the runs' own `summary.json`: samples/s, and the busiest trainer's collective bytes sent per
iteration (every sum and all-to-all among the trainers); and from `simulate`'s volumes of the
same batches (which the tests hold equal to what the runs count): the all-to-alls' share
of those bytes, the rows asked of other trainers' shards per iteration, and, for
sharded-hot, the share of accesses its hot set (fae's) absorbs. Bytes do not depend on the
machine's load; samples/s do (medians of `--repeat` runs).

    python benchmarks/bench_sharded.py [--trainers 4] [--iterations 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DATA = Path("results/datasets/synth-criteo-0.1-1M")
SYSTEMS = ("sync", "sharded", "sharded-hot")


def run(out: Path, system: str, n: int, iterations: int, per: int) -> dict:
    cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(DATA), "--system", system,
           "--trainers", str(n), "--servers", "1", "--procs", str(n + 2), "--batch-size",
           str(per * n), "--emb-dim", "16", "--iterations", str(iterations), "--warmup", "5",
           "--eval-rows", "0", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())


def modelled(system: str, n: int, iterations: int, per: int) -> dict:
    """What simulate's volumes say the all-to-alls move, and the hot set's share of accesses."""
    from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

    cfg = TraceConfig(str(DATA), batch_size=per * n, iterations=iterations, trainers=n,
                      servers=1, runtime="distributed", eval_rows=0)
    v = trace_volumes(cfg, [system])[0][system]
    if v.shards is None:
        return {}
    asked, served = v.shards[:, 0], v.shards[:, 1]  # [I, N]
    a2a = 8 * (n - 1) + 8 * asked + 16 * 4 * (asked + served)
    out = {"a2a_mb": float(a2a.mean(axis=0).max()) / 1e6, "asked": float(asked.sum(axis=1).mean())}
    if v.sync_now.any():
        out["hot_rows_per_iteration"] = float(v.sync_now.mean())
    return out


def hot_share(n: int, iterations: int, per: int) -> float:
    """Share of the run's accesses whose row is in sharded-hot's hot set."""
    from bagpipe_cli.data.format import open_dataset
    from bagpipe_cli.engine.planning.builders import trace_of
    from bagpipe_cli.policies.decisions import HotSetDecisions
    from bagpipe_cli.simulate.volumes import TraceConfig, _key_batches, _Trace

    ds = open_dataset(DATA)
    cfg = TraceConfig(str(DATA), batch_size=per * n, iterations=iterations, trainers=n, eval_rows=0)
    total = int(sum(ds.meta.cardinalities))
    keys = _key_batches(ds, cfg, iterations, ds.rows)
    t = _Trace(cfg, keys, iterations, total)
    hot = HotSetDecisions(trace_of(keys(), total), t.capacity(), 1.0).hot
    n_hot = n_all = 0
    for k in keys():
        n_hot += int(hot[k].sum())
        n_all += len(k)
    return n_hot / n_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--per-trainer", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if not DATA.exists():
        subprocess.run([sys.executable, "-m", "bagpipe_cli", "synth", "--preset", "criteo-kaggle",
                        "--scale", "0.1", "--rows", "1000000", "--seed", "0", "--out", str(DATA)],
                       check=True, capture_output=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for system in SYSTEMS:
            runs = [run(Path(tmp) / f"{system}-{r}", system, a.trainers, a.iterations, a.per_trainer)
                    for r in range(a.repeat)]
            s = runs[0]
            coll = max(s["roles"][f"trainer{i}"]["collective_bytes_sent"] for i in range(a.trainers))
            rows[system] = {"samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
                            "collective_mb": coll / s["iterations"] / 1e6,
                            **modelled(system, a.trainers, a.iterations, a.per_trainer)}
    share = hot_share(a.trainers, a.iterations, a.per_trainer)
    print(f"{a.trainers} trainers over --procs, {a.per_trainer:,} samples a trainer, {DATA.name}, "
          f"medians of {a.repeat} runs")
    print(f"{'system':<12} {'samples/s':>10} {'vs sync':>8} {'coll MB/it':>11} {'a2a MB/it':>10} "
          f"{'rows asked/it':>14}")
    base = rows["sync"]["samples_per_s"]
    for system, r in rows.items():
        print(f"{system:<12} {r['samples_per_s']:>10,.0f} {r['samples_per_s'] / base:>7.2f}x "
              f"{r['collective_mb']:>11.3f} {r.get('a2a_mb', np.nan):>10.3f} {r.get('asked', np.nan):>14,.0f}")
    print(f"sharded-hot's hot set absorbs {share:.1%} of the accesses; its hot rows summed per "
          f"iteration: {rows['sharded-hot'].get('hot_rows_per_iteration', 0):,.0f}")
    print(f"sharded-hot / sharded all-to-all bytes: "
          f"{rows['sharded-hot']['a2a_mb'] / rows['sharded']['a2a_mb']:.2f}x")


if __name__ == "__main__":
    main()
