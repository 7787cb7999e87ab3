"""Placement: which cores the trainer's torch threads and the oracle/server roles get."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from bagpipe_cli.cli import cli
from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.launch.placement import (
    available_cores,
    default_threads,
    plan_in_process,
    plan_rank,
    reserved_cores,
)

LINUX = hasattr(os, "sched_setaffinity")


def test_in_process_keeps_cores_for_the_oracle_and_servers():
    assert [reserved_cores(n) for n in (1, 2, 9, 10, 17, 18)] == [0, 1, 1, 2, 2, 3]
    p = plan_in_process("auto", None, (0, 1))
    assert (p.compute, p.helpers, p.torch_threads) == ((0,), (1,), 1)
    p = plan_in_process("auto", None, tuple(range(16)))
    assert p.compute == tuple(range(14)) and p.helpers == (14, 15) and p.torch_threads == 14
    assert plan_in_process("auto", 3, (0, 1)).torch_threads == 3  # --threads still wins
    one = plan_in_process("auto", None, (5,))
    assert one.compute == one.helpers == (5,)
    off = plan_in_process("off", None, (0, 1))
    assert off.compute == off.helpers == (0, 1)



def test_in_process_gives_the_feed_the_cores_it_was_measured_to_need():
    cores = tuple(range(8))
    shared = plan_in_process("auto", None, cores, feed_need=0.3)  # under half a core: share
    assert shared.compute == shared.helpers == cores and shared.torch_threads == 7
    # more than the reserved core: the helpers get it, torch's threads keep the rest
    two = plan_in_process("auto", None, cores, feed_need=2.4)
    assert (two.compute, two.helpers, two.torch_threads) == (tuple(range(7)), (7,), 7)
    given = plan_in_process("auto", 4, cores, feed_need=2.4)  # --threads 4 leaves the feed 2
    assert (given.compute, given.helpers, given.torch_threads) == (tuple(range(6)), (6, 7), 4)
    most = plan_in_process("auto", None, (0, 1), feed_need=5.0)  # the trainers keep one core
    assert (most.compute, most.helpers) == ((0,), (1,))
    gpu = plan_in_process("auto", None, cores, gpu=True, feed_need=0.1)  # a GPU: all but 2
    assert gpu.compute == (0, 1) and gpu.helpers == tuple(range(2, 8))


def test_on_a_busy_machine_no_core_is_kept_apart():
    cores = tuple(range(8))
    busy = plan_in_process("auto", None, cores, feed_need=2.4, load=0.5)
    assert busy.compute == busy.helpers == cores and busy.torch_threads == 7 and busy.load == 0.5
    calm = plan_in_process("auto", None, cores, feed_need=2.4, load=0.4)
    assert calm.helpers == (7,) and calm.load == 0.4
    assert plan_in_process("auto", 3, cores, load=2.0).torch_threads == 3  # --threads still rules


@pytest.mark.parametrize("gpu", [False, True])
def test_torchs_threads_depend_on_the_cores_alone(gpu):
    """The parameters' bits depend on torch's thread count: neither the feed's measured need
    nor the machine's load may change it (two runs of one command, or bagpipe's and sync's,
    got 2 threads and 1 under load, and differed)."""
    for n in (1, 2, 3, 8, 16, 64):
        cores = tuple(range(n))
        got = {plan_in_process("auto", None, cores, gpu, need, load).torch_threads
               for need in (None, 0.0, 0.3, 0.7, 2.4, 100.0) for load in (None, 0.0, 0.4, 0.5, 3.0)}
        assert got == {default_threads(n, gpu)}, n
        assert default_threads(n, gpu) == (2 if gpu and n > 2 else max(1, n - reserved_cores(n)))


def test_ranks_share_a_machine():
    roles = ["planner", "server", "trainer", "trainer"]
    got = [plan_rank("auto", None, roles, r, tuple(range(16))) for r in range(4)]
    assert [p.compute for p in got] == [(14, 15), (14, 15), tuple(range(7)), tuple(range(7, 14))]
    assert [p.torch_threads for p in got] == [1, 1, 7, 7]
    # two cores, two trainers: a core each; the oracle and server share both
    got = [plan_rank("auto", None, roles, r, (0, 1)) for r in range(4)]
    assert [p.compute for p in got] == [(0, 1), (0, 1), (0,), (1,)]
    # more trainers than cores: they take turns
    got = [plan_rank("auto", None, ["trainer"] * 3, r, (0, 1)) for r in range(3)]
    assert [p.compute for p in got] == [(0,), (1,), (0,)]
    assert plan_rank("off", 2, roles, 2, (0, 1)).compute == (0, 1)


@pytest.mark.skipif(not LINUX, reason="pinning is Linux's sched_setaffinity")
def test_an_in_process_run_pins_and_then_unpins_the_caller(tiny_dataset, monkeypatch):
    from bagpipe_cli.engine.local import runtime

    monkeypatch.setattr(runtime, "machine_load", lambda cores: 0.0)  # as on an idle machine
    before = available_cores()
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=256, iterations=5, eval_rows=1000))
    assert available_cores() == before
    (p,) = r.config["layout"]["placement"]
    assert p["policy"] == "auto" and p["role"] == "in-process"
    assert p["pinned"] is True
    # The feed's measured need decided: on the tiny dataset a small fraction of a core, so
    # the trainers get every core and the feed shares them.
    assert 0 < p["feed_need"] < 0.5
    assert tuple(p["compute"]) == plan_in_process("auto", None, before, feed_need=p["feed_need"]).compute
    assert tuple(p["compute"]) == before == tuple(p["helpers"])
    threads = p["torch_threads"]
    assert threads == default_threads(len(before))
    # on a busy machine the feed is not measured: every thread shares every core, and torch
    # keeps its thread count (the bits depend on it)
    monkeypatch.setattr(runtime, "machine_load", lambda cores: 2.0)
    r = train(TrainConfig(data=str(tiny_dataset), batch_size=256, iterations=5, eval_rows=1000))
    (p,) = r.config["layout"]["placement"]
    assert p["feed_need"] is None and p["load"] == 2.0 and p["torch_threads"] == threads
    assert tuple(p["compute"]) == before == tuple(p["helpers"]) and available_cores() == before


@pytest.mark.slow
def test_ranks_record_their_placement(tiny_dataset, tmp_path):
    r = CliRunner().invoke(cli, ["train", str(tiny_dataset), "--trainers", "2", "--procs", "4",
                                 "--batch-size", "256", "--iterations", "6", "--eval-rows", "1000",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    layout = json.loads((tmp_path / "o" / "config.json").read_text())["layout"]
    roles = [p["role"] for p in layout["placement"]]
    assert roles == ["planner", "server", "trainer", "trainer"]
    assert [p["rank"] for p in layout["placement"]] == [0, 1, 2, 3]
    expect = [plan_rank("auto", None, roles, k, available_cores()).compute for k in range(4)]
    assert [tuple(p["compute"]) for p in layout["placement"]] == expect


def test_runs_compute_alike_whatever_the_load_they_met(tiny_dataset, monkeypatch):
    """sync on an idle machine and fae (exact) on a busy one: bitwise the same parameters.
    (The load once set torch's thread count, and the bits depend on it.)"""
    from helpers import assert_same_parameters

    from bagpipe_cli.engine.local import runtime

    kw = dict(data=str(tiny_dataset), batch_size=256, iterations=12, eval_rows=1000)
    monkeypatch.setattr(runtime, "machine_load", lambda cores: 0.0)
    monkeypatch.setattr(runtime, "feed_need", lambda s, cores: 0.1)
    idle = train(TrainConfig(system="sync", **kw))
    monkeypatch.setattr(runtime, "machine_load", lambda cores: 3.0)
    busy = train(TrainConfig(system="fae", cache_rows=2500, **kw))
    assert busy.config["layout"]["placement"][0]["load"] == 3.0
    assert_same_parameters(idle, busy)
