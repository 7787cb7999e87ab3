"""Criteo Kaggle at full size: time and peak memory of `bagpipe profile` and `bagpipe train`.

On the full-size synthetic Criteo Kaggle (45M samples, 26 tables, 33.8M embedding rows;
`bagpipe synth --preset criteo-kaggle --scale 1`, generated unless --data is given) this
runs, each as a `bagpipe` subprocess whose peak RSS comes from wait4 (the largest process
of its tree):

1. `profile`: every policy at batch 16,384, L = 200, the paper's 15M-row cache;
2. `train`: `--iterations` (200) iterations of bagpipe, sync, lru and local at E = 48 with
   the paper's DLRM (bottom 512-256-64, top 1024-1024-1024-256-128), batch 2,048, L = 200
   and rounds of 50 as in the paper, with
   `--procs` (one process per role: the oracle, one embedding server, one trainer), so each
   role's peak RSS is its own (`roles.*.peak_rss_mb` of summary.json); `--inprocess
   bagpipe,local` also trains those in one process, the runtime `bagpipe train` uses by
   default.

It prints one table: wall seconds and peak RSS of every step against the targets (profile
<= 10 min and <= 8 GB; train <= 16 GB over all its processes at once), samples/s, the oracle's ms
per batch against the trainer's median iteration time (the oracle must stay below it), and
the memory of every role. "at once" samples the whole process tree every 0.5 s. The figures
and every command go to --out/bench_scale.json; a later run into the same --out (e.g.
`--skip-profile --systems local`) replaces the steps it runs and keeps the others.

    python benchmarks/bench_scale.py --data results/datasets/synth-criteo-1-45M --out results/bench-scale
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

from measure import run

from bagpipe_cli.engine.registry import SYSTEMS

PAPER_BOTTOM, PAPER_TOP = "512,256,64", "1024,1024,1024,256,128"
PROFILE_LIMIT_S, PROFILE_LIMIT_GB, TRAIN_LIMIT_GB = 600, 8, 16


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("results/datasets/synth-criteo-1-45M"),
                    help="the dataset (generated there if absent)")
    ap.add_argument("--rows", type=int, default=45_000_000, help="samples to generate")
    ap.add_argument("--out", type=Path, default=Path("results/bench-scale"))
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--lookahead", type=int, default=200, help="train's L (its round is L/4)")
    ap.add_argument("--systems", default="bagpipe,sync,lru,local", help="trained with --procs")
    ap.add_argument("--inprocess", default="",
                    help="systems also trained in one process (bagpipe train's default runtime), e.g. bagpipe,local")
    ap.add_argument("--skip-profile", action="store_true")
    args = ap.parse_args(argv)
    bagpipe = shutil.which("bagpipe") or str(Path(sys.executable).with_name("bagpipe"))
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "steps": {}}
    saved = args.out / "bench_scale.json"
    if saved.is_file():  # the steps run now replace theirs; the others are kept
        res["steps"] = json.loads(saved.read_text())["steps"]
    if not (args.data / "meta.json").is_file():
        res["steps"]["synth"] = run([bagpipe, "synth", "--preset", "criteo-kaggle", "--scale", "1",
                                     "--rows", str(args.rows), "--out", str(args.data)],
                                    args.out / "synth.log")
    if not args.skip_profile:
        out = args.out / "profile"
        step = run([bagpipe, "profile", str(args.data), "--batch-size", "16384", "--lookahead", "200",
                    "--cache-rows", "15000000", "--out", str(out), "--overwrite"], args.out / "profile.log")
        prof = json.loads((out / "profile.json").read_text())
        step["stages"] = {k: {"seconds": v["seconds"], "peak_rss_gb": v.get("peak_rss_mb", 0) / 1024}
                          for k, v in prof["timing"].items()}
        step["trace"] = prof["trace"]
        res["steps"]["profile"] = step
    runs = [(s, True) for s in args.systems.split(",") if s] + [(s, False) for s in args.inprocess.split(",") if s]
    for system, procs in runs:
        name = f"train-{system}" + ("" if procs else "-inprocess")
        out = args.out / name
        step = run([bagpipe, "train", str(args.data), "--system", system, "--emb-dim", "48",
                    "--bottom-mlp", PAPER_BOTTOM, "--top-mlp", PAPER_TOP,
                    "--batch-size", str(args.batch_size), "--iterations", str(args.iterations),
                    *(["--lookahead", str(args.lookahead)] if "lookahead" in SYSTEMS[system].reads else []),
                    "--servers", "1", "--trainers", "1",
                    *(["--procs", "3"] if procs else []),
                    "--out", str(out), "--overwrite"], args.out / f"{name}.log")
        s = json.loads((out / "summary.json").read_text())
        layout = json.loads((out / "config.json").read_text()).get("layout", {})
        step.update({k: s.get(k) for k in ("samples_per_s", "median_iter_ms", "planner_ms_per_batch",
                                           "cache_rows", "peak_resident_rows", "eval_auc")})
        step["roles_gb"] = {r: v["peak_rss_mb"] / 1024 for r, v in s["roles"].items() if "peak_rss_mb" in v}
        step["placement"] = layout.get("placement")
        res["steps"][f"train {system}" + ("" if procs else " in-process")] = step
    saved.write_text(json.dumps(res, indent=2) + "\n")
    report(res)
    return 0


def report(res: dict) -> None:
    print(f"\non {res['machine']['cpus']} cores:")
    print("  peak GB: the largest process; at once: every process of the step together (sampled)")
    print(f"  {'step':26s} {'wall s':>8s} {'peak GB':>8s} {'at once':>7s} {'samples/s':>10s} "
          f"{'iter ms':>8s} {'oracle ms/batch':>16s}  memory per role (GB)")
    for name, st in res["steps"].items():
        roles = st.get("roles_gb", {})
        total = max(st["peak_tree_gb"], st["peak_rss_gb"])
        limit = (f"  [target <= {PROFILE_LIMIT_S} s, <= {PROFILE_LIMIT_GB} GB]" if name == "profile"
                 else f"  [target <= {TRAIN_LIMIT_GB} GB]" if name.startswith("train") else "")
        sps = f"{st['samples_per_s']:10,.0f}" if st.get("samples_per_s") else f"{'':10s}"
        it = f"{st['median_iter_ms']:8.1f}" if st.get("median_iter_ms") else f"{'':8s}"
        om = st.get("planner_ms_per_batch")
        orc = f"{om:16.2f}" if om is not None and om == om else f"{'-':>16s}"
        who = ", ".join(f"{r} {g:.2f}" for r, g in roles.items())
        print(f"  {name:26s} {st['wall_s']:8.1f} {st['peak_rss_gb']:8.2f} {total:7.2f} {sps} {it} {orc}  "
              f"{who}{limit}")
    if "profile" in res["steps"]:
        print("\n  profile stages (seconds, peak RSS so far in GB):")
        for k, v in res["steps"]["profile"]["stages"].items():
            print(f"    {k:22s} {v['seconds']:7.1f} s {v['peak_rss_gb']:6.2f} GB")


if __name__ == "__main__":
    sys.exit(main())
