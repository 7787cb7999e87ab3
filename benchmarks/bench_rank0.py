"""What rank 0 (the planner) sends per iteration as trainers are added, from summary.json.

Runs `bagpipe train --procs` at the issue's setting: Kaggle-shaped data at 1/10 of the table
sizes (`synth --preset criteo-kaggle --scale 0.1 --rows 1200000`), 16,384 samples a trainer,
L = 16, E = 16, 6 iterations, 1 server, for each system and number of trainers, and prints
every figure from the runs' own `summary.json` (`roles.<role>.traffic`): rank 0's bytes per
iteration by kind, the busiest trainer's and the server's, and each figure's ratio to the
first number of trainers. Bytes do not depend on the machine's load; the seconds do.

    python benchmarks/bench_rank0.py [--trainers 2,8] [--systems bagpipe,sync] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

MB = 1e6


def run(data: Path, out: Path, system: str, n: int, iterations: int) -> dict:
    cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), "--system", system,
           "--trainers", str(n), "--servers", "1", "--procs", str(n + 2),
           "--batch-size", str(16384 * n), "--lookahead", "16", "--emb-dim", "16",
           "--iterations", str(iterations), "--eval-rows", "0", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())


def figures(summary: dict) -> dict:
    """MB per iteration from a summary's traffic: rank 0's sent (total and by kind), the
    busiest trainer's and server's sent and received."""
    roles = summary["roles"]

    def per(role: str, direction: str) -> dict[str, float]:
        return {k: v / MB for k, v in roles[role]["traffic"][f"{direction}_per_iteration"].items()}

    trainers = [r for r in roles if r.startswith("trainer")]
    servers = [r for r in roles if r.startswith("server")]
    oracle = per("planner", "sent")
    return {"rank0_sent_mb": sum(oracle.values()), **{f"rank0_{k}_mb": v for k, v in oracle.items() if v},
            "trainer_sent_mb": max(sum(per(r, "sent").values()) for r in trainers),
            "trainer_received_mb": max(sum(per(r, "received").values()) for r in trainers),
            "server_sent_mb": max(sum(per(r, "sent").values()) for r in servers),
            "samples_per_s": summary["samples_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a dataset (default: generate the setting's)")
    ap.add_argument("--trainers", default="2,8")
    ap.add_argument("--systems", default="bagpipe,sync")
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--json", action="store_true", help="one JSON object a line, no table")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rank0-") as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "kaggle01"
            subprocess.run([sys.executable, "-m", "bagpipe_cli", "synth", "--preset", "criteo-kaggle",
                            "--scale", "0.1", "--rows", "1200000", "--out", str(data)],
                           check=True, capture_output=True)
        rows = []
        for system in args.systems.split(","):
            first = None
            for n in map(int, args.trainers.split(",")):
                f = figures(run(data, Path(tmp) / f"{system}{n}", system, n, args.iterations))
                first = first or f
                rows.append({"system": system, "trainers": n, **f,
                             "rank0_vs_first": f["rank0_sent_mb"] / first["rank0_sent_mb"]})
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    print("MB per iteration, from summary.json (busiest trainer / server)")
    print(f"{'system':8} {'N':>3} {'rank 0 sent':>11} {'x first N':>9} {'trainer sent':>12} "
          f"{'trainer recv':>12} {'server sent':>11} {'samples/s':>10}")
    for r in rows:
        print(f"{r['system']:8} {r['trainers']:>3} {r['rank0_sent_mb']:>11.3f} {r['rank0_vs_first']:>8.2f}x "
              f"{r['trainer_sent_mb']:>12.2f} {r['trainer_received_mb']:>12.2f} "
              f"{r['server_sent_mb']:>11.2f} {r['samples_per_s']:>10,.0f}")


if __name__ == "__main__":
    main()
