import hashlib

import numpy as np
import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.data import open_dataset
from bagpipe_cli.data.synth import CRITEO_KAGGLE_CARDINALITIES, SynthConfig, zipf_ids


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.suffix == ".npy"}


def test_synth_cli_is_deterministic(tmp_path):
    args = ["synth", "--preset", "tiny", "--rows", "30000", "--seed", "7"]
    r1 = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "a")])
    r2 = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "b")])
    assert r1.exit_code == 0, r1.output
    assert r2.exit_code == 0, r2.output
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    r3 = CliRunner().invoke(cli, ["synth", "--preset", "tiny", "--rows", "30000", "--seed", "8",
                                  "--out", str(tmp_path / "c")])
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c"), r3.output


def test_synth_dataset_statistics(tiny_dataset):
    ds = open_dataset(tiny_dataset, verify=True)
    assert ds.rows == 20_000
    assert ds.meta.cardinalities == [1000, 50, 5000, 20, 800, 10, 3000, 200]
    assert ds.meta.num_dense == 4
    ctr = float(ds.labels.mean())
    assert 0.1 < ctr < 0.45
    for t, spec in enumerate(ds.meta.tables):
        ids = np.asarray(ds.sparse(t))
        assert ids.min() >= 1 and ids.max() < spec.cardinality
        counts = np.bincount(ids, minlength=spec.cardinality)
        # popularity order: id 1 is the most frequent id of every table
        assert counts[1] == counts[1:].max()
    # skew: in the largest table the top 1% of rows take a large share of accesses
    c = np.sort(np.bincount(np.asarray(ds.sparse(2))))[::-1]
    assert c[: 50].sum() / c.sum() > 0.4


def test_labels_are_learnable(tiny_dataset):
    """The most frequent ids carry a consistent effect: per-id CTR differs across ids."""
    ds = open_dataset(tiny_dataset)
    ids = np.asarray(ds.sparse(0))
    y = np.asarray(ds.labels)
    rates = [y[ids == k].mean() for k in range(1, 6)]
    assert max(rates) - min(rates) > 0.05


def test_criteo_preset_scaling():
    cfg = SynthConfig(scale=0.01, max_rows_per_table=50_000)
    cards = [t.cardinality for t in cfg.table_specs()]
    assert len(cards) == 26
    assert cards == [min(50_000, max(2, round(c * 0.01))) for c in CRITEO_KAGGLE_CARDINALITIES]
    assert [t.name for t in SynthConfig(tables=30).table_specs()][-1] == "C30"


def test_zipf_ids_range_and_skew():
    u = np.random.default_rng(0).random(200_000)
    for alpha in (0.5, 1.0, 1.1, 2.0):
        ids = zipf_ids(u, 1000, alpha)
        assert ids.min() >= 1 and ids.max() <= 999
        counts = np.bincount(ids, minlength=1000)[1:]
        assert counts[0] > counts[9] > counts[99]


@pytest.mark.parametrize(
    "args, option",
    [
        (["--rows", "0"], "--rows"),
        (["--rows", "-5"], "--rows"),
        (["--alpha", "0"], "--alpha"),
        (["--alpha", "-1"], "--alpha"),
        (["--scale", "0"], "--scale"),
        (["--tables", "0"], "--tables"),
        (["--max-rows-per-table", "1"], "--max-rows-per-table"),
        (["--dense", "-1"], "--dense"),
    ],
)
def test_synth_bad_options(tmp_path, args, option):
    r = CliRunner().invoke(cli, ["synth", "--preset", "tiny", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2
    assert option in r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_synth_refuses_non_empty_out(tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    r = CliRunner().invoke(cli, ["synth", "--preset", "tiny", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert (tmp_path / "o" / "keep.txt").read_text() == "mine"
    r = CliRunner().invoke(cli, ["synth", "--preset", "tiny", "--rows", "100", "--overwrite",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "o" / "keep.txt").exists()
    assert open_dataset(tmp_path / "o").rows == 100


def test_synth_without_dense_features(tmp_path):
    r = CliRunner().invoke(cli, ["synth", "--preset", "avazu", "--rows", "3000", "--scale", "0.001",
                                 "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    ds = open_dataset(tmp_path / "a", verify=True)
    assert ds.dense.shape == (3000, 0) and ds.meta.num_tables == 22
