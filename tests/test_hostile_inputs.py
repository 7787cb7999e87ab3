"""Hostile inputs (issue 52): a matrix too large to enumerate, the run limit's repeats and
estimate, forged checkpoints and kept bench runs, and resume across runtime settings."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest
from helpers import assert_same_parameters, run_cli

from bagpipe_cli.bench import plan
from bagpipe_cli.bench import runner as bench_runner
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.records.checkpoint import CheckpointError, find_checkpoint
from bagpipe_cli.errors import ConfigError


def _one_error_line(r, *needles: str, after_progress: bool = False) -> str:
    """Exit 2 and one `Error:` line holding every needle (after a bench's progress lines)."""
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 2, out
    assert "Traceback" not in out and (after_progress or len(out.splitlines()) == 1), out
    out = out.splitlines()[-1]
    assert out.startswith("Error: "), out
    for n in needles:
        assert n in out, out
    return out


def _bench_file(tmp_path: Path, data: Path, matrix: str, repeat: int = 1) -> Path:
    f = tmp_path / "hostile.yaml"
    f.write_text(f"name: hostile\ndatasets: [{{name: t, path: {data}}}]\nsystems: [sync]\n"
                 f"profile: false\nrepeat: {repeat}\n"
                 "base: {batch_size: 256, iterations: 6, warmup: 2, eval_rows: 1000}\n"
                 f"matrix:\n{matrix}")
    return f


def test_a_matrix_of_many_label_axes_is_refused_before_it_is_enumerated(tmp_path, tiny_dataset):
    """40 axes of 10 choices, 39 of them labels that set nothing: counted, never walked."""
    labels = "".join(f"  a{i}: [{', '.join(f'{{label: l{j}}}' for j in range(10))}]\n"
                     for i in range(39))
    f = _bench_file(tmp_path, tiny_dataset, f"  seed: {list(range(10))}\n{labels}")
    t = time.perf_counter()
    r = run_cli("bench", str(f), "--out", str(tmp_path / "b"))
    _one_error_line(r, "the matrix's 40 axes (10 x 10 x 10 x ... x 10 x 10) cross into 1.0e40 "
                       "combinations to plan", "more than 100,000")
    assert time.perf_counter() - t < 10, "enumerated before refusing"
    assert not (tmp_path / "b").exists()


def test_the_run_limit_counts_the_repeats_asked_for(tmp_path, tiny_dataset, monkeypatch):
    """--repeat 1 over a file that says 2 is counted at 1; the estimate is the count's."""
    monkeypatch.setattr(plan, "MAX_RUNS", 100)
    f = _bench_file(tmp_path, tiny_dataset, "  seed: [0, 1, 2, 3, 4, 5]\n"
                    f"  lr: {[0.1 * (i + 1) for i in range(10)]}\n", repeat=2)
    r = run_cli("bench", str(f), "--out", str(tmp_path / "b"))
    _one_error_line(r, "60 runs x 2 repeats = 120 runs, more than 100 (2 minutes at 1 s a run)")

    def sized(*a):
        raise ConfigError("sized and planned")

    monkeypatch.setattr(bench_runner, "_datasets", sized)
    _one_error_line(run_cli("bench", str(f), "--out", str(tmp_path / "b"), "--repeat", "1"),
                    "sized and planned")
    assert [plan.duration(s) for s in (90, 3000, 200_000 / 2, 10**6)] == [
        "90 seconds", "50 minutes", "28 hours", "12 days"]


# ----------------------------------------------------------- forged checkpoints


def _resum(d: Path) -> None:
    """checksums.json recomputed, as an attacker can."""
    c = json.loads((d / "checksums.json").read_text())
    for n in c["sha256"]:
        c["sha256"][n] = hashlib.sha256((d / n).read_bytes()).hexdigest()
    (d / "checksums.json").write_text(json.dumps(c))


@pytest.mark.parametrize("dense_optimizer, forge, needle", [
    ("adam", "state", "metrics.json: state.json says iteration 4, but metrics stream 0 holds 6 "
                      "records (iterations 0 to 5)"),
    ("adam", "metrics", "metrics.json: state.json says iteration 6, but metrics stream 0 holds 3"),
    ("adam", "both", "dense.pt: state.json says iteration 4, but the dense optimizer's state has "
                     "taken 6 steps"),
    ("sgd", "both", "dense.pt: state.json says iteration 4, but dense.pt was written at iteration 6"),
])
def test_a_forged_checkpoint_is_refused(tiny_dataset, tmp_path, dense_optimizer, forge, needle):
    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=8, lookahead=4, eval_rows=1000,
              dense_optimizer=dense_optimizer)
    train(TrainConfig(**kw, checkpoint_every=6, checkpoint_dir=str(tmp_path / "ck")))
    d = tmp_path / "ck" / "ckpt-00000006"
    state, metrics = (json.loads((d / n).read_text()) for n in ("state.json", "metrics.json"))
    if forge in ("state", "both"):
        (d / "state.json").write_text(json.dumps({**state, "iteration": 4}))
    if forge != "state":
        (d / "metrics.json").write_text(json.dumps([m[:4 if forge == "both" else 3] for m in metrics]))
    _resum(d)
    with pytest.raises(CheckpointError, match="cannot be resumed") as e:
        find_checkpoint(tmp_path / "ck")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_kept_bench_run_is_the_plans(tmp_path, tiny_dataset, monkeypatch):
    """A kept run's config.json that is a link, or another run's, stops --resume."""
    f = _bench_file(tmp_path, tiny_dataset, "  lr: [0.1, 0.2]\n")
    out = tmp_path / "b"
    assert run_cli("bench", str(f), "--out", str(out)).returncode == 0
    a, b = sorted((out / "runs").iterdir())
    monkeypatch.setattr(bench_runner, "run", lambda *x, **k: pytest.fail("ran a kept run"))
    (b / "config.json").unlink()
    (b / "config.json").symlink_to(a / "config.json")
    _one_error_line(run_cli("bench", "--resume", "--out", str(out)),
                    f"{b / 'config.json'} is a symbolic link", after_progress=True)
    (b / "config.json").unlink()
    shutil.copy(a / "config.json", b / "config.json")
    _one_error_line(run_cli("bench", "--resume", "--out", str(out)),
                    f"is the config of run {a.name}, not of {b.name}", after_progress=True)
    (b / "config.json").write_text((b / "config.json").read_text().replace(a.name, b.name))
    _one_error_line(run_cli("bench", "--resume", "--out", str(out)),
                    f"lr is 0.1, but the bench plans {b.name} with 0.2", after_progress=True)


# ------------------------------------------------- resume across runtime settings

KW = dict(batch_size=256, lookahead=4, trainers=2, servers=2, optimizer="adagrad",
          dense_optimizer="adam", dense_lr=0.01, eval_rows=1000, seed=3)


def test_resume_names_the_setting_that_changes_the_bits(tiny_dataset, tmp_path):
    kw = dict(data=str(tiny_dataset), iterations=8, **KW)
    train(TrainConfig(**kw, threads=1, checkpoint_every=4, checkpoint_dir=str(tmp_path / "a")))
    with pytest.raises(CheckpointError, match="made with --threads 1, this run has --threads 2; "
                                              ".*torch threads.*bits") as e:
        train(TrainConfig(**kw, threads=2, resume=str(tmp_path / "a")))
    assert "\n" not in str(e.value)
    train(TrainConfig(**kw, checkpoint_every=4, checkpoint_dir=str(tmp_path / "b")))
    with pytest.raises(CheckpointError, match="made with --placement auto, this run has "
                                              "--placement off; with --threads unset"):
        train(TrainConfig(**kw, placement="off", resume=str(tmp_path / "b")))
    # The same --threads: another --placement resumes, bitwise the run never stopped.
    straight = train(TrainConfig(**kw, threads=1))
    resumed = train(TrainConfig(**kw, threads=1, placement="off", resume=str(tmp_path / "a")))
    assert_same_parameters(straight, resumed)
    assert resumed.metrics["loss"].tolist() == straight.metrics["loss"].tolist()


@pytest.mark.extended
def test_resume_across_procs_at_the_same_threads(tiny_dataset, tmp_path):
    """In-process -> --procs -> in-process at --threads 1: bitwise the run never stopped."""
    kw = dict(data=str(tiny_dataset), iterations=12, threads=1, **KW)
    straight = train(TrainConfig(**kw))
    train(TrainConfig(**{**kw, "iterations": 4}, checkpoint_every=3,
                      checkpoint_dir=str(tmp_path / "a")))
    argv = ["train", str(tiny_dataset), "--system", "bagpipe", "--iterations", "8", "--threads", "1",
            *[x for k, v in KW.items() for x in (f"--{k.replace('_', '-')}", str(v))],
            "--procs", "5", "--checkpoint-every", "3", "--checkpoint-dir", str(tmp_path / "b"),
            "--resume", str(tmp_path / "a"), "--out", str(tmp_path / "o")]
    r = run_cli(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    ck = find_checkpoint(tmp_path / "b")
    assert ck.iteration == 6 and len(ck.metrics) == 2
    resumed = train(TrainConfig(**kw, resume=str(tmp_path / "b")))
    assert_same_parameters(straight, resumed)
    assert resumed.metrics["loss"].tolist() == straight.metrics["loss"].tolist()
    # --procs's two streams merged back into one, as its metrics.csv has them.
    assert resumed.metrics["iteration"].tolist() == list(range(12))
    assert resumed.metrics["time"][3:6].tolist() == [max(a["time"], b["time"])
                                                     for a, b in zip(*ck.metrics, strict=True)][3:6]
