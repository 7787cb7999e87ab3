"""How the trainers' sum decides Bagpipe's speed-up as a cluster grows: `bagpipe simulate`'s
model over N = 2..64 trainers, for each collective (engine/comm/collective.py: exact, allgather,
allreduce), side by side.

The cluster is a `--cluster` file's (default: the paper's setting, benchmarks/paper-
scenario.yaml) on a dataset of your choice (default: issue 23's, synthetic Criteo Kaggle at
scale 0.1 with 2M samples, generated on first use); the global batch stays (strong
scaling: each trainer computes batch / N samples). Each N's volumes are traced once (the
distributed runtime: every trainer fetches its own rows) and predicted under each collective.
Prints bagpipe/sync and lru/sync per N and collective, and draws them (--png).

    python benchmarks/sweep_collectives.py [--cluster benchmarks/paper-scenario.yaml]
        [--data results/datasets/synth-criteo-0.1-2M] [--trainers 2,4,8,16,32,64]
        [--png docs/img/collectives_vs_trainers.png]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine.comm.collective import KINDS
from bagpipe_cli.simulate import build_config, run_simulate
from bagpipe_cli.simulate.cluster import load_cluster
from bagpipe_cli.simulate.model import add_speedups, predict
from bagpipe_cli.simulate.volumes import TraceConfig, trace_volumes

SYSTEMS = ("sync", "bagpipe", "lru")
STYLE = {"exact": dict(color="#d62728", marker="o", lw=4, alpha=0.6, ms=9),
         "allgather": dict(color="#7f7f7f", marker="s", lw=1.5),
         "allreduce": dict(color="#1f77b4", marker=".", lw=1.5, ls="--")}


def sweep(cfg, ns: list[int]) -> list[dict]:
    """Predicted mean iteration ms and speed-up over sync per (N, collective, system)."""
    base = run_simulate(replace(cfg, systems=SYSTEMS, sweep_trainers=(cfg.trainers,), sweep_gbps=()))
    rows = []
    for n in ns:
        tc = TraceConfig(data=cfg.data, batch_size=cfg.batch_size, iterations=cfg.iterations,
                         lookahead=cfg.lookahead, round=cfg.round, cache_rows=cfg.cache_rows,
                         staleness=cfg.staleness, hot_sample=cfg.hot_sample, trainers=n,
                         servers=cfg.servers, eval_rows=cfg.eval_rows, runtime=cfg.runtime)
        vols, _ = trace_volumes(tc, SYSTEMS)
        for kind in KINDS:
            cl = replace(cfg.cluster, trainers=n, collective=kind)
            preds = [predict(vols[s], cl, base.workload, base.compute[s].scaled(cfg.trainers / n))
                     for s in SYSTEMS]
            add_speedups(preds)
            rows += [{"trainers": n, "collective": kind, "system": p.system, "mean_ms": p.mean_ms,
                      "speedup": p.speedup} for p in preds]
        print(f"N = {n}: " + ", ".join(f"{r['collective']} {r['system']} {r['speedup']:.2f}x"
                                      for r in rows[-3 * len(SYSTEMS):] if r["system"] != "sync"),
              flush=True)
    return rows


def plot(rows: list[dict], title: str, path: Path) -> None:
    fig = Figure(figsize=(11, 4.6), dpi=120)
    axes = fig.subplots(1, 2, sharey=True)
    ns = sorted({r["trainers"] for r in rows})
    for ax, system in zip(axes, ("bagpipe", "lru"), strict=True):
        for kind in KINDS:
            ys = [next(r["speedup"] for r in rows if r["trainers"] == n and r["collective"] == kind
                       and r["system"] == system) for n in ns]
            ax.plot(ns, ys, label=f"--collective {kind}", **STYLE[kind])
        ax.axhline(1.0, color="#555555", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("trainers N (global batch fixed)")
        ax.set_title(f"{system} / sync")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("predicted speed-up over sync (mean iteration time)")
    axes[0].legend(fontsize=9, title="exact and allreduce move a ring's\nbytes: their lines coincide",
                   title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, default=Path("benchmarks/paper-scenario.yaml"))
    ap.add_argument("--data", type=Path, default=Path("results/datasets/synth-criteo-0.1-2M"))
    ap.add_argument("--trainers", default="2,4,8,16,32,64")
    ap.add_argument("--png", type=Path, default=Path("docs/img/collectives_vs_trainers.png"))
    ap.add_argument("--csv", type=Path, default=Path("results/sweep_collectives.csv"),
                    help="the predictions (--replot draws them again without simulating)")
    ap.add_argument("--replot", action="store_true")
    a = ap.parse_args()
    if not (a.data / "meta.json").is_file():
        generate(SynthConfig(preset="criteo-kaggle", scale=0.1, rows=2_000_000, seed=0), a.data)
    rows_in_data = 2_000_000  # one pass over the data, the first 20 iterations warm-up
    cfg = build_config(str(a.data), load_cluster(a.cluster), iterations=rows_in_data // 16384,
                       warmup=20)
    cfg = replace(cfg, cache_rows=None)  # lru's capacity: bagpipe's peak (the file's is for 33.8M rows)
    title = (f"{a.cluster.stem} on {a.data.name}: {cfg.servers} server at {cfg.net_gbps:g} Gbit/s, "
             f"trainers at {cfg.trainer_gbps or cfg.net_gbps:g} Gbit/s, batch {cfg.batch_size:,}, "
             f"L={cfg.lookahead}")
    if a.replot:
        plot(pd.read_csv(a.csv).to_dict("records"), title, a.png)
        print(f"wrote {a.png}")
        return
    ns = [int(x) for x in a.trainers.split(",")]
    rows = sweep(cfg, ns)
    a.csv.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(a.csv, index=False)
    print(f"\n{'N':>3} " + "".join(f"{k + ' ' + s:>20}" for k in KINDS for s in SYSTEMS[1:]))
    for n in ns:
        print(f"{n:>3} " + "".join(
            f"{next(r['speedup'] for r in rows if r['trainers'] == n and r['collective'] == k and r['system'] == s):>19.2f}x"
            for k in KINDS for s in SYSTEMS[1:]))
    plot(rows, title, a.png)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
