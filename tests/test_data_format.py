import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe_cli.data import DatasetWriter, TableSpec, iter_batches, open_dataset
from bagpipe_cli.data.format import META_FILE, sparse_file
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.files.atomic import atomic_dir


def _write(path, n=10, chunks=3, label="label"):
    rng = np.random.default_rng(1)
    tables = [TableSpec("a", 5), TableSpec("b", 3_000_000_000), TableSpec("c", 2)]
    dense = rng.normal(size=(n, 2)).astype(np.float32)
    sparse = np.stack([rng.integers(0, 5, n), rng.integers(0, 3_000_000_000, n),
                       rng.integers(0, 2, n)], axis=1)
    labels = rng.integers(0, 2, n).astype(np.float32)
    with atomic_dir(path) as tmp:
        w = DatasetWriter(tmp, tables, ["x", "y"], label)
        for idx in np.array_split(np.arange(n), chunks):
            w.write(dense[idx], sparse[idx], labels[idx] if label else None)
        w.finish(name="t", source={"kind": "test"})
    return dense, sparse, labels


def test_round_trip_with_int64_table(tmp_path):
    dense, sparse, labels = _write(tmp_path / "d")
    ds = open_dataset(tmp_path / "d", verify=True)
    assert ds.rows == 10 and ds.meta.cardinalities == [5, 3_000_000_000, 2]
    assert ds.sparse(0).dtype == np.int32 and ds.sparse(1).dtype == np.int64
    np.testing.assert_array_equal(ds.sparse_block(0, 10), sparse)
    np.testing.assert_array_equal(ds.dense, dense)
    np.testing.assert_array_equal(ds.labels, labels)
    # plain numpy can map every array
    assert np.load(tmp_path / "d" / sparse_file(1), mmap_mode="r").shape == (10,)


def test_unlabeled_dataset(tmp_path):
    _write(tmp_path / "d", label=None)
    ds = open_dataset(tmp_path / "d")
    assert ds.labels is None and ds.meta.label is None


def test_batches_in_order_and_shuffled(tmp_path):
    dense, sparse, labels = _write(tmp_path / "d", n=10)
    ds = open_dataset(tmp_path / "d")
    bs = list(iter_batches(ds, 4))
    assert [len(b.labels) for b in bs] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([b.sparse for b in bs]), sparse)
    assert len(list(iter_batches(ds, 4, drop_last=True))) == 2
    sh = list(iter_batches(ds, 4, shuffle=True, seed=3))
    got = np.concatenate([b.dense for b in sh])
    assert not np.array_equal(got, dense)  # a permutation of 10 rows, not the identity
    np.testing.assert_array_equal(np.sort(got[:, 0]), np.sort(dense[:, 0]))
    again = np.concatenate([b.dense for b in iter_batches(ds, 4, shuffle=True, seed=3)])
    np.testing.assert_array_equal(got, again)


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "d") as tmp:
        (tmp / "partial").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_empty_out_unless_overwrite(tmp_path):
    _write(tmp_path / "d")
    with pytest.raises(ConfigError, match="--overwrite"):
        _write(tmp_path / "d")
    with atomic_dir(tmp_path / "d", overwrite=True) as tmp:
        (tmp / "new").write_text("x")
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: (d / META_FILE).unlink(), "not a bagpipe dataset"),
        (lambda d: (d / META_FILE).write_text("{not json"), "corrupt JSON"),
        (lambda d: _edit_meta(d, schema_version=99), "schema_version 99"),
        (lambda d: _edit_meta(d, rows=11), r"shape \(10,\), expected \(11,\)"),
        (lambda d: _edit_meta(d, tables="x"), "wrong type"),
        (lambda d: (d / sparse_file(2)).unlink(), "missing array file"),
        (lambda d: (d / sparse_file(0)).write_bytes(b"garbage"), "not a readable .npy"),
    ],
)
def test_corrupt_dataset_gives_clear_error(tmp_path, damage, match):
    _write(tmp_path / "d")
    damage(tmp_path / "d")
    with pytest.raises(DataError, match=match):
        open_dataset(tmp_path / "d")


def test_checksum_and_range_verification(tmp_path):
    _write(tmp_path / "d")
    ds = open_dataset(tmp_path / "d")
    path = tmp_path / "d" / sparse_file(0)
    a = np.load(path)
    a[3] = 4 if a[3] != 4 else 3
    np.save(path, a)
    with pytest.raises(DataError, match="checksum mismatch"):
        open_dataset(tmp_path / "d", verify=True)
    del ds


def test_missing_directory_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        open_dataset(tmp_path / "nope")


def _edit_meta(d, **fields):
    m = json.loads((d / META_FILE).read_text())
    m.update(fields)
    (d / META_FILE).write_text(json.dumps(m))


def test_write_json_is_strict(tmp_path):
    from bagpipe_cli.files.atomic import write_json

    write_json(tmp_path / "x.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": np.float32(2)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.5, None], "c": 2.0}


# --------------------------------------------------------------------------- the arrays' values


def _damaged(tmp_path, fname, row, value):
    _write(tmp_path / "d", n=10)
    a = np.load(tmp_path / "d" / fname)
    a[row] = value
    np.save(tmp_path / "d" / fname, a)
    return tmp_path / "d"


@pytest.mark.parametrize("fname, row, value, match", [
    (sparse_file(0), 7, -1, r"cat_000.npy: row 7: id -1 is outside \[0, 5\) of table 'a'"),
    (sparse_file(0), 3, 5, r"cat_000.npy: row 3: id 5 is outside \[0, 5\)"),
    (sparse_file(1), 9, 3_000_000_000, r"cat_001.npy: row 9: id 3000000000 is outside"),
    ("labels.npy", 4, np.nan, r"labels.npy: row 4: label nan is not 0 or 1"),
    ("labels.npy", 0, 0.5, r"labels.npy: row 0: label 0.5 is not 0 or 1"),
    ("dense.npy", 6, [0.0, np.inf], r"dense.npy: row 6: dense feature 'y' is inf"),
    ("dense.npy", 2, [np.nan, 1.0], r"dense.npy: row 2: dense feature 'x' is nan"),
])
def test_every_open_checks_the_values(tmp_path, fname, row, value, match):
    with pytest.raises(DataError, match=match):
        open_dataset(_damaged(tmp_path, fname, row, value))


def test_the_values_are_checked_in_chunks_and_once_per_file(tmp_path, monkeypatch):
    from bagpipe_cli.data import checks

    monkeypatch.setattr(checks, "CHUNK_BYTES", 8)  # two int32 ids, one dense row a chunk
    d = _damaged(tmp_path, sparse_file(0), 9, 4)  # still in range
    calls = []
    monkeypatch.setattr(checks, "_ids", lambda *a: calls.append(a[0].name))
    open_dataset(d)
    open_dataset(d)  # unchanged: not checked again
    assert sorted(calls) == [sparse_file(t) for t in range(3)]
    monkeypatch.undo()
    monkeypatch.setattr(checks, "CHUNK_BYTES", 8)
    a = np.load(d / sparse_file(0))
    a[9] = 5  # out of range, in the last chunk
    np.save(d / sparse_file(0), a)
    with pytest.raises(DataError, match="row 9: id 5"):
        open_dataset(d)


def test_a_wrongly_typed_meta_mapping_is_a_data_error(tmp_path):
    _write(tmp_path / "d")
    _edit_meta(tmp_path / "d", options=[1, 2])
    with pytest.raises(DataError, match="field 'options' must be a JSON object"):
        open_dataset(tmp_path / "d")
    _edit_meta(tmp_path / "d", options={}, tables=[{"name": "a", "cardinality": 2**62},
                                                   {"name": "b", "cardinality": 2**62}])
    with pytest.raises(DataError, match="2\\^62"):
        open_dataset(tmp_path / "d")


# --------------------------------------------------------------------------- fuzz


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
_META_KEYS = ("schema_version", "name", "rows", "tables", "dense_features", "label", "source",
              "options", "checksums", "extra", "created")
_DTYPES = ("int8", "int16", "int32", "int64", "uint32", "uint64", "float16", "float32", "float64",
           "bool", "complex64")


@st.composite
def _damage(draw):
    kind = draw(st.sampled_from(["meta", "table", "array", "bytes", "value", "remove"]))
    fname = draw(st.sampled_from([sparse_file(0), sparse_file(1), sparse_file(2), "dense.npy",
                                  "labels.npy"]))
    if kind == "meta":
        return kind, draw(st.sampled_from(_META_KEYS)), draw(st.none() | _JSON.map(lambda v: [v]))
    if kind == "table":
        return kind, draw(st.integers(0, 2)), draw(_JSON)
    if kind == "array":
        shape = draw(st.lists(st.integers(0, 12), max_size=3))
        return kind, fname, (draw(st.sampled_from(_DTYPES)), tuple(shape))
    if kind == "bytes":
        return kind, fname, draw(st.binary(max_size=300))
    if kind == "value":
        return kind, fname, (draw(st.integers(0, 9)),
                             draw(st.integers(-2**63, 2**63 - 1) | st.floats(width=32)))
    return kind, fname, None


def _apply(d, damage):
    kind, where, what = damage
    if kind == "meta":
        m = json.loads((d / META_FILE).read_text())
        if what is None:
            m.pop(where, None)
        else:
            m[where] = what[0]
        (d / META_FILE).write_text(json.dumps(m))
    elif kind == "table":
        m = json.loads((d / META_FILE).read_text())
        m["tables"][where]["cardinality"] = what
        (d / META_FILE).write_text(json.dumps(m))
    elif kind == "array":
        np.save(d / where, np.zeros(what[1], dtype=what[0]))
    elif kind == "bytes":
        (d / where).write_bytes(what)
    elif kind == "value":
        a = np.load(d / where)
        row, v = what
        with np.errstate(all="ignore"):
            try:
                a[row] = v
            except (OverflowError, ValueError):  # beyond the array's type: out of range anyway
                a[row] = np.array(-1).astype(a.dtype)  # (wrapped: -1 itself overflows unsigned)
        np.save(d / where, a)
    else:
        (d / where).unlink()


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz") / "base"
    _write(base)
    return base


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(damages=st.lists(_damage(), min_size=1, max_size=3))
def test_fuzz_the_dataset_reader_raises_only_its_errors(fuzz_base, tmp_path_factory, damages):
    d = tmp_path_factory.mktemp("case") / "d"
    shutil.copytree(fuzz_base, d)
    for damage in damages:
        try:
            _apply(d, damage)
        except (KeyError, TypeError, IndexError, ValueError, OSError, EOFError):
            pass  # an earlier damage left nothing for this one to edit
    try:
        ds = open_dataset(d)
    except (DataError, ConfigError) as e:
        assert "\n" not in str(e) and str(e)
        return
    # Opened: every row reads, every id within its table.
    block = ds.sparse_block(0, ds.rows)
    assert ((block >= 0) & (block < np.array(ds.meta.cardinalities))).all()
    if ds.labels is not None:
        assert set(np.unique(ds.labels)) <= {0.0, 1.0}
    assert np.isfinite(ds.dense).all()
