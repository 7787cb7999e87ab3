"""A trainer whose share of a batch, or of one of its phases, is empty, all hot, all cold or
all skipped (hotline's popular samples and the rest, slipstream's skipped samples), in both
runtimes: the passes run over no samples, a trainer rank joins the dense sums with an empty
backward, and an iteration that computed no sample records no loss (NaN), not 0."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import ROUNDING_TOLERANCE, assert_same_parameters, max_difference, run_cli

from bagpipe_cli.data import DatasetWriter, TableSpec
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.setup import prepare
from bagpipe_cli.engine.trainer.passes import sample_partial
from bagpipe_cli.engine.trainer.staging import IterInputs, PhaseClock
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.models import build_model

B, ITERS = 80, 8
# --cache-rows 3: the hot set is the three rows the first half of every batch reads.
KW = dict(batch_size=B, iterations=ITERS, servers=1, seed=1, optimizer="adagrad",
          dense_optimizer="adam", dense_lr=0.01, eval_rows=0, cache_rows=3)
SLIP = dict(drop_target=0.9, snapshot_every=2)  # the first threshold is set at iteration 4


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    """Batches of B samples over tables a and b. The first half of a batch reads row 0 of a
    and row r % 2 of b (the hot rows); the second half a row of a of its own, once (cold),
    and b's. So with N trainers the first N/2 have only hot rows (hotline: all popular, their
    rest phase empty) and the others only samples that wait for the fetch (their popular
    phase empty). Slipstream at --stale-share 1 skips every sample of the first half (their
    rows' drifts tie) and none of the second (a's cold rows have no drift); at 0.5 it skips
    every sample from the first threshold on: whole iterations computed nothing."""
    n = B * ITERS
    r = np.arange(n)
    a = np.where(r % B < B // 2, 0, 1 + r)
    path = tmp_path_factory.mktemp("shares") / "data"
    with atomic_dir(path) as tmp:
        w = DatasetWriter(tmp, [TableSpec("a", int(a.max()) + 1), TableSpec("b", 2)], ["x"], "y")
        w.write(np.linspace(0, 1, n, dtype=np.float32)[:, None], np.stack([a, r % 2], axis=1),
                (r % 3 == 0).astype(np.float32))
        w.finish(name="shares", source={"kind": "test"})
    return path


def test_a_phase_with_no_samples_adds_nothing(shares):
    s = prepare(TrainConfig(data=str(shares), system="hotline", **KW))
    torch.manual_seed(0)
    model = build_model(s.mcfg)
    inp = IterInputs(None, torch.rand(4, 1), torch.tensor([1.0, 0.0, 1.0, 0.0]), np.arange(5),
                     torch.tensor([0, 3, 1, 4, 2, 3, 0, 4]))
    values = torch.randn(8, s.row_dim)

    def passes(*phases):
        for p in model.parameters():
            p.grad = None
        total, partial = torch.zeros(()), None
        for samples in phases:
            loss, partial = sample_partial(model, inp, values, samples, B, PhaseClock(torch.device("cpu")),
                                           {"forward": 0.0, "backward": 0.0}, 0, partial)
            total = total + loss
        return total, partial, [p.grad.clone() for p in model.parameters()]

    loss, partial, grads = passes(np.array([], dtype=np.int64))
    assert loss.item() == 0 and partial.shape == (5, s.row_dim) and not partial.any()
    assert all(g is not None and not g.any() for g in grads)  # zeros, as DDP's sum needs
    one, two = passes(np.array([0, 2])), passes(np.array([0, 2]), np.array([]))  # any dtype
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert all(torch.equal(x, y) for x, y in zip(one[2], two[2], strict=True))


def test_empty_shares_in_process(shares):
    hot = train(TrainConfig(data=str(shares), system="hotline", trainers=2, **KW))
    assert hot.metrics["popular_samples"].tolist() == [0] + [B // 2] * (ITERS - 1)
    assert np.isfinite(hot.metrics["loss"]).all()
    # One trainer's samples all skipped, the other's all computed.
    part = train(TrainConfig(data=str(shares), system="slipstream", trainers=2, stale_share=1.0,
                             **SLIP, **KW))
    assert part.metrics["samples_skipped"].tolist() == [0] * 4 + [B // 2] * (ITERS - 4)
    assert np.isfinite(part.metrics["loss"]).all()
    # Every sample skipped from iteration 4: no loss (NaN, not 0), and the run goes on.
    none = train(TrainConfig(data=str(shares), system="slipstream", trainers=2, stale_share=0.5,
                             **SLIP, **KW))
    m = none.metrics
    assert m["samples_skipped"].tolist() == [0] * 4 + [B] * (ITERS - 4)
    assert np.isfinite(m["loss"][:4]).all() and m["loss"][4:].isna().all()
    assert math.isnan(none.summary["final_loss"])
    assert all(torch.isfinite(t).all() for t in [*none.tables, *none.model.state_dict().values()])


def _compare(tmp_path, shares, system: str, trainers: int, extra: dict):
    """`--procs` at --threads 1 against in-process at threads=1: the same bits, and the same
    loss (NaN included), split and skip columns."""
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in {**KW, **extra}.items()]
    r = run_cli("train", str(shares), "--system", system, "--trainers", str(trainers), *opts,
                "--threads", "1", "--procs", str(trainers + 2), "--out", str(tmp_path / "run"),
                "--save-model", str(tmp_path / "run.pt"))
    assert r.returncode == 0, r.stderr[-2000:] + r.stdout[-2000:]
    inproc = train(TrainConfig(data=str(shares), system=system, trainers=trainers, threads=1,
                               **extra, **KW))
    assert_same_parameters(tmp_path / "run.pt", inproc)
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    for col in ("loss", "popular_samples", "samples_skipped"):
        assert m[col].fillna(-1).tolist() == inproc.metrics[col].fillna(-1).tolist(), col
    return inproc


@pytest.mark.slow
@pytest.mark.parametrize("trainers", [2, *(pytest.param(n, marks=pytest.mark.extended) for n in (4, 8))])
def test_hotline_with_all_hot_and_all_cold_shares_over_procs_equals_in_process(shares, tmp_path,
                                                                               trainers):
    """Half the trainers' rest phase is empty (the crash of a trainer rank's empty last
    phase), the other half's popular phase; bitwise at equal torch threads per trainer."""
    inproc = _compare(tmp_path, shares, "hotline", trainers, {})
    assert inproc.metrics["popular_samples"].tolist() == [0] + [B // 2] * (ITERS - 1)
    if trainers == 2:  # other threads: within rounding (the BLAS's few-row products)
        other = train(TrainConfig(data=str(shares), system="hotline", trainers=2, threads=2, **KW))
        assert max_difference(other, inproc) < ROUNDING_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("trainers,stale_share,skipped", [
    (2, 1.0, B // 2), pytest.param(4, 1.0, B // 2, marks=pytest.mark.extended), (2, 0.5, B)])
def test_slipstream_with_all_skipped_shares_over_procs_equals_in_process(shares, tmp_path, trainers,
                                                                         stale_share, skipped):
    """Some trainers skip all their samples while the others compute all of theirs, or every
    trainer skips all (no loss: NaN; the dense optimizer steps on zero gradients alike)."""
    inproc = _compare(tmp_path, shares, "slipstream", trainers, {**SLIP, "stale_share": stale_share})
    assert inproc.metrics["samples_skipped"].tolist() == [0] * 4 + [skipped] * (ITERS - 4)
