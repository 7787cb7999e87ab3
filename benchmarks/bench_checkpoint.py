"""Checkpoint overhead: the same run without checkpoints and with one every N iterations.

Reports the median milliseconds per checkpoint (flush of pending write-backs, gathering the
true tables, writing and checksumming the files, atomic rename) and what that costs at the
given frequency: checkpoint ms / (N x median iteration ms), plus the wall-clock difference
of the two runs (runs interleaved, medians over repeats).

    python benchmarks/bench_checkpoint.py [--rows 200000] [--scale 0.01] [--every 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--scale", type=float, default=0.01, help="criteo-kaggle cardinalities x this")
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--system", default="bagpipe")
    ap.add_argument("--optimizer", default="adagrad")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate(SynthConfig(preset="criteo-kaggle", rows=args.rows, scale=args.scale, seed=0), data)
        base = dict(data=str(data), system=args.system, batch_size=args.batch_size,
                    iterations=args.iterations, optimizer=args.optimizer, lookahead=16,
                    eval_rows=1000)
        walls = {"off": [], "on": []}
        iter_ms, ck_ms, count = [], [], 0
        for r in range(args.repeat):
            off = train(TrainConfig(**base))
            on = train(TrainConfig(**base, checkpoint_every=args.every,
                                   checkpoint_dir=str(Path(tmp) / f"ck{r}")))
            walls["off"].append(off.summary["wall_s"])
            walls["on"].append(on.summary["wall_s"])
            iter_ms.append(on.summary["median_iter_ms"])
            ck_ms += on.summary["checkpoint_ms"]
            count = on.summary["checkpoints"]
            table_mb = sum(t.numel() for t in on.tables) * 4 / 2**20
        med_ck, med_it = statistics.median(ck_ms), statistics.median(iter_ms)
        w_off, w_on = statistics.median(walls["off"]), statistics.median(walls["on"])
        print(f"{args.system}, {args.iterations} iterations of batch {args.batch_size}, tables "
              f"{table_mb:.1f} MiB (+ optimizer state), checkpoint every {args.every} "
              f"({count} per run), {args.repeat} repeats")
        print(f"  per checkpoint: median {med_ck:.1f} ms (min {min(ck_ms):.1f}, max {max(ck_ms):.1f})")
        print(f"  median iteration: {med_it:.1f} ms")
        print(f"  overhead at every {args.every}: {100 * med_ck / (args.every * med_it):.2f}% of "
              "iteration time")
        print(f"  wall: {w_off:.2f} s without, {w_on:.2f} s with checkpoints "
              f"({100 * (w_on - w_off) / w_off:+.1f}%, noisy)")


if __name__ == "__main__":
    main()
