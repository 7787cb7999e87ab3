"""Engine speed, side by side in one process tree on the same data and model.

Runs, interleaved and repeated (medians reported):
  - hand:  a minimal hand-written PyTorch loop: one nn.EmbeddingBag per table with sparse
           gradients, all tables local, the same DLRM dense model, SGD (the no-overhead
           reference);
  - every system of the engine (the registry's `ENGINE_SYSTEMS`), without and
    with an emulated network ("+net"; bandwidth chosen so that fetching is most of sync's
    iteration time, as the paper measured ~75%).

Targets (issue 5): no network, bagpipe >= 0.8x hand; emulated network, bagpipe >= 3x sync
and >= 0.85x its own no-network speed.

    python benchmarks/bench_engine.py [--rows 300000] [--batch-size 2048] [--iterations 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe_cli.data import open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS as SYSTEMS
from bagpipe_cli.models import ModelConfig, build_model


def hand_loop(data: Path, batch_size: int, iterations: int, warmup: int, lr: float, seed: int) -> float:
    """Samples/s of a plain PyTorch DLRM loop with local sparse EmbeddingBags."""
    ds = open_dataset(data)
    cards = ds.meta.cardinalities
    torch.manual_seed(seed)
    model = build_model(ModelConfig("dlrm", ds.meta.num_dense, len(cards), 16))
    tables = torch.nn.ModuleList(torch.nn.EmbeddingBag(n, 16, mode="sum", sparse=True) for n in cards)
    dense_opt = torch.optim.SGD(model.parameters(), lr=lr)
    emb_opt = torch.optim.SGD(tables.parameters(), lr=lr)
    per_epoch = ds.rows // batch_size
    times = []
    for b in range(iterations):
        t0 = time.perf_counter()
        lo = (b % per_epoch) * batch_size
        batch = ds.slice(lo, lo + batch_size)
        ids = torch.from_numpy(batch.sparse)
        dense = torch.from_numpy(batch.dense)
        labels = torch.from_numpy(batch.labels)
        offsets = torch.arange(batch_size)
        emb = torch.stack([t(ids[:, i].contiguous(), offsets) for i, t in enumerate(tables)], dim=1)
        loss = F.binary_cross_entropy_with_logits(model(dense, emb), labels)
        dense_opt.zero_grad()
        emb_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        emb_opt.step()
        times.append(time.perf_counter() - t0)
    t = np.array(times[warmup:])
    return batch_size * len(t) / t.sum()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--net-gbps", type=float, default=0.15)
    ap.add_argument("--net-latency-us", type=float, default=50.0)
    ap.add_argument("--data", type=Path, default=None, help="existing dataset (default: generate)")
    a = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    data = a.data or Path(tmp.name) / "data"
    if a.data is None:
        generate(SynthConfig(preset="criteo-kaggle", scale=0.01, rows=a.rows, seed=0), data)
    common = dict(data=str(data), batch_size=a.batch_size, iterations=a.iterations, lr=0.05,
                  lookahead=a.lookahead, eval_rows=0, warmup=5)
    net = dict(net_gbps=a.net_gbps, net_latency_us=a.net_latency_us)
    def run(system: str, **kw):
        extra = {"staleness": 4} if system == "het" else {}
        return lambda: train(TrainConfig(system=system, **common, **extra, **kw)).summary

    runs = {"hand": lambda: hand_loop(data, a.batch_size, a.iterations, 5, 0.05, 0)}
    for system in SYSTEMS:
        runs[system] = run(system)
    for system in SYSTEMS:
        runs[system + "+net"] = run(system, **net)
    sps: dict[str, list[float]] = {k: [] for k in runs}
    fetch_share = []
    oracle_ms = []
    for rep in range(a.repeat):
        for name, fn in runs.items():
            r = fn()
            if isinstance(r, dict):
                sps[name].append(r["samples_per_s"])
                if name == "sync+net":
                    mt = r["median_time_ms"]
                    fetch_share.append(mt["prefetch_wait"] / r["median_iter_ms"])
                if name == "bagpipe":
                    oracle_ms.append(r["planner_ms_per_batch"])
            else:
                sps[name].append(r)
            print(f"  repeat {rep + 1}/{a.repeat} {name:12s} {sps[name][-1]:>10,.0f} samples/s",
                  file=sys.stderr)
    med = {k: statistics.median(v) for k, v in sps.items()}
    print(f"\nengine benchmark: {a.rows:,} rows, criteo-kaggle x0.01 tables, DLRM E=16, "
          f"batch {a.batch_size}, L={a.lookahead}, {a.iterations} iterations x {a.repeat} repeats "
          f"(medians), torch threads {torch.get_num_threads()}")
    print(f"emulated network: {a.net_gbps} Gbit/s, {a.net_latency_us} us; fetch share of sync's "
          f"iteration: {statistics.median(fetch_share):.0%}; oracle {statistics.median(oracle_ms):.2f} ms/batch")
    print(f"{'run':14s}{'samples/s':>12s}{'vs sync':>9s}   spread (min-max)")
    for k, v in sps.items():
        ref = med["sync+net"] if k.endswith("+net") else med["sync"]
        print(f"{k:14s}{med[k]:>12,.0f}{med[k] / ref:>8.2f}x   {min(v):,.0f}-{max(v):,.0f}")
    print("(het runs with --staleness 4: not sync-equivalent; lru/lfu/fae at bagpipe's peak cache size)")
    rows = [
        ("bagpipe / hand (no network)", med["bagpipe"] / med["hand"], 0.8),
        ("bagpipe / sync (emulated network)", med["bagpipe+net"] / med["sync+net"], 3.0),
        ("bagpipe+net / bagpipe", med["bagpipe+net"] / med["bagpipe"], 0.85),
        ("bagpipe / sync (no network)", med["bagpipe"] / med["sync"], None),
    ]
    print(f"\n{'ratio':38s}{'measured':>10s}{'target':>10s}")
    for name, v, target in rows:
        ok = "" if target is None else ("  ok" if v >= target else "  MISSED")
        print(f"{name:38s}{v:>10.2f}{'' if target is None else f'>= {target}':>10s}{ok}")


if __name__ == "__main__":
    main()
