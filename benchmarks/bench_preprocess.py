"""Benchmark `bagpipe preprocess criteo` against a per-line Python loop and a bare parse.

Generates a Criteo-format TSV (label, I1..I13 with empties and negatives, C1..C26 8-hex
values drawn with Zipf skew, some empty) and measures, in one run on the same file:

- bare parse: `pyarrow.csv.read_csv` of the whole file, all cores (the floor: no
  preprocessor that parses the text can beat it);
- bagpipe: `preprocess()` end to end (count pass, encode pass, arrays and vocabularies
  written);
- per-line loop: what the reference pipelines do (split each line, count values in dicts,
  sort, then map each line again), on the first `--loop-rows` rows and reported as a rate.

Targets: bagpipe >= 10x the per-line loop and >= 0.35x the bare parse rate.

    python benchmarks/bench_preprocess.py --rows 1000000
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from bagpipe_cli.data.preprocess import PreprocessConfig, preprocess
from bagpipe_cli.data.synth import CRITEO_KAGGLE_CARDINALITIES

TARGET_VS_LOOP = 10.0
TARGET_VS_PARSE = 0.35


def write_criteo_tsv(path: Path, rows: int, seed: int = 0) -> None:
    """A Criteo-like TSV: Zipf-skewed hex values, empty fields, negative integers."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {}
    cols["label"] = pa.array((rng.random(rows) < 0.25).astype(np.int64))
    for i in range(13):
        v = np.floor(np.exp(rng.normal(1.5, 1.5, rows))).astype(np.int64)
        v[rng.random(rows) < 0.05] *= -1  # a few negatives, as in I2
        cols[f"I{i + 1}"] = pa.array(v, mask=rng.random(rows) < 0.2)
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    for t, card in enumerate(CRITEO_KAGGLE_CARDINALITIES):
        n = max(2, min(card, rows // 2))
        u = rng.random(rows)
        ids = np.minimum((n + 1.0) ** u - 1.0, n - 1).astype(np.int64)  # ~ Zipf(1)
        words = rng.integers(0, 2**32, n, dtype=np.int64)[ids]  # value of each id
        digits = hex_digits[(words[:, None] >> np.arange(28, -4, -4)) & 0xF]
        offsets = pa.py_buffer((np.arange(rows + 1, dtype=np.int32) * 8).tobytes())
        arr = pa.StringArray.from_buffers(rows, offsets, pa.py_buffer(digits.tobytes()))
        missing = rng.random(rows) < (0.03 * (t % 5))
        cols[f"C{t + 1}"] = pc.if_else(pa.array(missing), pa.scalar(None, pa.string()), arr)
    pcsv.write_csv(pa.table(cols), path, pcsv.WriteOptions(
        include_header=False, delimiter="\t", quoting_style="none"))


def bare_parse(path: Path) -> int:
    types = {"label": pa.int64(), **{f"I{i}": pa.int64() for i in range(1, 14)},
             **{f"C{i}": pa.binary() for i in range(1, 27)}}
    t = pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(column_names=list(types)),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types=types),
    )
    return t.num_rows


def per_line_loop(path: Path, rows: int) -> int:
    """The reference approach: a Python loop over lines, dict vocabularies, two passes."""
    counts: list[dict[int, int]] = [{} for _ in range(26)]
    with open(path) as f:
        for n, line in enumerate(f):
            if n >= rows:
                break
            fields = line.rstrip("\n").split("\t")
            for j in range(26):
                v = fields[14 + j]
                if v:
                    k = int(v, 16)
                    counts[j][k] = counts[j].get(k, 0) + 1
    vocab = [{k: i + 1 for i, (k, _) in enumerate(sorted(c.items(), key=lambda kv: -kv[1]))}
             for c in counts]
    dense = np.zeros((rows, 13), np.float32)
    sparse = np.zeros((rows, 26), np.int32)
    labels = np.zeros(rows, np.float32)
    with open(path) as f:
        for n, line in enumerate(f):
            if n >= rows:
                break
            fields = line.rstrip("\n").split("\t")
            labels[n] = int(fields[0])
            for j in range(13):
                v = fields[1 + j]
                dense[n, j] = math.log1p(max(int(v), 0)) if v else 0.0
            for j in range(26):
                v = fields[14 + j]
                sparse[n, j] = vocab[j].get(int(v, 16), 0) if v else 0
    return min(rows, n + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--loop-rows", type=int, default=200_000,
                    help="rows the per-line loop runs on (it is slow; its rate is per row)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the fast methods (best kept)")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-preprocess-", dir=args.dir))
    try:
        src = tmp / "criteo.tsv"
        t0 = time.perf_counter()
        write_criteo_tsv(src, args.rows)
        size = os.path.getsize(src)
        print(f"generated {args.rows:,} rows, {size / 2**20:.0f} MiB in "
              f"{time.perf_counter() - t0:.1f} s: {src}")
        print(f"cpus: {os.cpu_count()}, pyarrow threads: {pa.cpu_count()}")

        # Interleave the fast methods so that load from other processes hits both alike.
        cfg = PreprocessConfig("criteo", (src,))
        t_parse = t_ours = math.inf
        for _ in range(args.repeat):
            t = time.perf_counter()
            bare_parse(src)
            t_parse = min(t_parse, time.perf_counter() - t)
            t = time.perf_counter()
            preprocess(cfg, tmp / "out", overwrite=True)
            t_ours = min(t_ours, time.perf_counter() - t)
        loop_rows = min(args.loop_rows, args.rows)
        t = time.perf_counter()
        per_line_loop(src, loop_rows)
        t_loop = time.perf_counter() - t

        r_parse, r_ours, r_loop = args.rows / t_parse, args.rows / t_ours, loop_rows / t_loop
        print()
        print(f"{'method':<34}{'rows':>12}{'seconds':>10}{'rows/s':>14}")
        for name, n, s, r in [
            ("bare pyarrow.csv parse (floor)", args.rows, t_parse, r_parse),
            ("bagpipe preprocess (2 passes)", args.rows, t_ours, r_ours),
            ("per-line Python loop (reference)", loop_rows, t_loop, r_loop),
        ]:
            print(f"{name:<34}{n:>12,}{s:>10.2f}{r:>14,.0f}")
        print()
        for what, ratio, target in [("bagpipe / per-line loop", r_ours / r_loop, TARGET_VS_LOOP),
                                    ("bagpipe / bare parse", r_ours / r_parse, TARGET_VS_PARSE)]:
            ok = "met" if ratio >= target else "NOT met"
            print(f"{what:<26}{ratio:>8.2f}x   target >= {target:g}x: {ok}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
