"""Checkpoints: a resumed run is bitwise the run that was never stopped; bad checkpoints are refused."""

import json
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner
from helpers import assert_same_parameters, run_cli

from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.records.checkpoint import CheckpointError, find_checkpoint, list_checkpoints
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS, spec
from bagpipe_cli.errors import ConfigError

KW = dict(batch_size=256, iterations=24, lookahead=5, optimizer="adagrad", trainers=2, servers=2,
          dense_optimizer="adam", dense_lr=0.01, eval_rows=2000, seed=3)


def _keep_up_to(root, iteration):
    for p in list_checkpoints(root):
        if int(p.name.split("-")[1]) > iteration:
            shutil.rmtree(p)


@pytest.mark.parametrize("system", ENGINE_SYSTEMS)
def test_resume_equals_the_straight_run(tiny_dataset, tmp_path, system):
    kw = dict(data=str(tiny_dataset), system=system, **KW)
    ck = tmp_path / "ck"
    a = train(TrainConfig(**kw, checkpoint_every=5, checkpoint_dir=str(ck), checkpoint_keep=10))
    assert [p.name for p in list_checkpoints(ck)] == [f"ckpt-{b:08d}" for b in (20, 15, 10, 5)]
    assert a.summary["checkpoints"] == 4 and len(a.summary["checkpoint_ms"]) == 4
    _keep_up_to(ck, 10)  # as if the run had died between iterations 10 and 15
    b = train(TrainConfig(**kw, resume=str(ck)))
    assert b.summary["resumed_from"]["iteration"] == 10
    # Bitwise for every system, hotline included: its split of a batch follows the cache,
    # and a resumed fixed-capacity cache starts as the straight run's was at iteration 10.
    assert_same_parameters(a, b)
    assert b.metrics["loss"].tolist() == a.metrics["loss"].tolist()
    if spec(system).policy is not None:  # its plans from 10 on are the straight run's
        fa, fb = a.metrics["rows_fetched"].tolist(), b.metrics["rows_fetched"].tolist()
        assert fb[11:] == fa[11:] and fb[:10] == fa[:10]
        assert fb[10] > fa[10]  # ... after the rows it held were fetched back first
        if system == "hotline":
            assert b.metrics["popular_samples"].tolist() == a.metrics["popular_samples"].tolist()
    assert b.summary["rows_fetched"] == int(b.metrics["rows_fetched"].sum())


def test_checkpointing_does_not_change_the_run(tiny_dataset, tmp_path):
    kw = dict(data=str(tiny_dataset), system="bagpipe", **KW)
    plain = train(TrainConfig(**kw))
    a = train(TrainConfig(**kw, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ck")))
    assert_same_parameters(plain, a)
    # Only the newest two are kept; they hold the metrics so far, exactly.
    assert [p.name for p in list_checkpoints(tmp_path / "ck")] == ["ckpt-00000020", "ckpt-00000016"]
    ck = find_checkpoint(tmp_path / "ck")
    assert ck.iteration == 20 and len(ck.metrics[0]) == 20
    pd.testing.assert_frame_equal(pd.DataFrame(ck.metrics[0]), a.metrics.iloc[:20], check_exact=True)


def test_a_resumed_run_may_train_longer(tiny_dataset, tmp_path):
    kw = dict(data=str(tiny_dataset), system="bagpipe", **{**KW, "iterations": 30})
    straight = train(TrainConfig(**kw))
    short = {**kw, "iterations": 16}
    train(TrainConfig(**short, checkpoint_every=8, checkpoint_dir=str(tmp_path / "ck")))
    resumed = train(TrainConfig(**kw, resume=str(tmp_path / "ck" / "ckpt-00000008")))
    assert_same_parameters(straight, resumed)


def _tamper(path, name, how):
    f = path / name
    if how == "flip":
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif how == "truncate":
        f.write_bytes(f.read_bytes()[:100])
    else:
        f.unlink()


@pytest.mark.parametrize("name,how", [("tables.pt", "flip"), ("dense.pt", "truncate"),
                                      ("state.json", "delete"), ("checksums.json", "delete"),
                                      ("metrics.json", "flip")])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_good_one(tiny_dataset, tmp_path,
                                                                         name, how):
    kw = dict(data=str(tiny_dataset), system="bagpipe", **KW, checkpoint_every=6,
              checkpoint_dir=str(tmp_path / "ck"))
    train(TrainConfig(**kw))
    newest, previous = list_checkpoints(tmp_path / "ck")
    _tamper(newest, name, how)
    ck = find_checkpoint(tmp_path / "ck")
    assert ck.path == previous and len(ck.skipped) == 1 and newest.name in ck.skipped[0]
    with pytest.raises(CheckpointError, match="ckpt-00000018"):
        find_checkpoint(newest)
    _tamper(previous, "tables.pt", "flip")
    with pytest.raises(CheckpointError, match="no checkpoint verifies.*ckpt-00000018.*ckpt-00000012"):
        find_checkpoint(tmp_path / "ck")


def test_resume_refuses_another_config_or_dataset(tiny_dataset, tmp_path):
    kw = dict(data=str(tiny_dataset), system="bagpipe", **{**KW, "iterations": 8})
    train(TrainConfig(**kw, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ck")))
    with pytest.raises(CheckpointError, match="--batch-size 256, this run has --batch-size 128"):
        train(TrainConfig(**{**kw, "batch_size": 128}, resume=str(tmp_path / "ck")))
    with pytest.raises(CheckpointError, match="--lr"):
        train(TrainConfig(**{**kw, "lr": 0.5}, resume=str(tmp_path / "ck")))
    with pytest.raises(CheckpointError, match="nothing left to train"):
        train(TrainConfig(**{**kw, "iterations": 4}, resume=str(tmp_path / "ck")))
    with pytest.raises(ConfigError, match="het with --staleness > 0"):
        TrainConfig(data=str(tiny_dataset), system="het", staleness=2, checkpoint_every=5)
    with pytest.raises(ConfigError, match="--checkpoint-every must be >= 0"):
        TrainConfig(data=str(tiny_dataset), checkpoint_every=-1)
    # Another dataset of the very same shape (another seed): its arrays' checksums differ.
    from bagpipe_cli.data.synth import SynthConfig, generate

    other = tmp_path / "other"
    generate(SynthConfig(preset="tiny", rows=20_000, seed=1), other)
    with pytest.raises(CheckpointError, match="another dataset of the same shape .the checksums of cat_000.npy"):
        train(TrainConfig(**{**kw, "data": str(other)}, resume=str(tmp_path / "ck")))


def test_cli_checkpoints_and_resume(tiny_dataset, tmp_path):
    args = ["train", str(tiny_dataset), "--batch-size", "256", "--iterations", "12",
            "--eval-rows", "2000", "--lookahead", "4"]
    r = CliRunner().invoke(cli, [*args, "--checkpoint-every", "5", "--out", str(tmp_path / "a"),
                                 "--save-model", str(tmp_path / "a.pt")])
    assert r.exit_code == 0, r.output
    assert [p.name for p in list_checkpoints(tmp_path / "a.ckpt")] == ["ckpt-00000010", "ckpt-00000005"]
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["checkpoints"] == 2 and s["checkpoint_ms_median"] > 0 and s["checkpoint_overhead_pct"] > 0
    r = CliRunner().invoke(cli, [*args, "--resume", str(tmp_path / "a.ckpt"), "--out", str(tmp_path / "b"),
                                 "--save-model", str(tmp_path / "b.pt")])
    assert r.exit_code == 0, r.output
    assert_same_parameters(tmp_path / "a.pt", tmp_path / "b.pt")
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["resumed_from"]["iteration"] == 10 and s["iterations"] == 12
    # Not a checkpoint directory, a missing one, another config: one line, exit 2.
    (tmp_path / "empty").mkdir()
    for bad, msg in [([str(tmp_path / "empty")], "no checkpoints"),
                     ([str(tmp_path / "nope")], "no such directory"),
                     ([str(tmp_path / "a.ckpt"), "--seed", "9"], "--seed 0, this run has --seed 9")]:
        r = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "c"), "--resume", *bad])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
        assert r.output.strip().count("\n") == 0
        assert not (tmp_path / "c").exists()


@pytest.mark.slow
@pytest.mark.parametrize("system", ["bagpipe",  # the rest in make test-all
                                    *(pytest.param(s, marks=pytest.mark.extended)
                                      for s in ("lru", "hotline", "sharded-hot", "local"))])
def test_distributed_resume_equals_the_straight_run(tiny_dataset, tmp_path, system):
    """Over torch.distributed (2 trainers, 2 servers): bagpipe's partitioned cache (each
    trainer's own rows), lru's replicated cache (victims written back by key % N), hotline's
    (its warm cache sent to every trainer), sharded-hot's shards and replicated hot rows
    (each trainer's own, trainer 0's hot rows) and local's whole tables checkpoint and resume
    exactly."""
    kw = {**KW, "iterations": 16}
    argv = ["train", str(tiny_dataset), "--system", system,
            *[x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))],
            "--procs", "5", "--checkpoint-every", "6", "--checkpoint-dir", str(tmp_path / "ck"),
            "--checkpoint-keep", "5", "--save-model", str(tmp_path / "m.pt")]
    r = run_cli(*argv, "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in list_checkpoints(tmp_path / "ck")] == ["ckpt-00000012", "ckpt-00000006"]
    _keep_up_to(tmp_path / "ck", 6)
    r = run_cli(*argv, "--out", str(tmp_path / "b"), "--resume", str(tmp_path / "ck"), "--overwrite")
    assert r.returncode == 0, r.stderr[-2000:]
    ref = train(TrainConfig(data=str(tiny_dataset), system=system, **kw))
    assert_same_parameters(tmp_path / "m.pt", ref)
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["resumed_from"]["iteration"] == 6
    m = pd.read_csv(tmp_path / "b" / "metrics.csv")
    assert m["loss"].tolist() == ref.metrics["loss"].tolist()
    if system == "hotline":  # from iteration 6 on, the plans of the run never stopped
        assert m["popular_samples"].tolist() == ref.metrics["popular_samples"].tolist()
        assert m["rows_fetched"][7:].tolist() == (2 * ref.metrics["rows_fetched"][7:]).tolist()
