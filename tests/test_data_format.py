import json

import numpy as np
import pytest

from bagpipe_cli.data import DatasetWriter, TableSpec, iter_batches, open_dataset
from bagpipe_cli.data.format import META_FILE, sparse_file
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.io import atomic_dir


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
    from bagpipe_cli.io import write_json

    write_json(tmp_path / "x.json", {"a": float("nan"), "b": [1.5, float("inf")], "c": np.float32(2)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.5, None], "c": 2.0}
