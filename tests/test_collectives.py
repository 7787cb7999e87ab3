"""The trainers' sums (issue 23): the exact sum at a ring's bytes is bitwise the in-process
sum, as the all-gather is; the library's all-reduce is within float rounding; every byte is
counted. These start real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import assert_same_parameters, communicate_all, run_cli

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.launch.processes import free_port

pytestmark = pytest.mark.slow

PROBE = """
import os, sys, torch, torch.distributed as dist
from bagpipe_cli.engine.comm.collective import ordered_sum, traffic
from bagpipe_cli.engine.distributed.collective import DistributedCollective
from bagpipe_cli.engine.distributed.layout import Layout
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=n)
lay, cpu = Layout(servers=0, trainers=n), torch.device("cpu")
def part(i, length):  # trainer i's vector, known to every rank
    return torch.randn(length, generator=torch.Generator().manual_seed(100 * i + length)) * 1e3
for kind in ("exact", "allgather", "allreduce"):
    groups = [dist.new_group(list(range(n))) for _ in range(3)]
    c = DistributedCollective(groups[0], tuple(groups[1:]), lay, rank, cpu, cpu, kind)
    sent = 0
    for length in (0, 1, n + 1, 7 * n - 1, 1001):  # empty (no sync_now rows), not divisible by n
        expect = ordered_sum([part(i, length) for i in range(n)])
        mine = part(rank, length)
        losses = c.allreduce_([mine], [torch.tensor(float(rank) + 0.25)])
        got = [mine]
        if length:  # the loop starts a background sum only of some rows
            got.append(c.start_sum(part(rank, length).view(-1, 1)).result().reshape(-1))
        for g in got:
            if kind == "allreduce":
                assert torch.allclose(g, expect, rtol=1e-6, atol=1e-3), (length, g - expect)
            else:
                assert torch.equal(g, expect), (kind, length, (g - expect).abs().max())
        assert losses == [i + 0.25 for i in range(n)], losses
        sent += traffic(kind, length + n, 4, n) + traffic(kind, length, 4, n)
    assert c.bytes_sent == c.bytes_received == sent, (kind, c.bytes_sent, sent)
    c.close()
dist.destroy_process_group()
print("ok")
"""


# 3 trainers (an odd count) in make test: test_three_trainers_train_alike_with_every_collective
@pytest.mark.parametrize("n", [2, *(pytest.param(n, marks=pytest.mark.extended) for n in (3, 4))])
def test_every_collective_sums_like_the_in_process_engine(n):
    """For 2, 3 and 4 trainers and vectors of lengths not divisible by N (empty too): the exact
    sum and the all-gather give bitwise `ordered_sum`, on the critical path and in the
    background; the all-reduce is within float rounding; the losses come back exactly; the
    bytes counted are the algorithm's."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(n),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(n)]
    outs = communicate_all(procs, 90)
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]


# 5 s: in make test-all; the two-trainer sums of every collective stay in make test.
@pytest.mark.extended
def test_three_trainers_train_alike_with_every_collective(tiny_dataset, tmp_path):
    """3 trainer processes: the exact sum gives bitwise the in-process engine's parameters
    (the all-gather's bitwise sums are checked above); the all-reduce gives them within float
    tolerance (the rows of the partitioned cache move by need, whatever the kind: exact)."""
    kw = dict(system="bagpipe", batch_size=240, iterations=12, lookahead=4, trainers=3,
              optimizer="adagrad", eval_rows=2000, seed=2)
    inproc = train(TrainConfig(data=str(tiny_dataset), **kw))
    for kind in ("exact", "allreduce"):
        out = tmp_path / kind
        args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
        r = run_cli("train", str(tiny_dataset), *args, "--collective", kind, "--procs", "5",
                    "--out", str(out), "--save-model", f"{out}.pt")
        assert r.returncode == 0, r.stderr[-2000:]
        if kind == "allreduce":
            got = torch.load(f"{out}.pt")
            for t, name in enumerate(got["tables"]):
                torch.testing.assert_close(got["tables"][name], inproc.tables[t], rtol=1e-4, atol=1e-6)
        else:
            assert_same_parameters(f"{out}.pt", inproc)
        s = json.loads((out / "summary.json").read_text())
        roles = [s["roles"][f"trainer{i}"] for i in range(3)]
        for role in roles:
            assert role["collective_bytes_sent"] > 0 and role["collective_exposed_s"] >= 0
        # Sums move alike each way; the partitioned cache's rows by need: what one trainer
        # sends, another receives.
        assert (sum(r["collective_bytes_sent"] for r in roles)
                == sum(r["collective_bytes_received"] for r in roles))
