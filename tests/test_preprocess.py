"""`bagpipe preprocess`: real samples, id order, options, multiple files and bad input."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.data.preprocess import PreprocessConfig, load_vocab, preprocess
from bagpipe_cli.data.preprocess.vocab import KeyIndex
from bagpipe_cli.errors import ConfigError

REAL = Path(__file__).resolve().parent / "data" / "real"  # in the repository (README there)
CRITEO_TRAIN = "criteo_kaggle_train_head1999.tsv"
CRITEO_TEST = "criteo_kaggle_test_head1999.tsv"
AVAZU = "deepctr_avazu_sample.txt"
TALKINGDATA = "talkingdata_openmldb_train_sample.csv"


def real(name: str) -> Path:
    p = REAL / name
    assert p.is_file(), f"real sample {p} is missing: it is part of the repository"
    return p


def run(*args: str | Path):
    return CliRunner().invoke(cli, ["preprocess", *map(str, args)])


def ok(*args: str | Path):
    r = run(*args)
    assert r.exit_code == 0, r.output
    return r


def criteo_line(label: str | None = "0", ints=("",) * 13, cats=("",) * 26) -> str:
    fields = ([label] if label is not None else []) + list(ints) + list(cats)
    return "\t".join(fields) + "\n"


def cats_with(c1: str, c2: str = "") -> tuple[str, ...]:
    return (c1, c2) + ("",) * 24


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


# --------------------------------------------------------------------------- real samples


def test_criteo_kaggle_head(tmp_path):
    src = real(CRITEO_TRAIN)
    out = tmp_path / "criteo"
    r = ok("criteo", src, "--out", out)
    assert "1,999" in r.output
    ds = open_dataset(out, verify=True)
    assert ds.rows == 1999

    rows = list(csv.reader(src.open(), delimiter="\t"))
    assert len(rows) == 1999
    for t in range(26):
        distinct = {row[14 + t] for row in rows if row[14 + t]}
        assert ds.meta.tables[t].cardinality == 1 + len(distinct), f"C{t + 1}"
    np.testing.assert_array_equal(ds.labels, [float(row[0]) for row in rows])

    # Spot-check rows: every id decodes back to the raw value through the saved vocabulary.
    vocabs = [load_vocab(out, f"C{t + 1}") for t in range(26)]
    for i in (0, 7, 1998):
        for t in range(26):
            raw = rows[i][14 + t] or None
            assert vocabs[t].decode([ds.sparse(t)[i]]) == [raw]
        for j in range(13):
            v = rows[i][1 + j]
            want = math.log1p(max(int(v), 0)) if v else 0.0
            assert ds.dense[i, j] == pytest.approx(want, rel=1e-6)

    # Ids are popularity order: counts never increase with the id.
    for t in range(26):
        counts = Counter(row[14 + t] for row in rows if row[14 + t])
        v = vocabs[t]
        assert list(v.counts) == sorted(counts.values(), reverse=True)
        assert np.all(np.diff(v.counts) <= 0)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["files"][0]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert meta["extra"]["files"] == [{"path": str(src), "rows": 1999, "start": 0, "stop": 1999,
                                       "bad_lines": 0}]
    assert meta["options"]["min_count"] == 1


def test_criteo_test_file_with_train_vocab(tmp_path):
    train, test = real(CRITEO_TRAIN), real(CRITEO_TEST)
    ok("criteo", train, "--out", tmp_path / "train")
    r = run("criteo", test, "--out", tmp_path / "bad")
    assert r.exit_code == 2 and "--no-label" in r.output and f"{test}:1:" in r.output
    ok("criteo", test, "--no-label", "--vocab-from", tmp_path / "train", "--out", tmp_path / "test")
    tr, te = open_dataset(tmp_path / "train"), open_dataset(tmp_path / "test", verify=True)
    assert te.rows == 1999 and te.labels is None and te.meta.label is None
    assert te.meta.cardinalities == tr.meta.cardinalities
    # A test value absent from the training rows maps to 0; a shared one to its train id.
    rows = list(csv.reader(test.open(), delimiter="\t"))
    train_rows = list(csv.reader(train.open(), delimiter="\t"))
    seen = {r[13 + 1] for r in train_rows}  # C1 in the train file is field 14
    v = load_vocab(tmp_path / "train", "C1")
    for i in range(50):
        raw = rows[i][13]  # C1 in the test file is field 13
        got = int(te.sparse(0)[i])
        if raw and raw in seen:
            assert v.decode([got]) == [raw]
        else:
            assert got == 0


def test_avazu_sample(tmp_path):
    src = real(AVAZU)
    out = tmp_path / "avazu"
    ok("avazu", src, "--out", out)
    ds = open_dataset(out, verify=True)
    with src.open() as f:
        rows = list(csv.DictReader(f))
    assert ds.rows == len(rows) == 100
    names = [t.name for t in ds.meta.tables]
    assert names[:2] == ["hour_of_day", "day_of_week"] and "id" not in names and "click" not in names
    assert ds.meta.num_dense == 0
    np.testing.assert_array_equal(ds.labels, [float(r["click"]) for r in rows])
    for t, name in enumerate(names[2:], start=2):
        assert ds.meta.tables[t].cardinality == 1 + len({r[name] for r in rows if r[name]}), name
    # 14102100 is 2014-10-21 00:00, a Tuesday.
    assert load_vocab(out, "day_of_week").decode([1]) == ["Tue"]
    assert load_vocab(out, "hour_of_day").decode([1]) == ["00"]
    ok("avazu", src, "--hour", "keep", "--out", tmp_path / "keep")
    assert open_dataset(tmp_path / "keep").meta.tables[0].name == "hour"


def test_talkingdata_csv_and_parquet(tmp_path):
    src = real(TALKINGDATA)
    cats = ["ip", "app", "device", "os", "channel"]
    ok("csv", src, "--label", "is_attributed", "--categorical", ",".join(cats), "--out", tmp_path / "c")
    ds = open_dataset(tmp_path / "c", verify=True)
    table = pcsv.read_csv(src, convert_options=pcsv.ConvertOptions(
        column_types={c: pa.string() for c in cats}))
    assert ds.rows == table.num_rows == 10_000
    for t, c in enumerate(cats):
        assert ds.meta.tables[t].cardinality == 1 + len(set(table.column(c).to_pylist()))
    np.testing.assert_array_equal(ds.labels, table.column("is_attributed").to_numpy())

    # The same rows from Parquet (typed integer columns) give the same ids.
    pq.write_table(pcsv.read_csv(src), tmp_path / "td.parquet")
    ok("csv", tmp_path / "td.parquet", "--label", "is_attributed", "--categorical", ",".join(cats),
       "--out", tmp_path / "p")
    dp = open_dataset(tmp_path / "p", verify=True)
    for t in range(len(cats)):
        np.testing.assert_array_equal(dp.sparse(t), ds.sparse(t))


def test_a_dataset_without_dense_columns_trains_bagpipe_as_sync(tmp_path):
    """TalkingData has only categorical features: the dataset's dense array is [N, 0] (its
    file holds no rows' bytes) and every system trains on it, bagpipe bitwise as sync."""
    from helpers import assert_same_parameters

    from bagpipe_cli.engine import TrainConfig, train

    ok("csv", real(TALKINGDATA), "--label", "is_attributed", "--categorical",
       "ip,app,device,os,channel", "--out", tmp_path / "td")
    assert open_dataset(tmp_path / "td").dense.shape == (10_000, 0)
    kw = dict(data=str(tmp_path / "td"), batch_size=256, iterations=8, lookahead=4, trainers=2,
              eval_rows=1000)
    sync = train(TrainConfig(system="sync", **kw))
    assert_same_parameters(sync, train(TrainConfig(system="bagpipe", **kw)))


# --------------------------------------------------------------------------- encoding


def test_popularity_order_ties_and_min_count(tmp_path):
    # C1 counts: b 1, a 3, c 3, d 2 -> ids a=1, c=2 (tie: a appeared first), d=3, b=4.
    seq = ["0000000b", "0000000a", "0000000c", "0000000a", "0000000d", "0000000c",
           "0000000a", "0000000c", "0000000d", ""]
    src = write(tmp_path / "t.tsv", [criteo_line(cats=cats_with(v)) for v in seq])
    ok("criteo", src, "--out", tmp_path / "o")
    ds = open_dataset(tmp_path / "o")
    want = {"0000000a": 1, "0000000c": 2, "0000000d": 3, "0000000b": 4, "": 0}
    assert list(ds.sparse(0)) == [want[v] for v in seq]
    assert ds.meta.tables[0].cardinality == 5
    assert ds.meta.tables[1].cardinality == 1  # C2 always empty
    assert list(load_vocab(tmp_path / "o", 0).counts) == [3, 3, 2, 1]

    ok("criteo", src, "--min-count", "3", "--out", tmp_path / "m")
    dm = open_dataset(tmp_path / "m")
    assert dm.meta.tables[0].cardinality == 3
    assert list(dm.sparse(0)) == [{"0000000a": 1, "0000000c": 2}.get(v, 0) for v in seq]
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta["extra"]["tables"][0]["distinct"] == 4


def test_hashing(tmp_path):
    vals = [f"{i * 7919:08x}" for i in range(200)]
    src = write(tmp_path / "t.tsv", [criteo_line(cats=cats_with(v, vals[0])) for v in vals + [""]])
    ok("criteo", src, "--max-rows-per-table", "50", "--out", tmp_path / "h")
    ds = open_dataset(tmp_path / "h", verify=True)
    assert ds.meta.cardinalities == [50] * 26
    ids = np.asarray(ds.sparse(0))
    assert ids[-1] == 0 and ids[:-1].min() >= 1 and ids[:-1].max() <= 49
    assert len(set(ids[:-1])) > 30  # spread over the buckets
    assert len(set(ds.sparse(1)[:-1])) == 1  # one value, one bucket
    ok("criteo", src, "--max-rows-per-table", "50", "--out", tmp_path / "h2")
    np.testing.assert_array_equal(open_dataset(tmp_path / "h2").sparse(0), ids)  # deterministic
    assert not (tmp_path / "h" / "vocab").exists()
    # --vocab-from a hashed dataset hashes the same way.
    ok("criteo", src, "--vocab-from", tmp_path / "h", "--out", tmp_path / "h3")
    np.testing.assert_array_equal(open_dataset(tmp_path / "h3").sparse(0), ids)


def test_dense_transform_and_labels(tmp_path):
    ints = ["", "-3", "0", "5", "1000000", "7", "", "", "", "", "", "", "2"]
    src = write(tmp_path / "t.tsv", [criteo_line("1", ints), criteo_line("0")])
    ok("criteo", src, "--out", tmp_path / "o")
    ds = open_dataset(tmp_path / "o")
    want = [math.log1p(max(int(v), 0)) if v else 0.0 for v in ints]
    np.testing.assert_allclose(ds.dense[0], want, rtol=1e-6)
    np.testing.assert_array_equal(ds.dense[1], np.zeros(13))
    np.testing.assert_array_equal(ds.labels, [1.0, 0.0])


def test_csv_dense_quotes_and_sep(tmp_path):
    src = write(tmp_path / "d.csv", ['y;user;"price";x\n', '1;"a;b";2.5;9\n', '0;c;;9\n',
                                      '0;"a;b";-1e3;9\n'])
    ok("csv", src, "--sep", ";", "--label", "y", "--categorical", "user", "--dense", "price",
       "--out", tmp_path / "o")
    ds = open_dataset(tmp_path / "o")
    assert list(ds.sparse(0)) == [1, 2, 1]
    np.testing.assert_allclose(ds.dense[:, 0], [math.log1p(2.5), 0, 0], rtol=1e-6)


def test_multiple_files_and_gzip(tmp_path):
    a = write(tmp_path / "day_0", [criteo_line(cats=cats_with("000000aa")),
                                   criteo_line(cats=cats_with("000000bb"))])
    b = tmp_path / "day_1.gz"
    with gzip.open(b, "wt") as f:
        f.writelines([criteo_line(cats=cats_with(v)) for v in ["000000bb", "000000cc", "000000bb"]])
    ok("criteo", a, b, "--out", tmp_path / "o")
    ds = open_dataset(tmp_path / "o", verify=True)
    assert list(ds.sparse(0)) == [2, 1, 1, 3, 1]  # bb most popular; aa before cc (first seen)
    files = ds.meta.extra["files"]
    assert [(f["start"], f["stop"], f["rows"]) for f in files] == [(0, 2, 2), (2, 5, 3)]
    assert ds.meta.source["files"][1]["sha256"] == hashlib.sha256(b.read_bytes()).hexdigest()


def test_key_index_matches_dict():
    rng = np.random.default_rng(0)
    idx, ref = KeyIndex(4), {}
    for _ in range(20):
        keys = np.unique(rng.integers(-(2**62), 2**62, 500) // 7 * 7)
        rng.shuffle(keys)
        ids, new = idx.add(keys)
        for k, i, n in zip(keys.tolist(), ids.tolist(), new.tolist(), strict=True):
            assert n == (k not in ref)
            ref.setdefault(k, len(ref))
            assert ref[k] == i
    probe = rng.integers(-(2**62), 2**62, 1000)
    np.testing.assert_array_equal(idx.lookup(probe), [ref.get(k, -1) for k in probe.tolist()])


def test_config_errors_name_the_option(tmp_path):
    src = write(tmp_path / "t.tsv", [criteo_line()])
    with pytest.raises(ConfigError, match="--min-count"):
        PreprocessConfig("criteo", (src,), min_count=0)
    with pytest.raises(ConfigError, match="--max-rows-per-table"):
        PreprocessConfig("criteo", (src,), max_rows_per_table=1)
    with pytest.raises(ConfigError, match="--vocab-from"):
        PreprocessConfig("criteo", (src,), vocab_from=tmp_path, min_count=2)
    r = run("criteo", tmp_path / "nope.tsv", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "nope.tsv" in r.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    r = run("criteo", src, "--out", tmp_path / "full")
    assert r.exit_code == 2 and "--overwrite" in r.output
    ok("criteo", src, "--out", tmp_path / "full", "--overwrite")


# --------------------------------------------------------------------------- bad input


def good_lines(n: int) -> list[str]:
    return [criteo_line(str(i % 2), ("1",) * 13, cats_with(f"{i % 97:08x}", "68fd1e64"))
            for i in range(n)]


@pytest.mark.parametrize("bad, line, problem", [
    ("1\t2\n", 3, "expected 40 fields, found 2"),
    (criteo_line("0", ("1", "2", "x7") + ("",) * 10), 3, "I3 = 'x7' is not an integer"),
    (criteo_line("0", cats=cats_with("zzzzzzzz")), 3, "C1 = 'zzzzzzzz' is not a hexadecimal"),
    (criteo_line("0", cats=cats_with("123456789")), 3, "C1 = '123456789' is not a hexadecimal"),
    (criteo_line("2"), 3, "label = 2 is not 0 or 1"),
    ("\n", 3, "empty line"),
])
def test_bad_line_is_an_error_naming_file_and_line(tmp_path, bad, line, problem):
    lines = good_lines(5)
    lines.insert(line - 1, bad)
    src = write(tmp_path / "bad.tsv", lines)
    out = tmp_path / "o"
    r = run("criteo", src, "--out", out)
    assert r.exit_code == 2, r.output
    msg = r.output.replace("\n", " ")
    assert f"{src}:{line}: {problem}" in msg, msg
    assert "Traceback" not in r.output
    assert not out.exists() and not list(tmp_path.glob(".o*"))

    r = run("criteo", src, "--out", out, "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rows"] == 5
    assert meta["extra"]["bad_lines"]["count"] == 1
    assert meta["extra"]["bad_lines"]["first"][0]["line"] == line
    assert problem in meta["extra"]["bad_lines"]["first"][0]["problem"]


@pytest.mark.parametrize("hour", ["14109999", "14102124", "14023100", "-1"])
def test_a_bad_avazu_hour_is_a_line_error(tmp_path, hour):
    """An hour that is not YYMMDDHH (hour 99 or 24, February 31st, negative) names its line."""
    header = "id,click,hour,C1,site_id\n"
    rows = [f"{i},{i % 2},14102100,100{i % 3},s{i % 5}\n" for i in range(6)]
    rows.insert(3, f"9,1,{hour},1005,s1\n")
    src = write(tmp_path / "bad.csv", [header, *rows])
    r = run("avazu", src, "--out", tmp_path / "o")
    assert r.exit_code == 2, r.output
    assert f"{src}:5: hour = {hour} is not YYMMDDHH" in r.output.replace("\n", " ")
    assert "Traceback" not in r.output and not (tmp_path / "o").exists()
    r = run("avazu", src, "--out", tmp_path / "o", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    assert open_dataset(tmp_path / "o").rows == 6


def test_empty_truncated_and_missing_column(tmp_path):
    empty = write(tmp_path / "empty.tsv", [])
    r = run("criteo", empty, "--out", tmp_path / "o")
    assert r.exit_code == 2 and f"{empty}: empty file" in r.output

    gz = tmp_path / "t.tsv.gz"
    with gzip.open(gz, "wt") as f:
        f.writelines(good_lines(3000))
    cut = tmp_path / "cut.tsv.gz"
    cut.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    r = run("criteo", cut, "--out", tmp_path / "o")
    assert r.exit_code == 2 and f"{cut}: truncated gzip file" in r.output, r.output

    src = write(tmp_path / "a.csv", ["y,u\n", "1,a\n"])
    r = run("csv", src, "--label", "y", "--categorical", "u,foo", "--out", tmp_path / "o")
    assert r.exit_code == 2 and f"--categorical: column 'foo' not in {src}" in r.output
    header_only = write(tmp_path / "h.csv", ["y,u\n"])
    r = run("csv", header_only, "--label", "y", "--categorical", "u", "--out", tmp_path / "o")
    assert r.exit_code == 2 and "no data lines" in r.output
    assert not (tmp_path / "o").exists()


def test_bad_line_deep_in_a_large_file(tmp_path):
    good = criteo_line("1", ("3",) + ("",) * 12, cats_with("68fd1e64"))
    n, bad_at = 200_000, 150_000
    lines = [good] * n
    lines[bad_at - 1] = criteo_line("1", ("3", "oops") + ("",) * 11)
    lines[bad_at + 9] = "1\t2\t3\n"
    src = write(tmp_path / "big.tsv", lines)
    r = run("criteo", src, "--out", tmp_path / "o", "--block-mb", "0.5")
    assert r.exit_code == 2
    assert f"{src}:{bad_at}: I2 = 'oops' is not an integer" in r.output.replace("\n", " ")
    r = run("criteo", src, "--out", tmp_path / "o", "--block-mb", "0.5", "--on-bad-line", "skip")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["rows"] == n - 2
    assert [b["line"] for b in meta["extra"]["bad_lines"]["first"]] == [bad_at, bad_at + 10]


def test_help_has_examples():
    for sub in ([], ["criteo"], ["avazu"], ["csv"]):
        r = CliRunner().invoke(cli, ["preprocess", *sub, "--help"])
        assert r.exit_code == 0 and "Example: bagpipe preprocess" in r.output


def test_library_progress_and_result(tmp_path):
    src = write(tmp_path / "t.tsv", good_lines(10))
    phases = []

    class Bar:
        def __init__(self, phase, total):
            self.phase, self.total, self.n = phase, total, 0

        def __enter__(self):
            phases.append(self)
            return lambda n: setattr(self, "n", self.n + n)

        def __exit__(self, *exc):
            return False

    res = preprocess(PreprocessConfig("criteo", (src,)), tmp_path / "o", progress=Bar)
    assert res.rows == 10 and res.bad_lines == 0
    assert [(b.phase, b.total, b.n) for b in phases] == [("read", None, 10), ("write", 10, 10)]
    assert res.tables[0].cardinality == 11 and res.tables[0].distinct == 10


def test_hex_check_every_byte():
    from bagpipe_cli.data.preprocess.vocab import hex_bad

    ok_bytes = set(b"0123456789abcdefABCDEF")
    for pos in (0, 3, 7):
        words = np.full((256, 8), ord("a"), np.uint8)
        words[:, pos] = np.arange(256)
        got = hex_bad(words.view("<i8").ravel())
        assert list(got) == [c not in ok_bytes for c in range(256)]


def test_parquet_is_known_by_its_magic_bytes_not_its_name(tmp_path):
    src = tmp_path / "clicks.parquet.brotli"
    pq.write_table(pa.table({"label": [0, 1, 0, 1], "item": ["x", "y", "x", "z"],
                             "price": [1.5, 2.0, None, 4.0]}), src, compression="brotli")
    ok("csv", src, "--label", "label", "--categorical", "item", "--dense", "price",
       "--out", tmp_path / "out")
    ds = open_dataset(tmp_path / "out")
    assert ds.rows == 4 and ds.sparse(0).tolist() == [1, 2, 1, 3]
    np.testing.assert_allclose(ds.dense[:, 0], np.log1p([1.5, 2.0, 0.0, 4.0]).astype(np.float32))


def test_integers_beyond_a_c_long_are_values_not_tracebacks(tmp_path):
    """A Criteo count past int64 is still a count (its log is kept), and an Avazu hour past
    int64 is a bad line, not an overflow."""
    big = "99999999999999999999999"
    src = write(tmp_path / "day.tsv", [criteo_line("1", (big,) + ("1",) * 12, cats_with("0a")),
                                       criteo_line("0", ("2",) * 13, cats_with("0b"))])
    ok("criteo", src, "--out", tmp_path / "out")
    dense = open_dataset(tmp_path / "out").dense
    assert dense[0, 0] == pytest.approx(np.log1p(float(big)), rel=1e-6) and np.isfinite(dense).all()
    av = write(tmp_path / "av.csv", ["id,click,hour,C1\n", "1,0,14102100,a\n",
                                     "2,1,9223372036854775807,b\n", "3,1,-9223372036854775808,c\n"])
    r = run("avazu", av, "--on-bad-line", "skip", "--out", tmp_path / "av")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "av" / "meta.json").read_text())
    assert meta["rows"] == 1 and meta["extra"]["bad_lines"]["count"] == 2


def test_npy_headers_are_read_one_thread_at_a_time(tmp_path, monkeypatch):
    """numpy parses an .npy header with ast.literal_eval, which CPython 3.11 cannot run in two
    threads at once (a SystemError that failed this file's tests now and then): preprocess
    remaps its tables on several threads, and opening the dataset reads every array's
    header, each under `checks.NPY_HEADER`."""
    from bagpipe_cli.data.checks import NPY_HEADER
    from bagpipe_cli.data.format import open_dataset

    impl = np.lib.format.read_array_header_1_0.__globals__  # the module numpy defines it in
    read, unlocked = impl["_read_array_header"], []

    def header(*a, **k):
        unlocked.append(not NPY_HEADER.locked())
        return read(*a, **k)

    monkeypatch.setitem(impl, "_read_array_header", header)
    ok("csv", real(TALKINGDATA), "--label", "is_attributed", "--categorical",
       "ip,app,device,os,channel", "--out", tmp_path / "td")
    open_dataset(tmp_path / "td")
    assert len(unlocked) >= 10 and not any(unlocked)
