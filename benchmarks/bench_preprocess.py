"""Benchmark `bagpipe preprocess criteo` against the facebookresearch/dlrm reference pipeline.

Generates a Criteo-format TSV (label, I1..I13 with empties and negatives, C1..C26 8-hex
values drawn with Zipf skew, some empty; `--rows`, 8M by default, about 2 GiB) and runs on
that one file, each as a subprocess whose peak RSS comes from wait4:

- bare parse: `pyarrow.csv.read_csv` of the whole file, all cores (the floor: no
  preprocessor that parses the text can beat it);
- bagpipe: `bagpipe preprocess criteo FILE` (count pass, encode pass, arrays written);
- reference: `data_utils.py` of facebookresearch/dlrm at commit `REFERENCE_COMMIT`, copied
  into a temporary folder next to the file (never into this repository) and run as DLRM's
  README runs it (`--data-set kaggle --raw-data-file DIR/train.txt`). It is fetched from
  GitHub at that commit, or taken from `--reference PATH` where the machine has no access to
  GitHub; its sha256 is printed and stored.

Then it checks that both give the same partition of values into ids in every table. The
ids themselves differ (the reference numbers a table's values by first appearance, bagpipe
by frequency), so for each table the number of distinct (reference id, bagpipe id) pairs
must equal the number of distinct ids of each; labels and dense features (log1p of the
clipped integers) must agree too. The reference parses hex values into int32 and maps a
missing value to the value 0, so values are drawn in [1, 2^31): a missing value is then its
own class in both.

Targets: bagpipe >= 10x the reference's rows/s and >= 0.35x the bare parse's.

    python benchmarks/bench_preprocess.py --rows 8000000 --out results/bench-preprocess
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from measure import run

from bagpipe_cli.data.format import sparse_file
from bagpipe_cli.data.synth import CRITEO_KAGGLE_CARDINALITIES

REFERENCE_COMMIT = "808d35f6644f57329a2925aa7439f76375f16695"
REFERENCE_URL = f"https://raw.githubusercontent.com/facebookresearch/dlrm/{REFERENCE_COMMIT}/data_utils.py"
REFERENCE_OUT = "kaggleAdDisplayChallenge_processed.npz"
TARGET_VS_REFERENCE = 10.0
TARGET_VS_PARSE = 0.35
TABLES = len(CRITEO_KAGGLE_CARDINALITIES)


def write_criteo_tsv(path: Path, rows: int, seed: int = 0, chunk: int = 1 << 20) -> None:
    """A Criteo-like TSV: Zipf-skewed hex values in [1, 2^31), empty fields, negative
    integers; written `chunk` rows at a time (memory stays a chunk's)."""
    rng = np.random.default_rng(seed)
    sizes = [max(2, min(card, rows // 2)) for card in CRITEO_KAGGLE_CARDINALITIES]
    words = [rng.integers(1, 2**31, n, dtype=np.int64) for n in sizes]  # value of each id
    hex_digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    names = ["label", *(f"I{i + 1}" for i in range(13)), *(f"C{t + 1}" for t in range(TABLES))]
    schema = pa.schema([(n, pa.int64() if n[0] != "C" else pa.string()) for n in names])
    opts = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pcsv.CSVWriter(path, schema, write_options=opts) as w:
        for lo in range(0, rows, chunk):
            m = min(chunk, rows - lo)
            cols: list[pa.Array] = [pa.array((rng.random(m) < 0.25).astype(np.int64))]
            for _ in range(13):
                v = np.floor(np.exp(rng.normal(1.5, 1.5, m))).astype(np.int64)
                v[rng.random(m) < 0.05] *= -1  # a few negatives, as in I2
                cols.append(pa.array(v, mask=rng.random(m) < 0.2))
            for t, n in enumerate(sizes):
                ids = np.minimum((n + 1.0) ** rng.random(m) - 1.0, n - 1).astype(np.int64)  # ~ Zipf(1)
                digits = hex_digits[(words[t][ids][:, None] >> np.arange(28, -4, -4)) & 0xF]
                offsets = pa.py_buffer((np.arange(m + 1, dtype=np.int32) * 8).tobytes())
                arr = pa.StringArray.from_buffers(m, offsets, pa.py_buffer(digits.tobytes()))
                missing = pa.array(rng.random(m) < (0.03 * (t % 5)))
                cols.append(pc.if_else(missing, pa.scalar(None, pa.string()), arr))
            w.write_table(pa.Table.from_arrays(cols, schema=schema))


def bare_parse(path: Path) -> int:
    types = {"label": pa.int64(), **{f"I{i}": pa.int64() for i in range(1, 14)},
             **{f"C{i}": pa.binary() for i in range(1, TABLES + 1)}}
    t = pcsv.read_csv(
        path,
        read_options=pcsv.ReadOptions(column_names=list(types)),
        parse_options=pcsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pcsv.ConvertOptions(column_types=types),
    )
    return t.num_rows


def fetch_reference(dest: Path, given: Path | None) -> str:
    """Put the pinned data_utils.py at `dest` (from `given` or GitHub); its sha256."""
    if given is not None:
        if not given.is_file():
            raise SystemExit(f"--reference {given}: no such file")
        shutil.copyfile(given, dest)
    else:
        try:
            with urllib.request.urlopen(REFERENCE_URL, timeout=30) as r:
                dest.write_bytes(r.read())
        except OSError as e:
            raise SystemExit(f"could not fetch {REFERENCE_URL} ({e}); give --reference PATH to "
                             f"data_utils.py of facebookresearch/dlrm at commit {REFERENCE_COMMIT}, "
                             "or --no-reference") from None
    return hashlib.sha256(dest.read_bytes()).hexdigest()


def compare(reference_npz: Path, ours: Path, rows: int) -> list[dict]:
    """Per table: distinct reference ids, bagpipe ids and (reference, bagpipe) pairs; also
    raises if labels or dense features differ."""
    with np.load(reference_npz) as z:
        x_cat, x_int, y = z["X_cat"], z["X_int"], z["y"]
    if len(y) != rows:
        raise SystemExit(f"reference kept {len(y):,} of {rows:,} rows")
    labels = np.load(ours / "labels.npy")
    if not np.array_equal(labels, y.astype(np.float32)):
        raise SystemExit("labels differ")
    dense = np.load(ours / "dense.npy")
    if not np.allclose(dense, np.log1p(x_int.astype(np.float32)), rtol=1e-6, atol=1e-6):
        raise SystemExit("dense features differ")
    out = []
    for t in range(TABLES):
        a = x_cat[:, t].astype(np.int64)
        b = np.load(ours / sparse_file(t)).astype(np.int64)
        pairs = np.unique(a * (int(b.max()) + 1) + b).size
        out.append({"table": t, "reference_ids": int(np.unique(a).size),
                    "bagpipe_ids": int(np.unique(b).size), "pairs": int(pairs)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8_000_000)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs of the bare parse and of bagpipe (median kept); the reference runs once")
    ap.add_argument("--reference", type=Path, default=None,
                    help=f"a copy of dlrm's data_utils.py at {REFERENCE_COMMIT[:7]} (default: fetch it)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference pipeline")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (needs ~4x the file)")
    ap.add_argument("--out", type=Path, default=None, help="write bench_preprocess.json here")
    ap.add_argument("--bare-parse", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.bare_parse:  # the subprocess of the bare-parse step
        print(bare_parse(args.bare_parse))
        return 0
    bagpipe = shutil.which("bagpipe") or str(Path(sys.executable).with_name("bagpipe"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-preprocess-", dir=args.dir))
    res: dict = {"rows": args.rows, "cpus": os.cpu_count(), "steps": {}}
    try:
        src = tmp / "train.txt"
        t0 = time.perf_counter()
        write_criteo_tsv(src, args.rows)
        res["file_gib"] = os.path.getsize(src) / 2**30
        print(f"generated {args.rows:,} rows, {res['file_gib']:.2f} GiB in "
              f"{time.perf_counter() - t0:.0f} s: {src}")
        steps = res["steps"]
        for name, cmd in [("bare pyarrow.csv parse (floor)",
                           [sys.executable, __file__, "--bare-parse", str(src)]),
                          ("bagpipe preprocess criteo",
                           [bagpipe, "preprocess", "criteo", str(src), "--out", str(tmp / "ours"),
                            "--overwrite"])]:
            runs = [run(cmd, tmp / "step.log") for _ in range(args.repeat)]
            steps[name] = {**runs[-1], "wall_s": statistics.median(r["wall_s"] for r in runs)}
        if not args.no_reference:
            ref_dir = tmp / "dlrm"
            ref_dir.mkdir()
            res["reference"] = {"commit": REFERENCE_COMMIT,
                                "sha256": fetch_reference(ref_dir / "data_utils.py", args.reference)}
            print(f"reference data_utils.py sha256 {res['reference']['sha256']}")
            # it writes its day files and its output next to the raw file; stdout is a line per row
            steps["dlrm data_utils.py (reference)"] = run(
                [sys.executable, str(ref_dir / "data_utils.py"), "--data-set", "kaggle",
                 "--raw-data-file", str(src), "--processed-data-file", str(tmp / "absent.npz"),
                 "--data-randomize", "none"], tmp / "reference.log", stdout=False, cwd=ref_dir)
            res["partition"] = compare(tmp / REFERENCE_OUT, tmp / "ours", args.rows)
        report(res)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bench_preprocess.json").write_text(json.dumps(res, indent=2) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(res: dict) -> None:
    rows, steps = res["rows"], res["steps"]
    print(f"\n{rows:,} rows, {res['file_gib']:.2f} GiB, {res['cpus']} cores")
    print(f"{'method':<34}{'seconds':>10}{'rows/s':>12}{'peak RSS GiB':>14}")
    for name, st in steps.items():
        print(f"{name:<34}{st['wall_s']:>10.1f}{rows / st['wall_s']:>12,.0f}{st['peak_rss_gb']:>14.2f}")
    ours = steps["bagpipe preprocess criteo"]["wall_s"]
    ratios = [("bagpipe / bare parse", steps["bare pyarrow.csv parse (floor)"]["wall_s"] / ours,
               TARGET_VS_PARSE)]
    if "dlrm data_utils.py (reference)" in steps:
        ratios.append(("bagpipe / reference", steps["dlrm data_utils.py (reference)"]["wall_s"] / ours,
                       TARGET_VS_REFERENCE))
    print()
    for what, ratio, target in ratios:
        print(f"{what:<26}{ratio:>8.2f}x   target >= {target:g}x: {'met' if ratio >= target else 'NOT met'}")
    if "partition" in res:
        bad = [p for p in res["partition"] if not p["reference_ids"] == p["bagpipe_ids"] == p["pairs"]]
        total = sum(p["bagpipe_ids"] for p in res["partition"])
        print(f"same partition of values into ids: {TABLES - len(bad)} of {TABLES} tables "
              f"({total:,} ids); labels and dense features equal")
        for p in bad:
            print(f"  table {p['table']}: {p['reference_ids']:,} reference ids, "
                  f"{p['bagpipe_ids']:,} bagpipe ids, {p['pairs']:,} pairs")


if __name__ == "__main__":
    sys.exit(main())
