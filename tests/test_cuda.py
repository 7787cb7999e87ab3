"""Trainers on a device (issue 27): --device in every runner, bitwise on a GPU, the feed.

The tests marked `cuda` skip without a CUDA device (benchmarks/check_cuda.sh runs them on
one); the others pin what holds everywhere: the device a run picks and records, a row
optimizer that rounds the same on every device, and a feed whose workers change nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import assert_same_parameters
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.planning.keys import KeySets
from bagpipe_cli.engine.registry import ENGINE_SYSTEMS, REFERENCE, spec
from bagpipe_cli.engine.trainer.device import pick
from bagpipe_cli.engine.trainer.optim import RowOptimizer, mean_square
from bagpipe_cli.errors import ConfigError

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
KW = dict(batch_size=256, iterations=24, lookahead=4, eval_rows=2000, seed=3)


def test_pick_the_device():
    assert pick("auto", 0) == "cpu" and pick("cpu", 2) == "cpu"
    assert pick("auto", 2) == "cuda:0" and pick("cuda", 2, nth=3) == "cuda:1"
    assert pick("cuda:1", 2) == "cuda:1"
    with pytest.raises(ConfigError, match="--device cuda: this machine has no CUDA device"):
        pick("cuda", 0)
    with pytest.raises(ConfigError, match="--device cuda:2: .* has 2 CUDA device"):
        pick("cuda:2", 2)


@pytest.mark.skipif(CUDA, reason="a CUDA device is present")
def test_auto_trains_on_the_cpu_here_and_records_it(tiny_dataset):
    r = train(TrainConfig(data=str(tiny_dataset), system="bagpipe", **KW))
    assert r.config["train"]["device"] == "auto"
    assert r.config["layout"]["trainer_devices"] == ["cpu"]
    assert r.config["layout"]["devices"] == [{"device": "cpu", "gpu": None}]
    assert r.summary["trainer_devices"] == ["cpu"]


@pytest.mark.skipif(CUDA, reason="a CUDA device is present")
def test_cuda_where_there_is_none_is_one_line(tiny_dataset, tmp_path):
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset), "--device",
                        "cuda", "--iterations", "2", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("Error: --device cuda: this machine has no CUDA device "
                                "(torch.cuda.is_available() is False); use --device cpu or auto")
    assert not (tmp_path / "o").exists()


def _pairwise_reference(g: np.ndarray) -> np.ndarray:
    """The mean of squares by float32 adds of neighbours, halving the columns each step."""
    s = (g * g).astype(np.float32)
    while s.shape[1] > 1:
        if s.shape[1] % 2:
            s = np.concatenate([s, np.zeros((s.shape[0], 1), np.float32)], axis=1)
        s = (s[:, 0::2] + s[:, 1::2]).astype(np.float32)
    return (s / np.float32(g.shape[1])).astype(np.float32)


@pytest.mark.parametrize("dim", [1, 2, 3, 7, 16, 33, 48])
def test_the_row_optimizer_is_elementwise_float32_arithmetic(dim):
    """Adagrad's mean of squares is pairwise float32 adds (no reduction kernel, whose order
    is its own), so the same on every device; the step is elementwise too."""
    g = torch.randn(64, dim, generator=torch.Generator().manual_seed(dim))
    assert torch.equal(mean_square(g), torch.from_numpy(_pairwise_reference(g.numpy())))
    rows, state = torch.randn(64, dim), torch.rand(64, 1)
    new_rows, new_state = RowOptimizer("adagrad", 0.05).step(rows, state, g)
    expect_state = state + mean_square(g)
    assert torch.equal(new_state, expect_state)
    assert torch.equal(new_rows, rows - 0.05 * g / (expect_state.sqrt() + 1e-8))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 999), min_size=1, max_size=400), st.booleans())
def test_unique_keys_equal_numpy_unique(keys, sparse_space):
    """Marking keys in a table of the key space gives np.unique's arrays (and so does the
    sorting path of a sparse key space)."""
    k = np.asarray(keys, dtype=np.int64)
    total = 10**9 if sparse_space else 1000
    uniq, inverse = KeySets(total).unique(k)
    u, inv = np.unique(k, return_inverse=True)
    assert uniq.dtype == np.int64 and inverse.dtype == np.int32
    np.testing.assert_array_equal(uniq, u)
    np.testing.assert_array_equal(inverse, inv.reshape(-1))


def test_loader_workers_change_nothing(tiny_dataset):
    """Batches read and indexed by several threads ahead of the oracle: the same run."""
    kw = dict(data=str(tiny_dataset), system="bagpipe", trainers=2, optimizer="adagrad", **KW)
    one = train(TrainConfig(loader_workers=1, **kw))
    three = train(TrainConfig(loader_workers=3, **kw))
    assert_same_parameters(one, three)
    assert one.metrics["rows_fetched"].tolist() == three.metrics["rows_fetched"].tolist()


# --------------------------------------------------------------------------- on a GPU


@needs_cuda
@pytest.mark.parametrize("optimizer,trainers", [("sgd", 1), ("adagrad", 2)])
def test_cuda_every_exact_system_equals_sync_bitwise(tiny_dataset, optimizer, trainers):
    """On a GPU, in-process: every exact system gives bitwise sync's parameters (sync updates
    rows on the servers' CPU, bagpipe in the GPU cache), and a repeated run its own."""
    kw = dict(data=str(tiny_dataset), device="cuda", optimizer=optimizer, trainers=trainers,
              servers=2, dense_optimizer="adam", dense_lr=0.01, **KW)
    sync = train(TrainConfig(system=REFERENCE, **kw))
    assert sync.config["layout"]["devices"][0]["gpu"]
    for system in [s for s in ENGINE_SYSTEMS if spec(s).exact and s != REFERENCE]:
        assert_same_parameters(sync, train(TrainConfig(system=system, **kw, **spec(system).exact_settings())))
    assert_same_parameters(sync, train(TrainConfig(system=REFERENCE, **kw)))


@needs_cuda
def test_cuda_row_updates_equal_the_cpu_s():
    g = torch.randn(500, 48, generator=torch.Generator().manual_seed(1))
    rows, state = torch.randn(500, 48), torch.rand(500, 1)
    for opt in (RowOptimizer("sgd", 0.1), RowOptimizer("adagrad", 0.05)):
        cpu = opt.step(rows, state, g)
        gpu = opt.step(rows.cuda(), state.cuda(), g.cuda())
        assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True))


@needs_cuda
def test_cuda_procs_bagpipe_equals_sync_bitwise(tiny_dataset, tmp_path):
    """Over --procs, trainers on the GPU (gloo, and NCCL with a GPU per trainer): bagpipe's
    parameters are sync's, bitwise; GPU phases are timed (forward, backward > 0)."""
    backends = ["gloo"] + (["nccl"] if torch.cuda.device_count() >= 2 else [])
    args = ["--batch-size", "256", "--iterations", "24", "--lookahead", "4", "--eval-rows", "2000",
            "--trainers", "2", "--optimizer", "adagrad", "--procs", "4", "--device", "cuda"]
    for backend in backends:
        for system in ("bagpipe", "sync"):
            out = tmp_path / f"{system}-{backend}"
            r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset),
                                "--system", system, "--backend", backend, *args, "--out", str(out),
                                "--save-model", f"{out}.pt"], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
        assert_same_parameters(tmp_path / f"bagpipe-{backend}.pt", tmp_path / f"sync-{backend}.pt")
        s = json.loads((tmp_path / f"bagpipe-{backend}" / "summary.json").read_text())
        assert all(d.startswith("cuda:") for d in s["trainer_devices"])
        assert s["median_time_ms"]["forward"] > 0 and s["median_time_ms"]["backward"] > 0


def test_a_bench_has_a_device_axis(tmp_path):
    from bagpipe_cli.bench import parse_bench_config, plan_runs

    cfg = parse_bench_config({"datasets": [{"name": "d", "path": str(tmp_path / "d")}],
                              "systems": ["sync", "bagpipe"], "base": {"iterations": 8, "warmup": 2},
                              "matrix": {"device": ["cpu", "cuda"]}}, "b.yaml")
    runs = plan_runs(cfg)
    assert sorted({r.config.device for r in runs}) == ["cpu", "cuda"]
    assert len(runs) == 4 and all("device=" in r.setting_label for r in runs)
