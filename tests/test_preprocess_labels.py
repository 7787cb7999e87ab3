"""`bagpipe preprocess --label-threshold`: a 0/1 label derived from a numeric column (a 1..5
rating, say), the not-0/1 error that points to it, and the warnings a finished preprocess
gives about a dataset of little use (one label class, most rows dropped, constant dense
features)."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import run_cli

from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.data.preprocess import PreprocessConfig, preprocess
from bagpipe_cli.data.preprocess.layout import LabelThreshold
from bagpipe_cli.errors import ConfigError

RATINGS = [(i * 7 + i // 5) % 5 + 1 for i in range(60)]  # every value 1..5, in no order
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt,
       "==": operator.eq, "!=": operator.ne}


def ratings_csv(path: Path, ratings: list = RATINGS, age: str = "-1") -> Path:
    """A MovieLens-like CSV: user, item, rating, timestamp, genre, age (`age`: every row's),
    seven (7 in every row)."""
    rows = [f"u{i % 9},i{i % 13},{r},{880000000 + 37 * i},g{i % 4},{age},7\n"
            for i, r in enumerate(ratings)]
    path.write_text("user,item,rating,timestamp,genre,age,seven\n" + "".join(rows))
    return path


def csv_args(src: Path, out: Path, *extra: str) -> list[str]:
    return ["preprocess", "csv", str(src), "--categorical", "user,item", "--out", str(out), *extra]


def ok(*args: str):
    r = run_cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def refused(r, *expect: str) -> str:
    """The one `Error: ...` line of an exit-2 result, checked to contain every `expect`."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


def warnings(r) -> list[str]:
    """The `Warning: ...` lines of a result's stderr (none may be on stdout)."""
    assert "Warning" not in r.stdout
    return [ln for ln in r.stderr.splitlines() if ln.startswith("Warning: ")]


# --------------------------------------------------------------------------- the label


def test_a_rating_threshold_gives_each_row_its_label(tmp_path):
    src = ratings_csv(tmp_path / "ml.csv")
    out = tmp_path / "ml"
    r = ok(*csv_args(src, out, "--dense", "timestamp", "--label-threshold", "rating>=4"))
    ds = open_dataset(out, verify=True)
    want = [float(x >= 4) for x in RATINGS]
    assert 0 < sum(want) < len(want)
    np.testing.assert_array_equal(ds.labels, want)
    # The rating is the label, not a feature; the summary and meta.json say how it was made.
    assert ds.meta.label == "rating" and ds.meta.dense_features == ["timestamp"]
    assert [t.name for t in ds.meta.tables] == ["user", "item"]
    assert "rating (1 where rating >= 4, else 0)" in r.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["options"]["label_threshold"] == "rating>=4"
    assert meta["options"]["label"] == "rating"
    assert meta["extra"]["label"] == {"column": "rating", "threshold": "rating>=4",
                                      "rule": "1 where rating >= 4, else 0",
                                      "rows_0": want.count(0.0), "rows_1": want.count(1.0)}
    assert warnings(r) == []  # balanced labels, a timestamp that varies


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("value", ["3", "2.5", " 4 "])
def test_each_operator_compares_every_row(tmp_path, op, value):
    src = ratings_csv(tmp_path / "ml.csv")
    ok(*csv_args(src, tmp_path / "o", "--label-threshold", f"rating {op}{value}"))
    want = [float(OPS[op](x, float(value))) for x in RATINGS]
    np.testing.assert_array_equal(open_dataset(tmp_path / "o").labels, want)
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["options"]["label_threshold"] == f"rating{op}{value.strip()}"


def test_the_threshold_parses_its_column_operator_and_number():
    assert LabelThreshold.parse("rating>=4") == LabelThreshold("rating", ">=", 4.0)
    assert LabelThreshold.parse(" user score <-1.5e1 ") == LabelThreshold("user score", "<", -15.0)
    assert LabelThreshold.parse("a<b>=4") == LabelThreshold("a<b", ">=", 4.0)  # the last OP
    assert str(LabelThreshold.parse("x != .5")) == "x!=0.5"


def test_a_threshold_on_parquet_and_with_the_same_label(tmp_path):
    src = tmp_path / "ml.parquet"
    pq.write_table(pa.table({"user": [f"u{i % 9}" for i in range(len(RATINGS))],
                             "item": [f"i{i % 13}" for i in range(len(RATINGS))],
                             "rating": pa.array(RATINGS, pa.int8())}), src)
    ok(*csv_args(src, tmp_path / "p", "--label", "rating", "--label-threshold", "rating>3"))
    np.testing.assert_array_equal(open_dataset(tmp_path / "p").labels,
                                  [float(x > 3) for x in RATINGS])


def test_a_value_that_is_not_a_number_is_a_bad_line(tmp_path):
    ratings = list(RATINGS[:10])
    ratings[4], ratings[7] = "x", ""  # lines 6 and 9 (the header is line 1)
    src = ratings_csv(tmp_path / "ml.csv", ratings)
    refused(run_cli(*csv_args(src, tmp_path / "o", "--label-threshold", "rating>=4")),
            f"{src}:6: rating = 'x' is not a number", "--on-bad-line skip")
    assert not (tmp_path / "o").exists()
    ok(*csv_args(src, tmp_path / "o", "--label-threshold", "rating>=4", "--on-bad-line", "skip"))
    ds = open_dataset(tmp_path / "o")
    kept = [r for r in ratings if r not in ("x", "")]
    np.testing.assert_array_equal(ds.labels, [float(r >= 4) for r in kept])
    assert ds.meta.extra["bad_lines"]["causes"] == {"rating: not a number": 1,
                                                    "rating: missing label": 1}


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("expr, expect", [
    ("rating=>4", "expected COLUMN OP NUMBER, OP one of >=, >, <=, <, ==, !="),
    ("rating=4", "expected COLUMN OP NUMBER"),
    ("rating", "expected COLUMN OP NUMBER"),
    (">=4", "expected COLUMN OP NUMBER"),
    ("rating>=four", "expected COLUMN OP NUMBER"),
    ("rating>=inf", "expected COLUMN OP NUMBER"),
    ("rating>=4 stars", "expected COLUMN OP NUMBER"),
    ("", "expected COLUMN OP NUMBER"),
    ("rating>=1e400", "1e400 is beyond the range of a 64-bit float"),
])
def test_a_malformed_threshold_is_one_error_line(tmp_path, expr, expect):
    src = ratings_csv(tmp_path / "ml.csv")
    line = refused(run_cli(*csv_args(src, tmp_path / "o", "--label-threshold", expr)), expect)
    assert line.startswith(f"Error: --label-threshold {expr!r}: ")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError, match="--label-threshold"):
        PreprocessConfig("csv", (src,), label=None, categorical=("user",), label_threshold=expr)


@pytest.mark.parametrize("extra, expect", [
    (("--label-threshold", "ratin>=4"), "--label-threshold: column 'ratin' not in {src} header "
                                        "(columns: user, item, rating, timestamp, genre, age, seven)"),
    (("--label", "genre", "--label-threshold", "rating>=4"),
     "--label-threshold 'rating>=4' derives the label from column 'rating', but --label is 'genre'"),
    (("--label-threshold", "rating>=4", "--dense", "timestamp,rating"),
     "--dense: column 'rating' is given to both --label-threshold and --dense"),
    (("--label-threshold", "item>=4"), "column 'item' is given to both --label-threshold and "
                                       "--categorical"),
    ((), "--label: give the label column, or derive a 0/1 label from a numeric column with "
         "--label-threshold"),
])
def test_a_threshold_column_that_cannot_be_the_label_is_refused(tmp_path, extra, expect):
    src = ratings_csv(tmp_path / "ml.csv")
    refused(run_cli(*csv_args(src, tmp_path / "o", *extra)), expect.format(src=src))
    assert not (tmp_path / "o").exists()


def criteo_line(label: str, i1: str = "1") -> str:
    return "\t".join([label, i1] + [""] * 12 + ["68fd1e64"] + [""] * 25) + "\n"


def test_criteo_and_avazu_threshold_their_own_label_column(tmp_path):
    counts = ["0", "2", "1", "0", "5"]
    tsv = tmp_path / "day.tsv"
    tsv.write_text("".join(criteo_line(c, str(i)) for i, c in enumerate(counts)))
    ok("preprocess", "criteo", str(tsv), "--label-threshold", "label>=1", "--out", str(tmp_path / "c"))
    np.testing.assert_array_equal(open_dataset(tmp_path / "c").labels, [0, 1, 1, 0, 1])
    refused(run_cli("preprocess", "criteo", str(tsv), "--label-threshold", "I1>=3", "--out",
                    str(tmp_path / "c2")), "the label of criteo input is its 'label' column")
    refused(run_cli("preprocess", "criteo", str(tsv), "--no-label", "--label-threshold", "label>=1",
                    "--out", str(tmp_path / "c3")), "cannot be combined with --no-label")

    av = tmp_path / "av.csv"
    av.write_text("id,click,hour,site_id\n" + "".join(
        f"{i},{c},14102100,s{i % 3}\n" for i, c in enumerate(counts)))
    ok("preprocess", "avazu", str(av), "--label-threshold", "click>=2", "--out", str(tmp_path / "a"))
    np.testing.assert_array_equal(open_dataset(tmp_path / "a").labels, [0, 1, 0, 0, 1])
    refused(run_cli("preprocess", "avazu", str(av), "--label-threshold", "site_id>=1", "--out",
                    str(tmp_path / "a2")), "the label of avazu input is its 'click' column")


# --------------------------------------------------------------------------- not 0 or 1


def test_a_label_that_is_not_0_or_1_points_to_the_threshold(tmp_path):
    src = ratings_csv(tmp_path / "ml.csv")
    first = next(i for i, r in enumerate(RATINGS) if r not in (0, 1))
    line = refused(run_cli(*csv_args(src, tmp_path / "o", "--label", "rating")),
                   f"{src}:{first + 2}: rating = {RATINGS[first]} is not 0 or 1; derive a 0/1 "
                   f"label with --label-threshold 'rating>={RATINGS[first]}', or pass "
                   "--on-bad-line skip to drop such lines")
    assert line.count("Error") == 1
    # A value no threshold makes a number is offered the skip only.
    ratings = ["1", "0", "yes"]
    src = ratings_csv(tmp_path / "yes.csv", ratings)
    line = refused(run_cli(*csv_args(src, tmp_path / "o", "--label", "rating")),
                   f"{src}:4: rating = 'yes' is not 0 or 1 (pass --on-bad-line skip")
    assert "--label-threshold" not in line
    # With skip, meta.json records the problem without the advice to skip.
    ok(*csv_args(src, tmp_path / "o", "--label", "rating", "--on-bad-line", "skip"))
    first_bad = open_dataset(tmp_path / "o").meta.extra["bad_lines"]["first"][0]
    assert first_bad["problem"] == "rating = 'yes' is not 0 or 1"


# --------------------------------------------------------------------------- warnings


def test_the_user_report_one_label_class_left_after_skipping_is_warned(tmp_path):
    """The report this feature answers: a 1..5 rating as --label with --on-bad-line skip keeps
    only the rating-1 rows, all labelled 1."""
    src = ratings_csv(tmp_path / "ml.csv", age="3")
    r = ok(*csv_args(src, tmp_path / "o", "--label", "rating", "--on-bad-line", "skip"))
    kept, dropped = RATINGS.count(1), len(RATINGS) - RATINGS.count(1)
    assert open_dataset(tmp_path / "o").labels.tolist() == [1.0] * kept
    w = warnings(r)
    assert len(w) == 2, r.stderr
    assert w[0].startswith(f"Warning: --on-bad-line skip dropped {dropped} of the {len(RATINGS)} "
                           f"rows read ({dropped / len(RATINGS):.0%}), most for 'rating: not 0 or 1' "
                           f"({dropped}); the dataset holds only the other {kept}; to keep those "
                           "rows, derive a 0/1 label with --label-threshold 'rating>=T'")
    assert w[1].startswith(f"Warning: every one of the {kept} rows has label 1, after "
                           f"--on-bad-line skip dropped {dropped} of the {len(RATINGS)} rows read")
    assert "training on it and its AUC are meaningless" in w[1]


def test_one_label_class_is_warned_and_two_are_not(tmp_path):
    src = ratings_csv(tmp_path / "ml.csv", age="3")
    r = ok(*csv_args(src, tmp_path / "none", "--label-threshold", "rating>5"))
    assert warnings(r) == [f"Warning: every one of the {len(RATINGS)} rows has label 0, by "
                           "--label-threshold 'rating>5': with one class there is nothing to learn "
                           "and AUC is undefined, so training on it and its AUC are meaningless"]
    r = ok(*csv_args(src, tmp_path / "all", "--label-threshold", "rating>=1"))
    assert len(warnings(r)) == 1
    assert f"every one of the {len(RATINGS)} rows has label 1, by" in warnings(r)[0]
    r = ok(*csv_args(src, tmp_path / "two", "--label-threshold", "rating>=3"))
    assert warnings(r) == []


def test_a_few_skipped_lines_are_not_warned(tmp_path):
    ratings = ["1" if i % 2 else "0" for i in range(20)]
    ratings[3] = "7"  # 1 line of 20 dropped: recorded, not warned about
    src = ratings_csv(tmp_path / "ml.csv", ratings, age="3")
    r = ok(*csv_args(src, tmp_path / "o", "--label", "rating", "--on-bad-line", "skip"))
    assert warnings(r) == []
    assert open_dataset(tmp_path / "o").meta.extra["bad_lines"]["count"] == 1


def test_a_constant_dense_feature_is_warned_by_name(tmp_path):
    src = ratings_csv(tmp_path / "ml.csv", age="-1")  # log(1 + max(-1, 0)) = 0 in every row
    r = ok(*csv_args(src, tmp_path / "o", "--label-threshold", "rating>=4",
                     "--dense", "timestamp,age,seven"))
    assert warnings(r) == ["Warning: dense features 'age' (always 0: missing or <= 0), 'seven' "
                           "(always 2.079) are constant after log(1 + max(x, 0)): they carry "
                           "nothing a model can learn from"]
    r = ok(*csv_args(src, tmp_path / "o2", "--label-threshold", "rating>=4", "--dense", "age"))
    assert warnings(r) == ["Warning: dense feature 'age' (always 0: missing or <= 0) is constant "
                           "after log(1 + max(x, 0)): it carries nothing a model can learn from"]
    r = ok(*csv_args(src, tmp_path / "o3", "--label-threshold", "rating>=4", "--dense", "timestamp"))
    assert warnings(r) == []


def test_the_library_returns_warnings_and_prints_nothing(tmp_path, capfd):
    src = ratings_csv(tmp_path / "ml.csv", age="-1")
    res = preprocess(PreprocessConfig("csv", (src,), label=None, label_threshold="rating>9",
                                      categorical=("user",), dense=("age",)), tmp_path / "o")
    assert len(res.warnings) == 2 and all(isinstance(w, str) for w in res.warnings)
    assert "has label 0" in res.warnings[0] and "'age'" in res.warnings[1]
    assert capfd.readouterr() == ("", "")
