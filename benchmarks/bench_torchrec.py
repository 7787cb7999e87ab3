"""TorchRec vs the engine, side by side in one run on the same data, model and machine.

Runs, interleaved and repeated (medians of samples/s reported, warm-up excluded):
  - torchrec: EmbeddingBagCollection + DistributedModelParallel (tables sharded table-wise
    over --trainers gloo processes) + TrainPipelineSparseDist, our DLRM dense model;
  - the engine's `local`, `sync`, `bagpipe` (L=16) and `sharded` (TorchRec's design in the
    engine: row-wise shards and all-to-alls) with --trainers simulated trainers.
All start from the same weights and read the same batches (with SGD, their losses agree);
no network is emulated. Prints samples/s, the ratios to torchrec, and the largest difference
of any parameter between torchrec's run and sharded's after the run's iterations.
Needs `make torchrec`.

    python benchmarks/bench_torchrec.py [--rows 300000] [--batch-size 2048] [--iterations 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.external import SHARDINGS, torchrec_available, train_torchrec

SYSTEMS = ("torchrec", "local", "sync", "bagpipe", "sharded")


def max_difference(a, b) -> float:
    """The largest absolute difference of any parameter (tables and dense model) of two runs."""
    d = max(float((x - y).abs().max()) for x, y in zip(a.tables, b.tables, strict=True))
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return max([d, *(float((sa[k] - sb[k]).abs().max()) for k in sa)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="an existing dataset (default: generate one)")
    ap.add_argument("--rows", type=int, default=300_000, help="rows of the generated dataset")
    ap.add_argument("--scale", type=float, default=0.01, help="criteo-kaggle table scale")
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trainers", type=int, default=2, help="torchrec processes = engine trainers")
    ap.add_argument("--sharding", choices=SHARDINGS, default="table_wise")
    ap.add_argument("--lookahead", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args(argv)
    if not torchrec_available():
        print("torchrec is not installed: run `make torchrec` first", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="bench-torchrec-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "data"
            generate(SynthConfig(preset="criteo-kaggle", scale=args.scale, rows=args.rows, seed=0), data)
        speeds: dict[str, list[float]] = {s: [] for s in SYSTEMS}
        losses: dict[str, float] = {}
        last: dict[str, object] = {}
        for r in range(args.repeat):
            for system in SYSTEMS:
                cfg = TrainConfig(data=str(data), system="sync" if system == "torchrec" else system,
                                  batch_size=args.batch_size, iterations=args.iterations,
                                  warmup=args.warmup, lookahead=args.lookahead, optimizer="sgd",
                                  lr=args.lr, trainers=args.trainers, eval_rows=0)
                res = (train_torchrec(cfg, sharding=args.sharding, run_timeout_s=600)
                       if system == "torchrec" else train(cfg))
                speeds[system].append(res.summary["samples_per_s"])
                losses[system] = res.summary["final_loss"]
                last[system] = res
                print(f"repeat {r + 1} {system:9s} {res.summary['samples_per_s']:10.0f} samples/s "
                      f"median iter {res.summary['median_iter_ms']:7.1f} ms "
                      f"final loss {res.summary['final_loss']:.6f}", flush=True)
    med = {s: statistics.median(v) for s, v in speeds.items()}
    print(f"\nmedian of {args.repeat} (batch {args.batch_size}, {args.iterations} iterations, "
          f"{args.warmup} warm-up, {args.trainers} trainers, torchrec {args.sharding}):")
    for s in SYSTEMS:
        spread = f"[{min(speeds[s]):.0f}, {max(speeds[s]):.0f}]"
        print(f"  {s:9s} {med[s]:10.0f} samples/s  {spread:>18s}  final loss {losses[s]:.6f}")
    print(f"  largest parameter difference, torchrec vs sharded: "
          f"{max_difference(last['torchrec'], last['sharded']):.3g}")
    print(f"  sharded/torchrec {med['sharded'] / med['torchrec']:.2f}x   "
          f"bagpipe/torchrec {med['bagpipe'] / med['torchrec']:.2f}x   "
          f"local/torchrec {med['local'] / med['torchrec']:.2f}x   "
          f"sync/torchrec {med['sync'] / med['torchrec']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
