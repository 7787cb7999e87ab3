"""Real multi-process runs over torch.distributed (gloo on loopback)."""

import os
import subprocess
import sys
import time

import torch

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.distributed import Layout

ARGS = ["--batch-size", "256", "--iterations", "16", "--lookahead", "4", "--optimizer", "adagrad",
        "--trainers", "2", "--servers", "1", "--eval-rows", "2000", "--seed", "5"]


def _run(tmp_path, data, name, *extra, env=None, timeout=120):
    cmd = [sys.executable, "-m", "bagpipe_cli", "train", str(data), *ARGS, *extra,
           "--out", str(tmp_path / name), "--save-model", str(tmp_path / f"{name}.pt")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_distributed_bagpipe_equals_sync_and_inprocess(tiny_dataset, tmp_path):
    for system in ("bagpipe", "sync"):
        r = _run(tmp_path, tiny_dataset, system, "--system", system, "--procs", "4")
        assert r.returncode == 0, r.stderr[-2000:]
    inproc = train(TrainConfig(data=str(tiny_dataset), system="sync", batch_size=256, iterations=16,
                               optimizer="adagrad", trainers=2, servers=1, eval_rows=2000, seed=5))
    a = torch.load(tmp_path / "bagpipe.pt")
    b = torch.load(tmp_path / "sync.pt")
    for k in a["tables"]:
        assert torch.equal(a["tables"][k], b["tables"][k])
        assert torch.equal(a["tables"][k], inproc.tables[list(a["tables"]).index(k)])
    for k, v in a["dense"].items():
        assert torch.equal(v, b["dense"][k]) and torch.equal(v, inproc.model.state_dict()[k])
    import pandas as pd

    m = pd.read_csv(tmp_path / "bagpipe" / "metrics.csv")
    assert m["loss"].tolist() == inproc.metrics["loss"].tolist()
    import json

    s = json.loads((tmp_path / "bagpipe" / "summary.json").read_text())
    assert s["transport"] == "torch" and set(s["roles"]) == {"trainer0", "trainer1", "server0"}
    assert s["roles"]["server0"]["bytes_sent"] > 0


def test_a_killed_server_stops_the_job_with_a_clear_error(tiny_dataset, tmp_path):
    t0 = time.monotonic()
    r = _run(tmp_path, tiny_dataset, "dead", "--system", "bagpipe", "--procs", "4", "--iterations",
             "400", "--timeout", "20", env={"BAGPIPE_FAULT": "rank=1,after_s=4"})
    assert r.returncode != 0
    # every surviving rank names the dead role in one line, and the launcher reports it
    assert "lost contact with server 0 (rank 1): connection closed" in r.stderr
    assert "Error: server 0 (rank 1) exited with code -9" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 90
    assert not (tmp_path / "dead").exists()


def test_layout_and_bad_options(tiny_dataset, tmp_path):
    lay = Layout(servers=2, trainers=3)
    assert lay.world == 6 and lay.role(0) == ("oracle", 0) and lay.role(2) == ("server", 1)
    assert lay.role(3) == ("trainer", 0) and lay.trainer_rank(2) == 5
    r = _run(tmp_path, tiny_dataset, "x", "--procs", "3")
    assert r.returncode == 2 and "--procs 3" in r.stderr
    r = _run(tmp_path, tiny_dataset, "y", "--transport", "torch", "--system", "lru")
    assert r.returncode == 2 and "--transport torch supports" in r.stderr
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "train", str(tiny_dataset), "--transport",
                        "torch", "--out", str(tmp_path / "z")], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR")},
                       timeout=60)
    assert r.returncode == 2 and "torchrun" in r.stderr
