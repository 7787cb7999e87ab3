import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bagpipe_cli.data import open_dataset
from bagpipe_cli.engine.trainer import evaluation
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.launch import forkserver
from bagpipe_cli.model_names import MODEL_MODULES, MODEL_NAMES
from bagpipe_cli.models import MODELS, ModelConfig, build_model, row_dim
from bagpipe_cli.models.deepfm import fm_second_order
from bagpipe_cli.models.dlrm import pairwise_dots, tril_index

ROOT = Path(__file__).resolve().parents[1]
NAMES = sorted(MODELS)  # every registered model: a new one is in every test below


def _small(name, num_dense=3, num_tables=5, **kw):
    sizes = {"emb_dim": 4, "bottom_mlp": (8,), "top_mlp": (8, 4), "cross_layers": 2, **kw}
    return ModelConfig(name, num_dense=num_dense, num_tables=num_tables, **sizes)


def _inputs(cfg, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, cfg.num_dense, generator=g)
    emb = torch.randn(batch, cfg.num_tables, row_dim(cfg), generator=g, requires_grad=True)
    return dense, emb


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    return evaluation.auc(labels, scores)


def test_library_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 60).astype(float)  # many ties
    y = (rng.random(60) < 0.4).astype(float)
    p, n = s[y == 1], s[y == 0]
    expect = ((p[:, None] > n[None, :]).sum() + 0.5 * (p[:, None] == n[None, :]).sum()) / (
        len(p) * len(n))
    assert auc(s, y) == pytest.approx(expect)


def test_registry_and_row_dim():
    """The light scan of the modules (`--model`'s choices, no torch) finds every registered
    model in the module that registers it."""
    assert tuple(NAMES) == MODEL_NAMES
    assert all(MODELS[n].__module__ == f"bagpipe_cli.models.{MODEL_MODULES[n]}" for n in NAMES)
    assert row_dim(_small("dlrm")) == 4
    assert row_dim(_small("dcn")) == 4
    assert row_dim(_small("wdl")) == 5
    assert row_dim(_small("deepfm")) == 5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_dense", [3, 0])
def test_shape_and_gradients(name, num_dense):
    torch.manual_seed(0)
    cfg = _small(name, num_dense=num_dense)
    model = build_model(cfg)
    dense, emb = _inputs(cfg)
    out = model(dense, emb)
    assert out.shape == (16,) and out.dtype == torch.float32
    out.sum().backward()
    assert emb.grad is not None and (emb.grad.abs().sum(dim=(0, 2)) > 0).all()  # every table
    if row_dim(cfg) > cfg.emb_dim:
        assert (emb.grad[..., cfg.emb_dim] != 0).all()  # the first-order weight column
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_init(name):
    cfg = _small(name)
    torch.manual_seed(3)
    a = build_model(cfg).state_dict()
    torch.manual_seed(3)
    b = build_model(cfg).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(isinstance(m, (nn.Dropout, nn.BatchNorm1d)) for m in build_model(cfg).modules())


def test_dlrm_dot_interaction_matches_loop():
    torch.manual_seed(0)
    z = torch.randn(2, 4, 3)
    got = pairwise_dots(z, tril_index(4))
    expect = torch.stack([
        torch.stack([z[b, i] @ z[b, j] for i in range(4) for j in range(i)]) for b in range(2)
    ])
    assert got.shape == (2, 6)
    torch.testing.assert_close(got, expect)


@pytest.mark.parametrize("num_dense", [2, 0])
def test_dlrm_top_mlp_input_is_bottom_output_and_dots(num_dense):
    torch.manual_seed(0)
    cfg = _small("dlrm", num_dense=num_dense, num_tables=3)
    model = build_model(cfg)
    seen = {}
    model.top.register_forward_pre_hook(lambda m, args: seen.update(top=args[0]))
    if model.bottom is not None:
        model.bottom.register_forward_hook(lambda m, args, out: seen.update(bottom=out))
    dense, emb = _inputs(cfg, batch=2)
    model(dense, emb)
    for b in range(2):
        vecs = ([seen["bottom"][b]] if num_dense else []) + [emb[b, t] for t in range(3)]
        dots = [vecs[i] @ vecs[j] for i in range(len(vecs)) for j in range(i)]
        expect = torch.stack(([*seen["bottom"][b]] if num_dense else []) + dots)
        torch.testing.assert_close(seen["top"][b], expect)
    assert model.top[0].in_features == (4 + 6 if num_dense else 3)


def test_fm_term_matches_pairwise_sum():
    torch.manual_seed(0)
    v = torch.randn(3, 5, 4)
    expect = torch.stack([
        sum(v[b, i] @ v[b, j] for i in range(5) for j in range(i + 1, 5)) for b in range(3)
    ])
    torch.testing.assert_close(fm_second_order(v), expect)


def test_wdl_logit_is_wide_plus_deep():
    torch.manual_seed(0)
    cfg = _small("wdl")
    model = build_model(cfg)
    dense, emb = _inputs(cfg)
    with torch.no_grad():
        out = model(dense, emb)
        v, w = emb[..., :4], emb[..., 4]
        wide = w.sum(1) + dense @ model.wide_dense.weight[0]
        deep = model.deep(torch.cat([v.flatten(1), dense], 1))[:, 0]
    torch.testing.assert_close(out, wide + deep)


def test_dcn_cross_layer_formula():
    torch.manual_seed(0)
    cfg = _small("dcn", cross_layers=1)
    model = build_model(cfg)
    dense, emb = _inputs(cfg)
    with torch.no_grad():
        x0 = torch.cat([emb.flatten(1), dense], 1)
        w, b = model.cross_w[0], model.cross_b[0]
        x1 = torch.stack([x0[i] * (x0[i] @ w) + b + x0[i] for i in range(len(x0))])
        expect = model.out(torch.cat([x1, model.deep(x0)], 1))[:, 0]
        torch.testing.assert_close(model(dense, emb), expect)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_runs_on_cuda(name):
    torch.manual_seed(0)
    cfg = _small(name)
    model = build_model(cfg)
    dense, emb = _inputs(cfg)
    expect = model(dense, emb).detach()
    model.cuda()
    dense, emb = dense.cuda(), emb.detach().cuda().requires_grad_()
    out = model(dense, emb)
    out.sum().backward()
    assert emb.grad is not None
    torch.testing.assert_close(out.detach().cpu(), expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"name": "nope"}, "--model"),
        ({"emb_dim": 0}, "--emb-dim"),
        ({"bottom_mlp": (8, 0)}, "--bottom-mlp"),
        ({"top_mlp": (-1,)}, "--top-mlp"),
        ({"cross_layers": 0}, "--cross-layers"),
        ({"num_tables": 0}, "table"),
        ({"num_dense": -1}, "dense"),
        ({"num_dense": 0, "num_tables": 1}, "--model dlrm"),
    ],
)
def test_bad_config_names_the_option(kw, option):
    args = {"name": "dlrm", "num_dense": 3, "num_tables": 5, **kw}
    with pytest.raises(ConfigError, match=option):
        ModelConfig(**args)


def test_config_accepts_lists_and_stays_hashable():
    cfg = ModelConfig("dlrm", 3, 5, bottom_mlp=[8, 4], top_mlp=[4])
    assert cfg.bottom_mlp == (8, 4) and cfg.top_mlp == (4,)
    hash(cfg)


def _train_auc(name: str, ds, rows, dense, labels, learn_table: bool) -> float:
    """Train AUC of model `name` after 200 steps with a sparse embedding table, learnt or frozen."""
    torch.manual_seed(0)
    cfg = ModelConfig(name, ds.meta.num_dense, ds.meta.num_tables, emb_dim=8,
                      bottom_mlp=(16,), top_mlp=(32, 16), cross_layers=2)
    model = build_model(cfg)
    table = nn.Embedding(sum(ds.meta.cardinalities), row_dim(cfg), sparse=True)
    nn.init.normal_(table.weight, 0.0, 0.1)
    table.weight.requires_grad_(learn_table)
    opt_dense = torch.optim.Adam(model.parameters(), lr=3e-3)
    opt_emb = torch.optim.SGD(table.parameters(), lr=0.5) if learn_table else None
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        idx = torch.randint(0, ds.rows, (256,), generator=g)
        loss = loss_fn(model(dense[idx], table(rows[idx])), labels[idx])
        for opt in (opt_emb, opt_dense):
            if opt is not None:
                opt.zero_grad()
        loss.backward()
        for opt in (opt_emb, opt_dense):
            if opt is not None:
                opt.step()
    with torch.no_grad():
        scores = model(dense, table(rows)).numpy()
    return auc(scores, labels.numpy())


@pytest.mark.parametrize("name", NAMES)
def test_learns_on_synthetic_data(name, tiny_dataset):
    """Trained jointly with a sparse embedding table, each model beats chance clearly, and the
    table's learning adds to what its dense part learns over a frozen table (a bound for any
    model: at 200 steps the models here gain 0.07-0.11 AUC from it, and reach 0.67-0.72; a
    logistic regression, the docs' example, 0.087 and 0.665; untrained, 0.45-0.52)."""
    ds = open_dataset(tiny_dataset)
    ids = torch.from_numpy(ds.sparse_block(0, ds.rows))
    offsets = torch.tensor(np.cumsum([0, *ds.meta.cardinalities[:-1]]))
    rows = ids + offsets  # one table holding every feature's rows, as the engine's servers do
    dense = torch.from_numpy(np.array(ds.dense))
    labels = torch.from_numpy(np.array(ds.labels))
    joint, frozen = (_train_auc(name, ds, rows, dense, labels, learn) for learn in (True, False))
    assert joint > 0.6, f"{name}: train AUC {joint:.3f}"
    assert joint > frozen + 0.04, f"{name}: train AUC {joint:.3f}, with the table frozen {frozen:.3f}"


def test_the_docs_example_model_is_all_a_model_needs(tmp_path, tiny_dataset):
    """docs/architecture.md's "Adding a model": its module, written into a copy of the
    package, is in `train --help`'s `--model` choices and trains one iteration."""
    section = (ROOT / "docs" / "architecture.md").read_text().split("\n## Adding a model\n")[1]
    section = section.split("\n## ")[0]
    path = re.search(r"`(bagpipe_cli/models/\w+\.py)`:", section).group(1)
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    name = re.search(r'^@register\("(\w+)"\)', code, re.MULTILINE).group(1)
    assert name not in MODELS and not (ROOT / path).exists()
    shutil.copytree(ROOT / "bagpipe_cli", tmp_path / "bagpipe_cli",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / path).write_text(code)
    env = {k: v for k, v in os.environ.items() if k != forkserver.ENV}
    env["PYTHONPATH"] = str(tmp_path)

    def bagpipe(*args):
        r = subprocess.run([sys.executable, "-m", "bagpipe_cli", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout

    choices = re.search(r"--model \[([^\]]*)\]", bagpipe("train", "--help")).group(1).split("|")
    assert choices == sorted([*MODEL_NAMES, name])
    bagpipe("train", str(tiny_dataset), "--model", name, "--batch-size", "256", "--iterations", "1",
            "--eval-rows", "2000", "--out", str(tmp_path / "run"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 1
