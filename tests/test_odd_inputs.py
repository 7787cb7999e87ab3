"""Odd inputs (issue 34): each is refused by name, or read right; nothing is silently wrong.

Per class: duplicate column names, labels that are not 0/1, empty files, files that are not
the format they claim, a column given twice in the options, YAML keys given twice,
non-finite dense values, sizes and files named for their real cause. Then a property test
that generates small CSV and Parquet files with odd headers, encodings, separators and
values and checks every one against an independent reading (Python's csv module).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import math
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from bagpipe_cli.cli import cli
from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.data.preprocess import PreprocessConfig, preprocess
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.files.atomic import read_yaml

REPO = Path(__file__).resolve().parent.parent


def run(*args: str | Path):
    return CliRunner().invoke(cli, [*map(str, args)])


def refused(r, *expect: str) -> str:
    """The one error line of an exit-2 result, checked to contain every `expect`."""
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


def csv_run(src: Path, out: Path, *extra: str, label: str = "y", cats: str = "c1"):
    return run("preprocess", "csv", src, "--label", label, "--categorical", cats, "--out", out, *extra)


# --------------------------------------------------------------------------- 1. duplicate columns


def test_a_parquet_schema_with_a_column_twice_is_refused_by_name(tmp_path):
    src = tmp_path / "dup.parquet"
    t = pa.Table.from_arrays([pa.array([0, 1]), pa.array(["a", "b"]), pa.array(["c", "d"])],
                             names=["y", "c1", "c1"])
    pq.write_table(t, src)
    refused(csv_run(src, tmp_path / "o"), f"{src}: the Parquet schema names column 'c1' twice "
                                          "(columns 2 and 3)")
    # Even when the twice-named column is not one the options read: which is which?
    refused(csv_run(src, tmp_path / "o", cats="y", label="c1"), "'c1' twice")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("header, name", [
    ("y,c1,c1", "'c1'"), ("y, c1 ,c1", "'c1'"), ('"y",c1,"y"', "'y'"), ("y,c1,,", "''"),
])
def test_a_csv_header_with_a_column_twice_is_refused_by_name(tmp_path, header, name):
    src = tmp_path / "dup.csv"
    src.write_text(f"{header}\n" + "0,a,b" + "," * (header.count(",") - 2) + "\n")
    refused(csv_run(src, tmp_path / "o"), f"{src}:1: the header names column {name} twice")


# --------------------------------------------------------------------------- 2. refused inputs


@pytest.mark.parametrize("value, shown", [("0.5", "0.5"), ("-1", "-1"), ("2", "2"), ("yes", "'yes'"),
                                          ("nan", "'nan'"), ("inf", "'inf'"), ("1e400", "'1e400'")])
def test_a_label_that_is_not_0_or_1_names_the_file_line_and_value(tmp_path, value, shown):
    src = tmp_path / "lab.csv"
    src.write_text(f"y,c1\n0,a\n1,b\n{value},c\n")
    refused(csv_run(src, tmp_path / "o"), f"{src}:4: y = ", "is not 0 or 1")
    assert shown.strip("'") in refused(csv_run(src, tmp_path / "o"))


def test_a_parquet_label_that_is_not_0_or_1_names_the_row_and_value(tmp_path):
    for values, row, shown in (([0.0, 1.0, float("nan")], 3, "y = nan"), ([0, 3, 1], 2, "y = 3"),
                               (["0", "1", "x"], 3, "y = 'x'")):
        src = tmp_path / "lab.parquet"
        pq.write_table(pa.table({"y": values, "c1": ["a", "b", "c"]}), src)
        refused(csv_run(src, tmp_path / "o"), f"{src}: row {row}: {shown} is not 0 or 1")


@pytest.mark.parametrize("content, expect", [
    (b"", "empty file"),
    (b"\n\n \n", "empty file"),
    (b"\ny,c1\n0,a\n", ":1: the first line is empty; it must be a header"),
    (b"y,c1\n", "no data lines after the header"),
    (b"y,c1\r\n", "no data lines after the header"),
])
def test_an_empty_file_or_header_is_refused(tmp_path, content, expect):
    src = tmp_path / "e.csv"
    src.write_bytes(content)
    refused(csv_run(src, tmp_path / "o"), f"{src}", expect)
    gz = tmp_path / "e.csv.gz"
    gz.write_bytes(gzip.compress(content))
    refused(csv_run(gz, tmp_path / "o"), f"{gz}", expect)


def test_a_parquet_file_without_rows_is_refused(tmp_path):
    src = tmp_path / "e.parquet"
    pq.write_table(pa.table({"y": pa.array([], pa.int64()), "c1": pa.array([], pa.string())}), src)
    refused(csv_run(src, tmp_path / "o"), f"{src}: no rows")


def _tar(payload: bytes) -> bytes:
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("clicks.csv")
        info.size = len(payload)
        t.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def _zip(payload: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("clicks.csv", payload)
    return buf.getvalue()


def _parquet_bytes() -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"y": [0, 1], "c1": ["a", "b"]}), buf)
    return buf.getvalue()


_CSV = b"y,c1\n0,a\n1,b\n"
_NOT_TEXT = {
    "zstd": (lambda: pa.compress(_CSV, codec="zstd", asbytes=True), "a zstd-compressed file"),
    "bzip2": (lambda: bz2.compress(_CSV), "a bzip2-compressed file"),
    "xz": (lambda: lzma.compress(_CSV), "an xz-compressed file"),
    "zip": (lambda: _zip(_CSV), "a zip archive"),
    "tar": (lambda: _tar(_CSV), "a tar archive"),
    "utf16": (lambda: _CSV.decode().encode("utf-16"), "UTF-16 text (save it as UTF-8)"),
    "zeros": (lambda: bytes(300), "binary data (a NUL byte at offset 0)"),
    "junk": (lambda: bytes(range(1, 256)) * 2, "binary data (52 control bytes in the first 510)"),
    "npy": (lambda: b"\x93NUMPY\x01\x00" + bytes(100), "a NumPy .npy array"),
    "utf16-no-bom": (lambda: _CSV.decode().encode("utf-16-le"), "UTF-16 text without a byte-order "
                                                                 "mark"),
    "gzip-junk": (lambda: gzip.compress(b"y,c1\x00\x01\x02" * 10), "a gzip-compressed file that holds "
                                                                     "binary data (a NUL byte"),
    "gzip-parquet": (lambda: gzip.compress(_parquet_bytes()), "a gzip-compressed file that holds "
                                                              "a Parquet file"),
    "gzip-zstd": (lambda: gzip.compress(pa.compress(_CSV, codec="zstd", asbytes=True)),
                  "a gzip-compressed file that holds a zstd-compressed file"),
}


@pytest.mark.parametrize("kind", sorted(_NOT_TEXT))
def test_a_file_that_is_not_text_is_named_for_what_it_is(tmp_path, kind):
    make, looks = _NOT_TEXT[kind]
    src = tmp_path / "clicks.csv"
    src.write_bytes(make())
    line = refused(csv_run(src, tmp_path / "o"), f"{src}: not a text file: it looks like {looks}")
    assert "UTF-8" not in line.replace("save it as UTF-8", "")
    # Criteo and Avazu read their text the same way.
    refused(run("preprocess", "criteo", src, "--out", tmp_path / "o"), f"{src}: not a text file")
    refused(run("preprocess", "avazu", src, "--out", tmp_path / "o"), f"{src}: not a text file")
    assert not (tmp_path / "o").exists()


def test_a_damaged_parquet_file_is_one_line(tmp_path):
    """Cut short or with bytes changed: pyarrow's messages span lines and hold raw bytes."""
    data = _parquet_bytes()
    rng = np.random.default_rng(0)
    src = tmp_path / "d.parquet"
    for k in range(30):
        d = bytearray(data[: max(4, len(data) * k // 10)] if k < 10 else data)
        for _ in range(k % 5 + 1 if k >= 10 else 0):
            d[rng.integers(4, len(d))] = rng.integers(0, 256)
        src.write_bytes(bytes(d))
        r = csv_run(src, tmp_path / "o")
        if r.exit_code == 0:  # a changed byte in a value: Parquet cannot tell
            shutil.rmtree(tmp_path / "o")
            continue
        line = refused(r, f"{src}")
        assert line.isprintable(), line


def test_a_file_named_parquet_that_is_not_says_what_it_looks_like(tmp_path):
    src = tmp_path / "clicks.parquet"
    src.write_bytes(pa.compress(_CSV, codec="zstd", asbytes=True))
    refused(csv_run(src, tmp_path / "o"), "not a Parquet file (it looks like a zstd-compressed file)")


def test_latin1_text_is_text_and_a_latin1_header_names_the_byte(tmp_path):
    src = tmp_path / "l.csv"
    src.write_bytes("y,c1\n0,café\n1,thé\n0,café\n".encode("latin-1"))
    r = csv_run(src, tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert open_dataset(tmp_path / "o").meta.tables[0].cardinality == 3
    src.write_bytes("y,é\n0,a\n".encode("latin-1"))
    refused(csv_run(src, tmp_path / "o2", cats="é"), f"{src}:1: header is not UTF-8 text (byte 0xe9 "
                                                     "at column 3)")


def test_line_breaks_the_reader_cannot_follow_name_their_line(tmp_path):
    src = tmp_path / "cr.csv"
    src.write_bytes(b"y,c1\n0,a\n1,b\r0,c\n")
    refused(csv_run(src, tmp_path / "o"), f"{src}:3: a carriage return (\\r) inside the line")
    src.write_bytes(b'y,c1\n0,a\n1,"b\nc"\n0,d\n')
    refused(csv_run(src, tmp_path / "o"), f"{src}:3: a quoted field runs onto the next line")
    src.write_bytes(b'"y,c1\n0,a\n')
    refused(csv_run(src, tmp_path / "o"), f"{src}:1: the header is not a CSV line")
    src.write_bytes(b"y,c1\r0,a\r1,b\r")
    refused(csv_run(src, tmp_path / "o"), f"{src}:1: a carriage return (\\r) inside the line")


@pytest.mark.parametrize("opts, expect", [
    (("--categorical", "c1,c1"), "--categorical: column 'c1' is given twice in --categorical"),
    (("--categorical", "c1", "--dense", "c1"), "--dense: column 'c1' is given to both "
                                               "--categorical and --dense"),
    (("--categorical", "c1,y"), "--categorical: column 'y' is given to both --label and "
                                "--categorical"),
    (("--categorical", "c1", "--dense", "d,y"), "--dense: column 'y' is given to both --label "
                                                "and --dense"),
    (("--categorical", "c1", "--dense", "d,d"), "--dense: column 'd' is given twice in --dense"),
])
def test_a_column_given_twice_in_the_options_is_refused(tmp_path, opts, expect):
    src = tmp_path / "s.csv"
    src.write_text("y,c1,d\n0,a,1\n")
    refused(run("preprocess", "csv", src, "--label", "y", *opts, "--out", tmp_path / "o"), expect)
    with pytest.raises(ConfigError, match="given to both --label and --categorical"):
        PreprocessConfig("csv", (src,), label="y", categorical=("y",))


# --------------------------------------------------------------------------- 3. YAML keys twice


@pytest.mark.parametrize("text, line, key, first", [
    ("systems: [sync]\nrepeat: 1\nsystems: [bagpipe]\n", 3, "systems", 1),
    ("base:\n  batch_size: 256\n  iterations: 4\n  batch_size: 512\n", 4, "batch_size", 2),
    ("datasets:\n  - name: a\n    path: x\n    name: b\n", 4, "name", 2),
    ("base: {lr: 0.1, lr: 0.2}\n", 1, "lr", 1),
    ("a:\n  b:\n    c: 1\n    c: 2\n", 4, "c", 3),
])
def test_read_yaml_refuses_a_key_given_twice_at_any_depth(tmp_path, text, line, key, first):
    f = tmp_path / "f.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_yaml(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: line {line}: key {key!r} is given twice") and "\n" not in msg
    assert f"(first at line {first})" in msg


def test_read_yaml_keeps_merge_keys_and_equal_keys_in_separate_mappings(tmp_path):
    f = tmp_path / "f.yaml"
    f.write_text("base: &b {x: 1, y: 2}\nrun:\n  <<: *b\n  x: 3\nlist:\n  - {k: 1}\n  - {k: 2}\n")
    assert read_yaml(f) == {"base": {"x": 1, "y": 2}, "run": {"x": 3, "y": 2},
                            "list": [{"k": 1}, {"k": 2}]}


def test_a_bench_file_and_a_cluster_file_with_a_key_twice_are_one_line(tmp_path):
    bench = tmp_path / "bench.yaml"
    bench.write_text((REPO / "benchmarks" / "quick.yaml").read_text() + "systems: [sync]\n")
    refused(run("bench", bench, "--out", tmp_path / "b"), f"{bench}: line ", "key 'systems' is "
                                                          "given twice", "(first at line ")
    cluster = tmp_path / "cluster.yaml"
    text = (REPO / "benchmarks" / "paper-scenario.yaml").read_text()
    cluster.write_text(text + "batch_size: 1024\n")
    refused(run("simulate", "--cluster", cluster, "--out", tmp_path / "s"),
            f"--cluster {cluster}: line ", "key 'batch_size' is given twice")
    assert not (tmp_path / "b").exists() and not (tmp_path / "s").exists()


def test_a_yaml_file_that_is_a_device_is_refused_not_read_forever():
    with pytest.raises(ConfigError, match="/dev/zero: not a regular file"):
        read_yaml(Path("/dev/zero"))


# --------------------------------------------------------------------------- 4. non-finite dense


_DENSE = "y,c1,d\n0,a,1.5\n1,b,{v}\n0,c,\n1,d,1e308\n"


@pytest.mark.parametrize("value, problem", [
    ("inf", "d = 'inf' is not a finite number"), ("-inf", "d = '-inf' is not a finite number"),
    ("NaN", "d = 'NaN' is not a finite number"), ("Infinity", "d = 'Infinity' is not a finite"),
    ("1e400", "d = '1e400' is beyond the range of a 64-bit float"),
    ("-1e400", "d = '-1e400' is beyond the range"),
    ("9" * 400, "d = '99999999999999999999'...(400 characters) is beyond the range"),
])
def test_a_non_finite_dense_value_is_a_bad_line_never_zero(tmp_path, value, problem):
    src = tmp_path / "d.csv"
    src.write_text(_DENSE.format(v=value))
    refused(csv_run(src, tmp_path / "o", "--dense", "d"), f"{src}:3: {problem}",
            "--on-bad-line skip")
    r = csv_run(src, tmp_path / "o", "--dense", "d", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    assert "d: not finite (1)" in " ".join(r.output.split())  # the summary counts it by column
    ds = open_dataset(tmp_path / "o")
    assert ds.rows == 3  # the line is dropped, not kept with a made-up 0
    np.testing.assert_allclose(ds.dense[:, 0], np.log1p([1.5, 0.0, 1e308]).astype(np.float32))
    bad = ds.meta.extra["bad_lines"]
    assert bad["count"] == 1 and bad["causes"] == {"d: not finite": 1}
    assert bad["first"][0]["line"] == 3 and problem in bad["first"][0]["problem"]
    assert "bad line" in ds.meta.extra["dense_transform"]


def test_a_non_finite_parquet_dense_value_is_a_bad_line(tmp_path):
    src = tmp_path / "d.parquet"
    pq.write_table(pa.table({"y": [0, 1, 0, 1], "c1": ["a", "b", "c", "d"],
                             "d": [1.5, None, float("inf"), float("nan")]}), src)
    refused(csv_run(src, tmp_path / "o", "--dense", "d"), f"{src}: row 3: d = inf is not a finite "
                                                          "number; a null is a missing value")
    r = csv_run(src, tmp_path / "o", "--dense", "d", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    ds = open_dataset(tmp_path / "o")
    np.testing.assert_allclose(ds.dense[:, 0], np.log1p([1.5, 0.0]).astype(np.float32))
    assert ds.meta.extra["bad_lines"]["causes"] == {"d: not finite": 2}


def test_a_line_with_two_problems_counts_once(tmp_path):
    src = tmp_path / "two.csv"
    src.write_text("y,c1,d\n0,a,1\n5,b,x\n1,c,inf\n0,d,2\n")
    r = csv_run(src, tmp_path / "o", "--dense", "d", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    bad = open_dataset(tmp_path / "o").meta.extra["bad_lines"]
    assert bad["count"] == 2  # lines 3 and 4, however many problems each has
    assert bad["causes"] == {"y: not 0 or 1": 1, "d: not a number": 1, "d: not finite": 1}
    assert bad["first"][0] == {"file": str(src), "line": 3,
                               "problem": "y = '5' is not 0 or 1; d = 'x' is not a number"}
    src.write_text("y,c1,d\n7,a,x\n8,b,y\n")
    refused(csv_run(src, tmp_path / "o2", "--dense", "d", "--on-bad-line", "skip"),
            "every one of the 2 data lines was bad")


# --------------------------------------------------------------------------- 5. the real cause


def _dataset(tmp_path: Path) -> Path:
    src = tmp_path / "s.csv"
    src.write_text("y,c1,d\n0,a,1\n1,b,2\n0,a,3\n")
    preprocess(PreprocessConfig("csv", (src,), label="y", categorical=("c1",), dense=("d",)),
               tmp_path / "ds")
    return tmp_path / "ds"


def test_an_id_array_of_the_wrong_width_names_the_table_size(tmp_path):
    ds = _dataset(tmp_path)
    meta = json.loads((ds / "meta.json").read_text())
    meta["tables"][0]["cardinality"] = 10**12  # ids would be int64; the file holds int32
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"int32 ids, but meta.json gives table 'c1' "
                                        r"1,000,000,000,000 rows, whose ids are int64 \(int64 only "
                                        r"above 2,147,483,647 rows\)"):
        open_dataset(ds)
    meta["tables"][0]["cardinality"] = 3
    (ds / "meta.json").write_text(json.dumps(meta))
    np.save(ds / "cat_000.npy", np.load(ds / "cat_000.npy").astype(np.int64))
    with pytest.raises(DataError, match=r"int64 ids, but meta.json gives table 'c1' 3 rows, whose "
                                        r"ids are int32"):
        open_dataset(ds)


def test_too_many_distinct_values_name_the_table_and_option(tmp_path, monkeypatch):
    from bagpipe_cli.data.preprocess import vocab

    monkeypatch.setattr(vocab, "MAX_VOCAB", 5)  # as if 2^31 - 1
    src = tmp_path / "s.csv"
    src.write_text("y,c1\n" + "".join(f"{i % 2},v{i}\n" for i in range(10)))
    refused(csv_run(src, tmp_path / "o"), "table 'c1': more than 4 distinct values",
            "--max-rows-per-table")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("rows, expect", [
    ("abc", "max_rows_per_table must be an integer >= 2 (got 'abc')"),
    (None, "max_rows_per_table must be an integer >= 2 (got None)"),
    (1, "(got 1)"), (1.5, "(got 1.5)"),
    (10**15, "--vocab-from {ds} (its max_rows_per_table 1000000000000000): 1 table of up to"),
])
def test_a_hashed_vocab_from_dataset_with_an_odd_size_is_refused(tmp_path, rows, expect):
    src = tmp_path / "s.csv"
    src.write_text("y,c1\n0,a\n1,b\n")
    ds = tmp_path / "ds"
    preprocess(PreprocessConfig("csv", (src,), label="y", categorical=("c1",),
                                max_rows_per_table=100), ds)
    meta = json.loads((ds / "meta.json").read_text())
    meta["extra"]["encoding"]["max_rows_per_table"] = rows
    (ds / "meta.json").write_text(json.dumps(meta))
    refused(csv_run(src, tmp_path / "o", "--vocab-from", ds), expect.format(ds=ds))


@pytest.mark.parametrize("fname", ["cat_000.npy", "dense.npy", "labels.npy", "meta.json"])
def test_a_dataset_file_that_is_not_a_regular_file_is_named_so(tmp_path, fname):
    ds = _dataset(tmp_path)
    (ds / fname).unlink()
    (ds / fname).symlink_to("/dev/zero")
    with pytest.raises(DataError, match=rf"{fname}: not a regular file: it is a device "
                                        r"\(a symlink to /dev/zero\)") as e:
        open_dataset(ds)
    assert "missing" not in str(e.value)
    refused(run("profile", ds, "--out", tmp_path / "p"), "not a regular file")
    (ds / fname).unlink()
    (ds / fname).symlink_to(tmp_path / "gone")
    with pytest.raises(DataError, match=f"{fname}: a broken symlink"):
        open_dataset(ds)
    (ds / fname).unlink()
    (ds / fname).mkdir()
    with pytest.raises(DataError, match=f"{fname}: not a regular file: it is a directory"):
        open_dataset(ds)
    os.rmdir(ds / fname)
    with pytest.raises(DataError, match="missing array file|no meta.json"):
        open_dataset(ds)


# --------------------------------------------------------------------------- 6. property test

# What the files are made of. Names and values mix the separators, quotes, spaces, unicode
# and the empty string; several names coincide, so some headers name a column twice.
_NAMES = ["y", "c", "d", "e", "Y", "é", "名前", 'a"b', "x y", "'q'", "a;b", "a\tb"]
_NAMES_ODD = ["", " y", "a,b"]  # the options cannot name these: the run is refused
_CHARS = list("ab,;\t\"' é名x1") + ["\u00a0", "\U0001f600"]
_LABELS_OK = ["0", "1", "1.0", " 0", "+1", "0e3", "1 "]
_LABELS_ODD = ["", "2", "-1", "0.5", "yes", "nan", "inf", "1e400", "0x1", "١"]
_DENSE_OK = ["", "0", "1.5", "-3", "1e10", " 2 ", "007", ".5", "5.", "+4", "1e308", "-1e308",
             "1e-400", "-0", "123456789012345678901234567890"]
_DENSE_ODD = ["inf", "-inf", "nan", "NaN", "Infinity", "1e400", "-1e400", "abc", "1,5", "0x10",
              "1_000", "--1", "1e", "9" * 400, "١٢", "é"]
_NUMBER = re.compile(r"^\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*$")


_row_count = st.integers(0, 7).flatmap(lambda k: st.just(0) if k == 0 else st.integers(1, 6))


def _roles_first(names: list[str], order: list[int]) -> list[int]:
    """`order` with the first column of each name first: the options take distinct names
    where there are enough, so that a name twice in the header reaches the header check."""
    return sorted(order, key=lambda i: names.index(names[i]) != i)


def _names(n: int) -> st.SearchStrategy[list[str]]:
    """`n` column names: distinct three times in four, else drawn freely (often twice)."""
    name = st.integers(0, 7).flatmap(lambda k: st.sampled_from(_NAMES_ODD if k == 0 else _NAMES))
    distinct = st.lists(name, min_size=n, max_size=n, unique=True)
    free = st.lists(name, min_size=n, max_size=n)
    return st.integers(0, 3).flatmap(lambda k: free if k == 0 else distinct)


@st.composite
def _csv_case(draw):
    """(bytes of a CSV file, its separator, label option, categorical option, dense option)."""
    ncol = draw(st.integers(2, 5))
    names = draw(_names(ncol))
    order = _roles_first(names, draw(st.permutations(range(ncol))))
    n_cat = draw(st.integers(1, ncol - 1))
    n_dense = draw(st.integers(0, ncol - 1 - n_cat))
    li, cats, dense = order[0], order[1 : 1 + n_cat], order[1 + n_cat : 1 + n_cat + n_dense]
    odd = draw(st.integers(0, 2)) == 0  # most files have good values only: most succeed
    rows = []
    for _ in range(draw(_row_count)):
        row = [draw(st.text(_CHARS, max_size=4)) for _ in range(ncol)]
        row[li] = draw(st.sampled_from(_LABELS_OK + (_LABELS_ODD if odd else [])))
        for j in dense:
            row[j] = draw(st.sampled_from(_DENSE_OK + (_DENSE_ODD if odd else [])))
        rows.append(row)
    sep = draw(st.sampled_from([",", ";", "\t"]))
    quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]))
    eol = draw(st.sampled_from(["\n", "\r\n"] * 4 + ["\r"]))  # \r: old Mac, refused
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=sep, quoting=quoting, lineterminator=eol)
    w.writerow(names)
    w.writerows(rows)
    text = buf.getvalue()
    if odd and rows and draw(st.booleans()):  # an empty line, or one with a field too many
        lines = text.split(eol)
        at = draw(st.integers(1, len(lines) - 1))
        lines.insert(at, draw(st.sampled_from(["", lines[at - 1] + sep + "z"])))
        text = eol.join(lines)
    if draw(st.booleans()):
        text = text[: -len(eol)]  # no line break at the end
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig"] * 2 + ["latin-1"]))
    data = text.encode(encoding, errors="replace")  # latin-1: what it cannot hold becomes ?
    gz = draw(st.booleans())
    return (gzip.compress(data) if gz else data, sep, names[li],
            ",".join(names[j] for j in cats), ",".join(names[j] for j in dense))


@st.composite
def _parquet_case(draw):
    """(a pyarrow table, possibly with a name twice; label, categorical and dense options)."""
    ncol = draw(st.integers(2, 4))
    names = draw(_names(ncol))
    n = draw(_row_count)
    odd = draw(st.integers(0, 2)) == 0
    order = _roles_first(names, draw(st.permutations(range(ncol))))
    li, ci = order[0], order[1]
    di = order[2] if ncol > 2 and draw(st.booleans()) else None
    cols = []
    for j in range(ncol):
        if j == li:
            ok = st.sampled_from([0, 1]) if not odd else st.sampled_from([0, 1, 2, -1, None])
            col = pa.array(draw(st.lists(ok, min_size=n, max_size=n)), pa.int64())
            kind = draw(st.sampled_from(["int", "float", "str", "bool"] if not odd else ["int", "float", "str"]))
            if kind == "float":
                vals = col.to_pylist()
                if odd and n and draw(st.booleans()):
                    vals[draw(st.integers(0, n - 1))] = float("nan")
                col = pa.array(vals, pa.float64())
            elif kind == "str":
                col = pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())
            elif kind == "bool":
                col = pa.array([bool(v) for v in col.to_pylist()], pa.bool_())
        elif j == di:
            good = st.none() | st.floats(-1e300, 1e300) | st.integers(-10**6, 10**6).map(float)
            bad = st.sampled_from([math.inf, -math.inf, math.nan])
            col = pa.array(draw(st.lists(good | bad if odd else good, min_size=n, max_size=n)),
                           pa.float64())
        elif draw(st.booleans()):
            col = pa.array(draw(st.lists(st.none() | st.text(_CHARS, max_size=3), min_size=n,
                                         max_size=n)), pa.string())
        else:
            col = pa.array(draw(st.lists(st.none() | st.integers(-3, 3), min_size=n, max_size=n)),
                           pa.int64())
        cols.append(col)
    table = pa.Table.from_arrays(cols, names=names)
    return table, names[li], names[ci], names[di] if di is not None else ""


def _options(label: str, cats: str, dense: str) -> tuple[list[str], list[str]] | None:
    """The columns the CLI is asked for, as it reads its options (comma lists, stripped); None
    where the options themselves are refused (no label or table, a column named twice)."""
    split = [[v.strip() for v in opt.split(",") if v.strip()] for opt in (cats, dense)]
    cat_names, dense_names = split
    wanted = [label, *cat_names, *dense_names]
    if not label or not cat_names or len(set(wanted)) != len(wanted):
        return None
    return cat_names, dense_names


def _finite_number(v) -> float | None:
    """A value as a finite float, or None where it is not one (independently of the tool)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    if not _NUMBER.match(v):
        return None
    x = float(v.strip())
    return x if math.isfinite(x) else None


@dataclass
class _Expected:
    """What a correct preprocess reads from a file whose header and options are good: the
    good rows' labels, tables' values and transformed dense features, and the bad lines."""

    labels: list[float]
    tables: dict[str, set]  # per table: its distinct values (missing ones not counted)
    dense: list[list[float]]
    bad: int  # lines a correct reader refuses (or drops, with --on-bad-line skip)

    def add(self, row: dict, label: str, dense: list[str], missing) -> None:
        """One record (column -> value; `missing(v)` says whether v is an empty field)."""
        lab = None if missing(row[label]) else _finite_number(row[label])
        vals = [0.0 if missing(row[d]) else _finite_number(row[d]) for d in dense]
        if lab not in (0.0, 1.0) or None in vals:
            self.bad += 1
            return
        self.labels.append(lab)
        for c, seen in self.tables.items():
            if not missing(row[c]):
                seen.add(str(row[c]))
        self.dense.append([math.log1p(max(x, 0.0)) for x in vals])


def _expected_csv(data: bytes, sep: str, label: str, cats: str, dense: str) -> _Expected | None:
    """What a correct preprocess gives, read with Python's csv module; None where the file's
    header (or the options) must be refused before any row is read."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    first, _, rest = data.partition(b"\n")
    try:
        header = first.rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not header.strip():
        return None
    try:
        names = [n.strip() for n in next(csv.reader([header], delimiter=sep, strict=True))]
    except csv.Error:
        return None
    opts = _options(label, cats, dense)
    if opts is None or len(set(names)) != len(names):
        return None
    cat_names, dense_names = opts
    if any(c not in names for c in [label, *cat_names, *dense_names]):
        return None
    exp = _Expected([], {c: set() for c in cat_names}, [], 0)
    # Latin-1 maps every byte to one character and back: values compare as the bytes they are.
    for rec in csv.reader(io.StringIO(rest.decode("latin-1"), newline=""), delimiter=sep):
        if len(rec) != len(names):  # an empty line too
            exp.bad += 1
        else:
            exp.add(dict(zip(names, rec, strict=True)), label, dense_names, lambda v: v == "")
    return exp


def _expected_parquet(table: pa.Table, label: str, cats: str, dense: str) -> _Expected | None:
    """The same for a Parquet file, read with pyarrow's to_pylist (a null is missing)."""
    names = table.column_names
    opts = _options(label, cats, dense)
    if opts is None or len(set(names)) != len(names):
        return None
    cat_names, dense_names = opts
    if any(c not in names for c in [label, *cat_names, *dense_names]):
        return None
    exp = _Expected([], {c: set() for c in cat_names}, [], 0)
    for row in table.to_pylist():
        exp.add(row, label, dense_names, lambda v: v is None)
    return exp


def _check(invoke, expected: _Expected | None, out: Path, undecodable: bool = False) -> None:
    """Run the command (`invoke(extra args)`) as a user would, with the default
    --on-bad-line error and, where there are bad lines, with skip; compare with `expected`.
    `undecodable`: the file holds bytes that are not UTF-8; a line of the wrong width among
    them cannot be skipped (the parser cannot hand it over), and is refused in one line."""
    event("refused" if expected is None or not expected.labels else
          "bad lines: refused, then read with skip" if expected.bad else "read")
    modes = ["error"] + (["skip"] if expected is not None and expected.bad else [])
    for mode in modes:
        r = invoke(["--on-bad-line", mode])
        assert "Traceback" not in r.output
        good = expected is not None and expected.labels and (mode == "skip" or not expected.bad)
        if good and mode == "skip" and undecodable and "cannot parse (CSV parse error" in r.stderr:
            good = False  # the known limit above: one line, exit 2, nothing written
        if not good:
            assert r.exit_code == 2, r.output
            assert isinstance(r.exception, SystemExit), repr(r.exception)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
            assert not out.exists()
            continue
        assert r.exit_code == 0, r.output
        ds = open_dataset(out, verify=True)
        assert ds.rows == len(expected.labels)
        np.testing.assert_array_equal(ds.labels, expected.labels)
        assert [t.cardinality for t in ds.meta.tables] == [len(v) + 1 for v in expected.tables.values()]
        want = np.array(expected.dense, np.float64).reshape(ds.rows, -1)
        np.testing.assert_allclose(ds.dense, want.astype(np.float32), rtol=1e-6)
        assert ds.meta.extra["bad_lines"]["count"] == expected.bad
        shutil.rmtree(out)


_SETTINGS = settings(max_examples=200, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_SETTINGS
@given(case=_csv_case())
@example(case=(('\ufeffy;"a""b";名前\r\n1;"x;y";1e308\r\n0;;-2\r\n0; x;\r\n').encode(), ";", "y",
               'a"b', "名前"))  # read: a BOM, quotes, unicode, \r\n, empty and huge values
def test_odd_csv_files_are_read_right_or_refused_in_one_line(case):
    data, sep, label, cats, dense = case
    d = Path(tempfile.mkdtemp(prefix="odd-csv-"))
    try:
        src = d / "in.csv"
        src.write_bytes(data)
        args = ["preprocess", "csv", str(src), "--sep", sep, "--label", label, "--categorical",
                cats, "--out", str(d / "out")] + (["--dense", dense] if dense else [])
        _check(lambda extra: CliRunner().invoke(cli, args + extra),
               _expected_csv(data, sep, label, cats, dense), d / "out", not _is_utf8(data))
    finally:
        shutil.rmtree(d)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@_SETTINGS
@given(case=_parquet_case())
@example(case=(pa.table({"名前": [1, 0, None], "y": pa.array([0, 1, 1], pa.int8()),
                         "x y": [0.5, None, 1e300]}), "y", "名前", "x y"))
def test_odd_parquet_files_are_read_right_or_refused_in_one_line(case):
    table, label, cats, dense = case
    d = Path(tempfile.mkdtemp(prefix="odd-parquet-"))
    try:
        src = d / "in.parquet"
        pq.write_table(table, src)
        args = ["preprocess", "csv", str(src), "--label", label, "--categorical", cats,
                "--out", str(d / "out")] + (["--dense", dense] if dense else [])
        _check(lambda extra: CliRunner().invoke(cli, args + extra),
               _expected_parquet(table, label, cats, dense), d / "out")
    finally:
        shutil.rmtree(d)
