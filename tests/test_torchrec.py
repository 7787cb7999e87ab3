"""TorchRec baseline: the same model, data and initial weights compute the same losses.

Skipped without TorchRec (`make torchrec` installs it), except the error a user gets then.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.external import torchrec_available

needs_torchrec = pytest.mark.skipif(not torchrec_available(),
                                    reason="torchrec not installed (optional: `make torchrec`)")

BATCH = 512


def _our_loss(model, tables, bt) -> torch.Tensor:
    """The engine's loss on one batch: rows gathered from the tables, mean BCE."""
    emb = torch.stack([tables[t][torch.from_numpy(bt.sparse[:, t])] for t in range(len(tables))], 1)
    logits = model(torch.from_numpy(bt.dense), emb)
    return F.binary_cross_entropy_with_logits(logits, torch.from_numpy(bt.labels), reduction="sum") / len(bt.labels)


@needs_torchrec
@pytest.mark.parametrize("name", ["dlrm", "deepfm"])
def test_same_loss_and_gradients_on_one_batch(tiny_dataset, name):
    from bagpipe_cli.data.format import open_dataset
    from bagpipe_cli.external.torchrec_run import (
        TorchRecModel,
        build_ebc,
        initial_tables,
        make_batch,
    )
    from bagpipe_cli.models import ModelConfig, build_model, row_dim

    ds = open_dataset(tiny_dataset)
    cards = ds.meta.cardinalities
    mcfg = ModelConfig(name, ds.meta.num_dense, len(cards), 16)
    dim = row_dim(mcfg)
    torch.manual_seed(0)
    ours = build_model(mcfg)
    tables = initial_tables(cards, dim, seed=0)
    # TorchRec's EmbeddingBagCollection holding the same tables, our dense model's weights.
    torch.manual_seed(1)  # a different init, overwritten by ours: the copy is what counts
    theirs = build_model(mcfg)
    theirs.load_state_dict(ours.state_dict())
    model = TorchRecModel(build_ebc(cards, dim, tables), theirs, len(cards), dim, 1.0 / BATCH)

    bt = ds.slice(1000, 1000 + BATCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss, (detached, logits) = model(make_batch(bt.dense, bt.sparse, bt.labels))
    ref = _our_loss(ours, tables, bt)
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-5
    assert float(detached) == float(loss.detach())
    assert logits.shape == (BATCH,)

    loss.backward()
    ref.backward()
    for (n, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), n


@needs_torchrec
def test_key_order_restores_table_order():
    from bagpipe_cli.external.torchrec_run import TorchRecModel

    m = TorchRecModel(torch.nn.Identity(), torch.nn.Identity(), 3, 2, 1.0)
    m.set_key_order(["f0", "f1", "f2"])
    assert m.order is None
    m.set_key_order(["f2", "f0", "f1"])
    assert m.order.tolist() == [1, 2, 0]
    with pytest.raises(RuntimeError, match="output keys"):
        m.set_key_order(["f0", "f1"])


@needs_torchrec
@pytest.mark.slow
def test_two_trainers_table_wise_equal_sync_training(tiny_dataset):
    """Two gloo processes, table-wise sharded, TorchRec's pipeline: losses equal the engine's
    synchronous run, and the summary has the engine's keys."""
    from bagpipe_cli.engine import TrainConfig, train
    from bagpipe_cli.external import train_torchrec

    cfg = TrainConfig(data=str(tiny_dataset), system="sync", batch_size=BATCH, iterations=4,
                      warmup=1, lr=0.05, trainers=2, eval_rows=2000)
    ours = train(cfg)
    seen = []
    res = train_torchrec(cfg, sharding="table_wise", run_timeout_s=120,
                         progress=lambda b, rec: seen.append(b))
    assert seen == [0, 1, 2, 3]
    np.testing.assert_allclose(res.metrics["loss"], ours.metrics["loss"], rtol=0, atol=1e-5)
    for k in ("iteration", "loss", "time", "data", "forward", "backward", "optimizer"):
        assert k in res.metrics.columns
    assert set(ours.summary) <= set(res.summary)
    assert res.summary["system"] == "torchrec" and res.summary["world_size"] == 2
    assert res.summary["samples_per_s"] > 0
    assert abs(res.summary["eval_auc"] - ours.summary["eval_auc"]) < 1e-3
    assert res.config["train"]["system"] == "torchrec"
    for a, b in zip(res.tables, ours.tables, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


@needs_torchrec
def test_bad_options_are_config_errors(tiny_dataset):
    from bagpipe_cli.engine import TrainConfig
    from bagpipe_cli.errors import ConfigError
    from bagpipe_cli.external import train_torchrec

    cfg = TrainConfig(data=str(tiny_dataset), system="sync", batch_size=BATCH, iterations=2)
    with pytest.raises(ConfigError, match="sharding"):
        train_torchrec(cfg, sharding="row_wise")
    with pytest.raises(ConfigError, match="divisible"):
        train_torchrec(cfg, procs=3)


def test_train_torchrec_without_torchrec_is_one_line_naming_make_torchrec(tiny_dataset, tmp_path,
                                                                          monkeypatch):
    import bagpipe_cli.external.torchrec_parts as parts

    monkeypatch.setattr(parts, "torchrec_available", lambda: False)
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--system", "torchrec",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "make torchrec" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@needs_torchrec
@pytest.mark.slow
def test_train_cli_runs_torchrec(tiny_dataset, tmp_path):
    """`bagpipe train --system torchrec` writes a run with the engine's columns and keys."""
    args = ["train", str(tiny_dataset), "--batch-size", str(BATCH), "--iterations", "4",
            "--warmup", "1", "--trainers", "2", "--eval-rows", "2000"]
    r = CliRunner().invoke(cli, [*args, "--system", "torchrec", "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, [*args, "--system", "sync", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    for name in ("summary.json", "config.json"):
        t, s = (json.loads((tmp_path / d / name).read_text()) for d in ("t", "s"))
        assert list(t) == list(s), name
    assert (tmp_path / "t" / "metrics.csv").read_text().splitlines()[0] == \
        (tmp_path / "s" / "metrics.csv").read_text().splitlines()[0]
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert s["runner"] == "torchrec" and s["world_size"] == 2 and s["samples_per_s"] > 0
