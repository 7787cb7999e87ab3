"""The engine on a trainer device against hand-written loops, side by side (issue 27's shape).

DLRM with E = 32, 26 tables of 100k rows, Zipf 1.05, bottom MLP 512-256-64, top MLP
512-256, SGD, at each batch size:

  - hand:       a hand-written loop, 26 `EmbeddingBag`s with sparse gradients, every batch
                already on the device (the no-overhead reference);
  - one-table:  the same loop with one `EmbeddingBag` for all 26 features (one lookup, one
                sparse update);
  - local, sync, bagpipe (L = 16): the engine, reading its data through its real feed,
                in-process and over --procs 3 (1 planner, 1 server, 1 trainer).

Repeats are interleaved; medians of samples/s are printed with the ratios the targets are
about: local / hand (>= 1.0 on a GPU), local / one-table, bagpipe / local (>= 0.9 with no
network), bagpipe / sync.

    python benchmarks/bench_gpu.py [--device cuda] [--batch-sizes 1024,16384] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe_cli.data import open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.models import ModelConfig, build_model

SHAPE = dict(emb_dim=32, bottom_mlp=(512, 256, 64), top_mlp=(512, 256))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hand_loop(data: Path, device: torch.device, batch_size: int, iterations: int, warmup: int,
              one_table: bool) -> float:
    """Samples/s of a plain PyTorch DLRM loop whose batches are already on the device."""
    ds = open_dataset(data)
    cards = ds.meta.cardinalities
    torch.manual_seed(0)
    model = build_model(ModelConfig("dlrm", ds.meta.num_dense, len(cards), SHAPE["emb_dim"],
                                    bottom_mlp=SHAPE["bottom_mlp"], top_mlp=SHAPE["top_mlp"])).to(device)
    if one_table:
        tables = torch.nn.ModuleList([torch.nn.EmbeddingBag(int(sum(cards)), SHAPE["emb_dim"],
                                                            mode="sum", sparse=True)]).to(device)
        shift = torch.as_tensor(np.concatenate([[0], np.cumsum(cards)[:-1]]), device=device)
    else:
        tables = torch.nn.ModuleList(torch.nn.EmbeddingBag(n, SHAPE["emb_dim"], mode="sum", sparse=True)
                                     for n in cards).to(device)
    opt = torch.optim.SGD([*model.parameters(), *tables.parameters()], lr=0.05)
    n_batches = max(1, min(ds.rows // batch_size, 8))
    batches = []
    for b in range(n_batches):  # on the device before timing: the reference has no feed
        bt = ds.slice(b * batch_size, (b + 1) * batch_size)
        batches.append(tuple(torch.from_numpy(x).to(device) for x in (bt.sparse, bt.dense, bt.labels)))
    offsets = torch.arange(batch_size, device=device)
    t0 = 0.0
    for it in range(iterations):
        if it == warmup:
            _sync(device)
            t0 = time.perf_counter()
        ids, dense, labels = batches[it % n_batches]
        if one_table:
            emb = tables[0]((ids + shift).reshape(-1), torch.arange(ids.numel(), device=device))
            emb = emb.view(batch_size, len(cards), -1)
        else:
            emb = torch.stack([t(ids[:, i].contiguous(), offsets) for i, t in enumerate(tables)], dim=1)
        loss = F.binary_cross_entropy_with_logits(model(dense, emb), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(device)
    return batch_size * (iterations - warmup) / (time.perf_counter() - t0)


def engine(data: Path, system: str, device: str, batch_size: int, iterations: int, warmup: int,
           procs: bool) -> float:
    """Samples/s of the engine's run (its measured iterations), in-process or over --procs."""
    extra = dict(transport="torch", procs=3) if procs else {}
    cfg = TrainConfig(data=str(data), system=system, device=device, batch_size=batch_size,
                      iterations=iterations, warmup=warmup, lookahead=16, eval_rows=0, lr=0.05,
                      **SHAPE, **extra)
    return train(cfg).summary["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch-sizes", default="1024,16384")
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-procs", action="store_true", help="in-process runs only")
    ap.add_argument("--json", action="store_true", help="one JSON object a line, no table")
    args = ap.parse_args()
    dev = torch.device(args.device)
    runs = [("hand", None), ("one-table", None)] + [
        (f"{s}{' --procs' if p else ''}", (s, p)) for p in ([False] if args.no_procs else [False, True])
        for s in ("local", "sync", "bagpipe")]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        data = Path(tmp) / "shape"
        generate(SynthConfig(preset="criteo-kaggle", rows=args.rows, tables=26,
                             max_rows_per_table=100_000, alpha=1.05, seed=0), data)
        out: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.repeat):
            for b in map(int, args.batch_sizes.split(",")):
                for name, eng in runs:
                    if eng is None:
                        r = hand_loop(data, dev, b, args.iterations, args.warmup, name == "one-table")
                    else:
                        r = engine(data, eng[0], args.device, b, args.iterations, args.warmup, eng[1])
                    out.setdefault((name, b), []).append(r)
    med = {k: statistics.median(v) for k, v in out.items()}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    for b in sorted({b for _, b in med}):
        row = {n: med[(n, b)] for n, _ in runs}
        ratios = {"local/hand": row["local"] / row["hand"], "local/one-table": row["local"] / row["one-table"],
                  "bagpipe/local": row["bagpipe"] / row["local"], "bagpipe/sync": row["bagpipe"] / row["sync"]}
        if args.json:
            print(json.dumps({"device": args.device, "gpu": name, "batch_size": b,
                              "samples_per_s": row, "ratios": ratios}))
            continue
        print(f"\n{name}, B = {b:,}: samples/s (median of {args.repeat})")
        for n, v in row.items():
            print(f"  {n:18} {v:>12,.0f}")
        print("  " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
