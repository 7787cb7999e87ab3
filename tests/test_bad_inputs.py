"""The bad-input matrix: every command against a generated set of bad inputs.

Each case must end with exit status 2 (130 for an interrupt), exactly one line on stderr,
`Error: ...`, naming the file (and line or row), or the option, to change; no traceback;
and the output folder as it was before (a case with --overwrite finds an earlier output
there and leaves it untouched, with no temporary folder beside it). Commands run in-process
(click's CliRunner), on inputs generated once for the module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli

# Commands that take --overwrite: an earlier output is put in --out, and must survive.
OVERWRITE = {"synth", "preprocess", "profile", "train", "report", "simulate"}
SENTINEL = "earlier-output.txt"


def _criteo_line(label="1", ints=None, cats=None) -> str:
    ints = ints or [str(i % 7) for i in range(13)]
    cats = cats or [f"{i:08x}" for i in range(26)]
    return "\t".join(([label] if label is not None else []) + ints + cats) + "\n"


def _criteo(path: Path, lines: list[str] | None = None) -> Path:
    path.write_text("".join(lines or [_criteo_line(str(i % 2)) for i in range(20)]))
    return path


def _damaged_dataset(tiny: Path, out: Path, fname: str, row: int, value) -> Path:
    shutil.copytree(tiny, out)
    a = np.load(out / fname)
    a[row] = value
    np.save(out / fname, a)
    return out


def _huge_dataset(tiny: Path, out: Path) -> Path:
    """A meta.json whose first table has 10^12 rows (its ids stored as int64)."""
    shutil.copytree(tiny, out)
    meta = json.loads((out / "meta.json").read_text())
    meta["tables"][0]["cardinality"] = 10**12
    meta["checksums"] = {}
    (out / "meta.json").write_text(json.dumps(meta))
    np.save(out / "cat_000.npy", np.load(out / "cat_000.npy").astype(np.int64))
    return out


@pytest.fixture(scope="module")
def world(tiny_dataset, tmp_path_factory) -> dict[str, str]:
    """Every input a case names, by name."""
    d = tmp_path_factory.mktemp("inputs")
    p: dict[str, Path] = {"tiny": tiny_dataset, "missing": d / "no-such-thing"}
    csv_rows = ["y,a,b,x"] + [f"{i % 2},u{i % 7},v{i % 3},{i * 0.5}" for i in range(40)]
    p["csv"] = d / "clicks.csv"
    p["csv"].write_text("\n".join(csv_rows) + "\n")
    p["csv_bad_dense"] = d / "bad-dense.csv"
    p["csv_bad_dense"].write_text("y,a,x\n1,u,3\n0,v,abc\n")
    p["csv_bad_label"] = d / "bad-label.csv"
    p["csv_bad_label"].write_text("y,a,x\n1,u,3\nyes,v,4\n")
    p["csv_all_bad"] = d / "all-bad.csv"
    p["csv_all_bad"].write_text("y,a,x\n7,u,3\n8,v,4\n")
    p["csv_empty"] = d / "empty.csv"
    p["csv_empty"].write_text("")
    p["csv_header_only"] = d / "header.csv"
    p["csv_header_only"].write_text("y,a,x\n")
    p["csv_latin1"] = d / "latin1.csv"
    p["csv_latin1"].write_bytes("é,a\n1,u\n".encode("latin-1"))
    p["fake_parquet"] = d / "fake.parquet"
    p["fake_parquet"].write_text("y,a\n1,u\n")
    p["csv_zstd"] = d / "zstd.csv"
    p["csv_zstd"].write_bytes(pa.compress(b"y,a\n1,u\n", codec="zstd", asbytes=True))
    p["csv_inf_dense"] = d / "inf-dense.csv"
    p["csv_inf_dense"].write_text("y,a,x\n1,u,3\n0,v,inf\n")
    p["parquet_dup"] = d / "dup.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([0, 1]), pa.array(["a", "b"]), pa.array(["c", "d"])],
                                        names=["y", "c1", "c1"]), p["parquet_dup"])
    p["parquet"] = d / "clicks.parquet.brotli"
    pq.write_table(pa.table({"label": [0, 1, 0], "a": ["x", "y", "z"]}), p["parquet"],
                   compression="brotli")
    p["criteo"] = _criteo(d / "day.tsv")
    p["criteo_label2"] = _criteo(d / "label2.tsv", [_criteo_line("1"), _criteo_line("2")])
    p["criteo_label_nan"] = _criteo(d / "label-nan.tsv", [_criteo_line("0"), _criteo_line("nan")])
    p["criteo_dense_float"] = _criteo(d / "dense-float.tsv", [
        _criteo_line("1"), _criteo_line("0"), _criteo_line("1", ["1e39"] + ["1"] * 12)])
    p["criteo_dense_text"] = _criteo(d / "dense-text.tsv", [_criteo_line("1", ["x"] * 13)])
    p["criteo_long_id"] = _criteo(d / "long-id.tsv", [
        _criteo_line("1"), _criteo_line("0", None, ["99999999999999999999999"] + ["0a"] * 25)])
    p["criteo_unlabeled"] = _criteo(d / "test.tsv", [_criteo_line(None) for _ in range(5)])
    p["avazu_hour"] = d / "avazu.csv"
    p["avazu_hour"].write_text("id,click,hour,C1\n1,0,14102100,a\n2,1,9223372036854775807,b\n")
    p["avazu_no_click"] = d / "avazu-no-click.csv"
    p["avazu_no_click"].write_text("id,hour,C1\n1,14102100,a\n")
    p["ds_neg_id"] = _damaged_dataset(tiny_dataset, d / "ds-neg-id", "cat_002.npy", 1234, -1)
    p["ds_big_id"] = _damaged_dataset(tiny_dataset, d / "ds-big-id", "cat_004.npy", 77, 800)
    p["ds_nan_label"] = _damaged_dataset(tiny_dataset, d / "ds-nan-label", "labels.npy", 5, np.nan)
    p["ds_label_2"] = _damaged_dataset(tiny_dataset, d / "ds-label-2", "labels.npy", 19_999, 2)
    p["ds_inf_dense"] = _damaged_dataset(tiny_dataset, d / "ds-inf-dense", "dense.npy", 3, np.inf)
    p["ds_nan_dense"] = _damaged_dataset(tiny_dataset, d / "ds-nan-dense", "dense.npy", 10, np.nan)
    p["ds_huge"] = _huge_dataset(tiny_dataset, d / "ds-huge")
    p["ds_zero_link"] = d / "ds-zero-link"
    shutil.copytree(tiny_dataset, p["ds_zero_link"])
    (p["ds_zero_link"] / "cat_001.npy").unlink()
    (p["ds_zero_link"] / "cat_001.npy").symlink_to("/dev/zero")
    p["ds_corrupt_meta"] = d / "ds-corrupt-meta"
    shutil.copytree(tiny_dataset, p["ds_corrupt_meta"])
    (p["ds_corrupt_meta"] / "meta.json").write_text('{"schema_version": 1, "rows": ')
    p["ds_bad_options"] = d / "ds-bad-options"
    shutil.copytree(tiny_dataset, p["ds_bad_options"])
    meta = json.loads((tiny_dataset / "meta.json").read_text())
    (p["ds_bad_options"] / "meta.json").write_text(json.dumps({**meta, "options": [1, 2]}))
    bench = {"name": "b", "datasets": [{"name": "t", "path": str(tiny_dataset)}], "models": ["dlrm"],
             "systems": ["sync"], "repeat": 1, "base": {"batch_size": 256, "iterations": 4,
                                                        "warmup": 1}, "profile": False}
    for name, change in {
        "bench_ok": {}, "bench_repeat": {"repeat": 10**9}, "bench_repeat_neg": {"repeat": -1},
        "bench_iterations": {"base": {"iterations": 10**20}},
        "bench_lr_nan": {"base": {"lr": float("nan")}},
        "bench_warmup": {"base": {"iterations": 5, "warmup": 100}},
        "bench_net": {"base": {"net_gbps": 1e-9}},
        "bench_synth": {"datasets": [{"name": "s", "path": str(d / "never"),
                                      "synth": {"preset": "tiny", "scale": 1e12}}]},
        "bench_unknown": {"base": {"lookahed": 4}},
    }.items():
        p[name] = d / f"{name}.yaml"
        p[name].write_text(json.dumps({**bench, **change}).replace("NaN", ".nan"))
    p["bench_dup_key"] = d / "dup-key.yaml"
    p["bench_dup_key"].write_text("name: b\nsystems: [sync]\nrepeat: 1\nsystems: [lru]\n")
    p["bench_not_yaml"] = d / "broken.yaml"
    p["bench_not_yaml"].write_text("name: x\ndatasets: [\n  - {a: 1\n")
    p["results_empty"] = d / "no-runs"
    p["results_empty"].mkdir()
    p["run_damaged"] = d / "run-damaged"
    shutil.copytree(Path(__file__).parent / "data" / "bench-example" / "runs" /
                    "sync-dlrm-slow-4f76c80b-r1", p["run_damaged"])
    (p["run_damaged"] / "summary.json").write_text("{not json")
    return {k: str(v) for k, v in p.items()}


# (command line with {input} names, what the one error line must contain, exit status)
CASES: list[tuple[str, str, int]] = [
    # ---- preprocess: the file and line, or the option
    ("preprocess criteo {csv}", "clicks.csv:1: expected 40 fields, found 1 (it is separated by ','", 2),
    ("preprocess criteo {csv} --on-bad-line skip", "every one of the 41 data lines was bad", 2),
    ("preprocess criteo {criteo_label2}", "label2.tsv:2: label = 2 is not 0 or 1", 2),
    ("preprocess criteo {criteo_label_nan}", "label-nan.tsv:2: label = 'nan' is not 0 or 1", 2),
    ("preprocess criteo {criteo_dense_float}", "dense-float.tsv:3: I1 = '1e39' is not an integer", 2),
    ("preprocess criteo {criteo_dense_text}", "dense-text.tsv:1: I1 = 'x' is not an integer", 2),
    ("preprocess criteo {criteo_long_id}", "long-id.tsv:2: C1 = '99999999999999999999999'", 2),
    ("preprocess criteo {criteo} --no-label", "day.tsv:1: expected 39 fields, found 40 (a file "
     "with labels is read without --no-label)", 2),
    ("preprocess criteo {criteo_unlabeled}", "test.tsv:1: expected 40 fields, found 39 (a file "
     "without labels", 2),
    ("preprocess criteo {parquet}", "Parquet input needs `bagpipe preprocess csv`", 2),
    ("preprocess criteo {missing}", "no-such-thing: no such file", 2),
    ("preprocess criteo {criteo} --max-rows-per-table 100000000000", "--max-rows-per-table 100000000000", 2),
    ("preprocess criteo {criteo} --max-rows-per-table 100000000000000000000", "--max-rows-per-table", 2),
    ("preprocess criteo {criteo} --max-rows-per-table 1", "--max-rows-per-table must be >= 2", 2),
    ("preprocess criteo {criteo} --min-count 100000000000000000000", "--min-count", 2),
    ("preprocess criteo {criteo} --min-count 0", "--min-count must be >= 1", 2),
    ("preprocess criteo {criteo} --block-mb 1e9", "--block-mb 1e+09", 2),
    ("preprocess criteo {criteo} --block-mb nan", "--block-mb nan", 2),
    ("preprocess criteo {criteo} --block-mb inf", "--block-mb inf", 2),
    ("preprocess criteo {criteo} --block-mb 0", "--block-mb 0", 2),
    ("preprocess csv {csv} --label y --categorical a --sep ;", "--sep ';': the header of", 2),
    ("preprocess csv {csv} --label y --categorical a --sep ab", "--sep must be one character", 2),
    ("preprocess csv {csv} --label nope --categorical a", "--label: column 'nope' not in", 2),
    ("preprocess csv {csv} --label y --categorical a --dense a",
     "--dense: column 'a' is given to both --categorical and --dense", 2),
    ("preprocess csv {csv_bad_dense} --label y --categorical a --dense x",
     "bad-dense.csv:3: x = 'abc' is not a number", 2),
    ("preprocess csv {csv_bad_label} --label y --categorical a --dense x",
     "bad-label.csv:3: y = 'yes' is not 0 or 1", 2),
    ("preprocess csv {csv_all_bad} --label y --categorical a --on-bad-line skip",
     "all-bad.csv: every one of the 2 data lines was bad (the first: ", 2),
    ("preprocess csv {csv_empty} --label y --categorical a", "empty.csv: empty file", 2),
    ("preprocess csv {csv_header_only} --label y --categorical a", "header.csv: no data lines", 2),
    ("preprocess csv {csv_latin1} --label y --categorical a", "latin1.csv:1: header is not UTF-8", 2),
    ("preprocess csv {fake_parquet} --label y --categorical a", "fake.parquet: named like a Parquet", 2),
    ("preprocess csv {csv} --label y --categorical a --vocab-from {missing}", "no-such-thing", 2),
    ("preprocess csv {csv_zstd} --label y --categorical a",
     "zstd.csv: not a text file: it looks like a zstd-compressed file", 2),
    ("preprocess csv {csv_inf_dense} --label y --categorical a --dense x",
     "inf-dense.csv:3: x = 'inf' is not a finite number", 2),
    ("preprocess csv {parquet_dup} --label y --categorical c1",
     "dup.parquet: the Parquet schema names column 'c1' twice (columns 2 and 3)", 2),
    ("preprocess avazu {avazu_hour}", "avazu.csv:3: hour = 9223372036854775807 is not YYMMDDHH", 2),
    ("preprocess avazu {avazu_no_click}", "avazu-no-click.csv:1: no 'click' column", 2),
    # ---- synth: the option, with what it would take
    ("synth --preset tiny --scale 1e12", "--scale 1e+12: 8 tables of up to", 2),
    ("synth --preset criteo-kaggle --scale 100000 --max-rows-per-table 100000000000",
     "--max-rows-per-table 100000000000: 26 tables", 2),
    ("synth --preset tiny --scale nan", "--scale must be > 0", 2),
    ("synth --preset tiny --scale -1", "--scale must be > 0", 2),
    ("synth --preset tiny --alpha inf", "--alpha must be > 0", 2),
    ("synth --preset tiny --rows 100000000000000000000", "--rows 100000000000000000000: too large", 2),
    ("synth --preset tiny --rows 1000000000000", "--rows 1000000000000: samples of", 2),
    ("synth --preset tiny --rows 0", "--rows must be >= 1", 2),
    ("synth --preset tiny --tables 100000000000000000000", "--tables", 2),
    ("synth --preset tiny --dense 100000", "--dense 100000: too large", 2),
    ("synth --preset tiny --max-rows-per-table 1", "--max-rows-per-table must be >= 2", 2),
    ("synth --preset tiny --seed -1", "--seed must be >= 0", 2),
    # ---- profile: the dataset's file and row, or the option
    ("profile {ds_neg_id}", "cat_002.npy: row 1234: id -1 is outside [0,", 2),
    ("profile {ds_big_id}", "cat_004.npy: row 77: id 800 is outside [0, 800)", 2),
    ("profile {ds_nan_label}", "labels.npy: row 5: label nan is not 0 or 1", 2),
    ("profile {ds_inf_dense}", "dense.npy: row 3: dense feature 'I1' is inf", 2),
    ("profile {ds_huge}", "profiling the 1,000,000,009,080 embedding rows of", 2),
    ("profile {ds_corrupt_meta}", "meta.json: corrupt JSON", 2),
    ("profile {ds_zero_link}", "cat_001.npy: not a regular file: it is a device", 2),
    ("profile {ds_bad_options}", "meta.json: field 'options' must be a JSON object", 2),
    ("profile {missing}", "no-such-thing: no such directory", 2),
    ("profile {tiny} --batch-size 0", "--batch-size must be >= 1", 2),
    ("profile {tiny} --batch-size 100000", "--batch-size 100,000 is larger than the dataset", 2),
    ("profile {tiny} --lookahead 0", "--lookahead must be an integer >= 1", 2),
    ("profile {tiny} --batch-size 256 --cache-rows 10", "--cache-rows 10 is below", 2),
    ("profile {tiny} --dim 0", "--dim must be >= 1", 2),
    ("profile {tiny} --dim 100000000000000000000", "--dim 100000000000000000000: too large", 2),
    ("profile {tiny} --lookahead 100000000000000000000", "--lookahead 100000000000000000000: too", 2),
    ("profile {tiny} --cache-rows 100000000000000000000", "--cache-rows 100000000000000000000", 2),
    ("profile {tiny} --policies lru,magic", "magic", 2),
    # ---- train: the option (and why), or the dataset's file and row
    ("train {tiny} --lr inf", "--lr must be a finite number (got inf)", 2),
    ("train {tiny} --lr nan", "--lr must be a finite number (got nan)", 2),
    ("train {tiny} --lr -1", "--lr must be > 0", 2),
    ("train {tiny} --lr 1e39", "--lr 1e+39: at most 1,000,000", 2),
    ("train {tiny} --dense-lr nan", "--dense-lr must be a finite number", 2),
    ("train {tiny} --dense-lr -1", "--dense-lr must be > 0 (got -1.0)", 2),
    ("train {tiny} --net-latency-us nan", "--net-latency-us must be a finite number", 2),
    ("train {tiny} --net-latency-us 1e15", "--net-latency-us 1e+15: every message would wait 31.7 years", 2),
    ("train {tiny} --net-gbps 1e-9", "--net-gbps 1e-09: a 16 KB row would take 36.4 hours", 2),
    ("train {tiny} --net-gbps 0", "--net-gbps must be a finite number > 0", 2),
    ("train {tiny} --iterations 99999999999999999999", "--iterations 99999999999999999999: at most", 2),
    ("train {tiny} --warmup 100 --iterations 5", "--warmup 100 leaves none of the 5 iterations", 2),
    ("train {tiny} --emb-dim 100000000", "--batch-size 1024 --emb-dim 100000000: a training step "
     "over 1,024 samples of 8 rows", 2),
    ("train {tiny} --cache-rows 2000000000 --emb-dim 4096", "with --cache-rows 2,000,000,000 needs", 2),
    ("train {tiny} --cache-rows 100000000000", "--cache-rows 100000000000: at most 2,147,483,647", 2),
    ("train {tiny} --seed 99999999999999999999999", "--seed 99999999999999999999999: a seed is 0 to 9,223,372,036,854,775,807", 2),
    ("train {tiny} --timeout inf", "--timeout must be a finite number", 2),
    ("train {tiny} --threads 100000", "--threads 100000: at most 1,024", 2),
    ("train {tiny} --trainers 100000 --batch-size 100000", "--trainers 100000: at most 4,096", 2),
    ("train {tiny} --hot-sample nan", "--hot-sample must be a finite number", 2),
    ("train {tiny} --bottom-mlp 1000000,1000000", "--bottom-mlp 1000000,1000000 --top-mlp 64,32: "
     "the dense model needs about", 2),
    ("train {tiny} --top-mlp 99999999999999999999", "--top-mlp 99999999999999999999: at most", 2),
    ("train {tiny} --batch-size 100000", "--batch-size 100000 is larger than the", 2),
    ("train {tiny} --eval-rows 10000000", "--eval-rows 10000000 must be in", 2),
    ("train {tiny} --round 100", "--round 100: must be between 1 and", 2),
    ("train {ds_neg_id}", "cat_002.npy: row 1234: id -1 is outside", 2),
    ("train {ds_big_id}", "cat_004.npy: row 77: id 800 is outside", 2),
    ("train {ds_label_2}", "labels.npy: row 19999: label 2.0 is not 0 or 1", 2),
    ("train {ds_nan_dense}", "dense.npy: row 10: dense feature 'I1' is nan", 2),
    ("train {ds_huge}", "--emb-dim 16: a run over 1,000,000,009,080 embedding rows", 2),
    ("train {tiny} --lr 1000000 --batch-size 256 --iterations 6 --lookahead 2",
     "the loss became NaN at iteration", 2),
    # ---- bench: the file and key, or the option
    ("bench {bench_repeat}", "repeat 1,000,000,000 (the file's, or --repeat): at most 1,000", 2),
    ("bench {bench_ok} --repeat 1000000000", "repeat 1,000,000,000 (the file's, or --repeat)", 2),
    ("bench {bench_repeat_neg}", "repeat must be an integer >= 1", 2),
    ("bench {bench_iterations}", "--iterations 100000000000000000000: at most", 2),
    ("bench {bench_lr_nan}", "--lr must be a finite number", 2),
    ("bench {bench_warmup}", "--warmup 100 leaves none of the 5 iterations", 2),
    ("bench {bench_net}", "--net-gbps 1e-09: a 16 KB row would take", 2),
    ("bench {bench_synth}", "datasets[0].synth: --scale 1e+12", 2),
    ("bench {bench_unknown}", "unknown key 'base.lookahed'", 2),
    ("bench {bench_not_yaml}", "broken.yaml: line", 2),
    ("bench {bench_dup_key}", "dup-key.yaml: line 4: key 'systems' is given twice", 2),
    ("bench {missing}", "bench config", 2),
    # ---- report
    ("report {missing}", "no-such-thing: no such results folder", 2),
    ("report {results_empty}", "no runs (folders with summary.json) under", 2),
    ("report {run_damaged}", "run-damaged", 2),
    ("report {tiny} --format pdf", "--format 'pdf'", 2),
    # ---- simulate
    ("simulate {tiny} --compute-ms 5 --trainers 0", "--trainers must be >= 1", 2),
    ("simulate {tiny} --compute-ms 5 --net-gbps 1e-9", "--net-gbps 1e-09: a 16 KB row", 2),
    ("simulate {tiny} --compute-ms 5 --net-latency-us 1e15", "--net-latency-us 1e+15", 2),
    ("simulate {tiny} --compute-ms nan", "--compute-ms must be a finite number", 2),
    ("simulate {tiny} --compute-ms 5 --iterations 99999999999999999999", "--iterations", 2),
    ("simulate {tiny} --compute-ms 5 --iterations 5 --warmup 10", "--warmup 10 leaves none", 2),
    ("simulate {tiny}", "--compute-ms", 2),
    ("simulate {ds_nan_label} --compute-ms 5", "labels.npy: row 5: label nan", 2),
    ("simulate {ds_big_id} --compute-ms 5", "cat_004.npy: row 77: id 800", 2),
    ("simulate {ds_huge} --compute-ms 5", "planning the trace over the 1,000,000,009,080", 2),
]

# Ctrl-C while a command checks its dataset: exit 130 and one line.
INTERRUPTS = ["profile {tiny}", "train {tiny}", "simulate {tiny} --compute-ms 5"]


def _case_id(case: tuple[str, str, int]) -> str:
    return case[0].replace("{", "").replace("}", "")[:70]


def _run(world: dict[str, str], line: str, out: Path):
    args = [a.format(**world) for a in line.split()]
    command = args[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = ["--out", str(out)]
    if command in OVERWRITE:
        out.mkdir()
        (out / SENTINEL).write_text("kept")
        extra.append("--overwrite")
    return CliRunner().invoke(cli, [*args, *extra]), command


def _check(r, command: str, out: Path, expect: str, code: int) -> None:
    assert r.exit_code == code, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert expect in lines[0], lines[0]
    if command in OVERWRITE:  # the earlier output is untouched
        assert sorted(p.name for p in out.iterdir()) == [SENTINEL]
        assert (out / SENTINEL).read_text() == "kept"
    else:
        assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_bad_input_is_one_line_and_changes_nothing(world, tmp_path, case):
    line, expect, code = case
    r, command = _run(world, line, tmp_path / "out")
    _check(r, command, tmp_path / "out", expect, code)


@pytest.mark.parametrize("line", INTERRUPTS)
def test_an_interrupt_is_one_line_and_changes_nothing(world, tmp_path, monkeypatch, line):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("bagpipe_cli.data.format.check_arrays", interrupted)
    r, command = _run(world, line, tmp_path / "out")
    _check(r, command, tmp_path / "out", "interrupted", 130)


def test_the_matrix_is_large():
    assert len(CASES) + len(INTERRUPTS) >= 60
