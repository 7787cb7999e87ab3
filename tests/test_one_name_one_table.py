"""A table is known by its name, and a row by a whole line: two tables of one name, or a file
still being written, are refused in one line instead of silently losing a table or reading a
half-written line as a row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from helpers import run_cli

from bagpipe_cli.data.preprocess.reader import iter_text_blocks
from bagpipe_cli.data.preprocess.sniff import TextFormat
from bagpipe_cli.errors import DataError

REAL = Path(__file__).resolve().parent / "data" / "real"


def test_avazu_with_a_column_named_like_a_derived_table_is_refused(tmp_path):
    lines = (REAL / "deepctr_avazu_sample.txt").read_text().splitlines()
    src = tmp_path / "avazu.csv"
    # a log that already has an hour_of_day column beside the raw hour
    src.write_text("\n".join([lines[0] + ",hour_of_day"] + [ln + ",7" for ln in lines[1:]]) + "\n")
    r = run_cli("preprocess", "avazu", str(src), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'hour_of_day'" in r.stderr and "--hour keep" in r.stderr
    assert not (tmp_path / "out").exists()
    r = run_cli("preprocess", "avazu", str(src), "--hour", "keep", "--out", str(tmp_path / "keep"))
    assert r.returncode == 0, r.stderr
    names = [t["name"] for t in json.loads((tmp_path / "keep" / "meta.json").read_text())["tables"]]
    assert len(names) == len(set(names)) and "hour" in names and "hour_of_day" in names


def test_a_dataset_whose_tables_share_a_name_is_refused(tiny_dataset, tmp_path):
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds)
    meta = json.loads((ds / "meta.json").read_text())
    meta["tables"][1]["name"] = meta["tables"][0]["name"]
    (ds / "meta.json").write_text(json.dumps(meta))
    r = run_cli("train", str(ds), "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "tables[1] is named" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_file_that_grows_while_it_is_read_is_refused(tmp_path):
    src = tmp_path / "log.csv"
    src.write_text("a,b\n" + "".join(f"{i},{i % 7}\n" for i in range(5000)))
    blocks = iter_text_blocks(src, TextFormat(), ["a", "b"], {"a": pa.int64()}, block_size=4096)
    next(blocks)  # the first block is read; another process appends, its last line half done
    with src.open("a") as f:
        f.write("5000,3\n5001")
    with pytest.raises(DataError, match=r"changed while it was read .* another process still "
                                        r"writing it"):
        list(blocks)


def test_a_file_that_does_not_change_is_read_whole(tmp_path):
    src = tmp_path / "log.csv"
    src.write_text("a,b\n" + "".join(f"{i},{i % 7}\n" for i in range(5000)))
    blocks = iter_text_blocks(src, TextFormat(), ["a", "b"], {"a": pa.int64()}, block_size=4096)
    assert sum(b.table.num_rows for b in blocks) == 5000
