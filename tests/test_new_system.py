"""A system registered inside a test, and nowhere else, is everywhere a system should be.

`FifoDecisions` below is a fixed-capacity cache's planner policy of its own (first in,
first out), and `SPEC` its registry entry: all a new system of that kind is. A subprocess
registers it before anything reads the registry (as the registry's own table would), then
asks every place that lists systems, and trains it: it must give sync's parameters bitwise
and fetch the rows `simulate`'s traffic model of it counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import numpy as np

from bagpipe_cli.policies.decisions import BatchDecision
from bagpipe_cli.policies.simulators import check_capacity

HERE = Path(__file__).resolve().parent
NAME = "fifotrial"
PER_ROW = 5  # the planner's bytes per embedding row it declares (below: a bool a row, and slack)


class FifoDecisions:
    """Evict the row resident longest (never one of U_b): a policy no table of the package has."""

    def __init__(self, trace, capacity: int, hot_sample: float = 1.0):
        check_capacity(capacity, trace.max_batch_rows)
        self.trace, self.slots = trace, int(capacity)
        self.resident = np.zeros(trace.num_rows, bool)
        self.queue: deque[int] = deque()

    def step(self, b: int, uniq: np.ndarray) -> BatchDecision:
        u = self.trace.batch(b)
        fetch = u[~self.resident[u]].astype(np.int64)
        need = len(self.queue) + len(fetch) - self.slots
        in_batch = set(u.tolist()) if need > 0 else set()
        victims, kept = [], deque()
        while need > 0:
            k = self.queue.popleft()
            if k in in_batch:
                kept.append(k)
            else:
                victims.append(k)
                need -= 1
        self.queue.extendleft(reversed(kept))
        before = np.array(victims, np.int64)
        self.resident[before] = False
        self.resident[fetch] = True
        self.queue.extend(fetch.tolist())
        return BatchDecision(before, fetch, np.zeros(0, np.int64))


SCRIPT = r"""
import json, sys
from dataclasses import replace
from bagpipe_cli.engine import registry
from bagpipe_cli.engine.registry import Lazy
registry.register(replace(registry.SYSTEMS["lru"], name=%(name)r, summary="first in, first out",
                          policy=None, color="#123456", planner_bytes_per_row=%(per_row)d,
                          decisions=Lazy("test_new_system:FifoDecisions")))
from click.testing import CliRunner
from bagpipe_cli.cli import cli
from bagpipe_cli.bench.config import parse_bench_config
from bagpipe_cli.engine import TrainConfig, memory, train
from bagpipe_cli.engine.setup import estimate
from bagpipe_cli.simulate.cluster import SimulateConfig
from helpers import parameters

data = sys.argv[1]
out = {}
help = CliRunner().invoke(cli, ["train", "--help"], terminal_width=400).output
out["train_help"] = help
out["systems"] = json.loads(CliRunner().invoke(cli, ["systems", "--format", "json"]).output)
bench = parse_bench_config({"name": "b", "datasets": [{"name": "d", "path": data}],
                            "systems": "all"})
out["bench_all"] = list(bench.systems)
out["simulate_default"] = list(SimulateConfig(data=data, compute_ms=1.0).systems)
out["planner_fix"] = memory.FIXES["planner"]
kw = dict(data=data, batch_size=256, iterations=20, eval_rows=2000, trainers=2)
mem = {s: estimate(TrainConfig(system=s, **kw)) for s in ("lru", %(name)r)}
out["planner_bytes"] = mem[%(name)r][1].here[0].held["planner"] - mem["lru"][1].here[0].held["planner"]
out["total_rows"] = mem["lru"][0].total_rows
sync, mine = (train(TrainConfig(system=s, **kw)) for s in ("sync", %(name)r))
a, b = parameters(sync), parameters(mine)
out["same_tables"] = all(x.equal(y) for x, y in zip(a[0], b[0]))
out["same_dense"] = all(a[1][k].equal(b[1][k]) for k in a[1])
out["fetched"] = int(mine.summary["rows_fetched"])
out["sync_fetched"] = int(sync.summary["rows_fetched"])
sim = CliRunner().invoke(cli, ["simulate", data, "--systems", %(name)r + ",sync", "--compute-ms",
                               "1", "--batch-size", "256", "--iterations", "20",
                               "--eval-rows", "2000", "--trainers", "2"], terminal_width=400)
out["simulate"] = sim.output
# profile simulates its policy (its decisions replayed): the rows the engine fetches
import csv, tempfile
prof = tempfile.mkdtemp() + "/p"
p = CliRunner().invoke(cli, ["profile", data, "--batch-size", "256", "--lookahead", "4",
                             "--cache-rows", "3000", "--policies", %(name)r + ",none",
                             "--out", prof], terminal_width=400)
out["profile_exit"], out["profile_output"] = p.exit_code, p.output
if p.exit_code == 0:
    with open(prof + "/per_batch.csv") as f:
        out["profiled"] = [int(r[%(name)r + "_R3000"]) for r in csv.DictReader(f)]
    one = train(TrainConfig(system=%(name)r, cache_rows=3000, **{**kw, "trainers": 1}))
    out["engine_per_iteration"] = [int(x) for x in one.metrics["rows_fetched"]]
out["profile_default"] = CliRunner().invoke(cli, ["profile", "--help"], terminal_width=400).output
print(json.dumps(out))
"""


def test_a_system_registered_in_a_test_is_in_every_list_and_trains_exactly(tiny_dataset):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent),
                                                        os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", SCRIPT % {"name": NAME, "per_row": PER_ROW},
                        str(tiny_dataset)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    help_text = " ".join(out["train_help"].split())
    assert NAME in help_text.split("--system [", 1)[1].split("]", 1)[0]  # a choice
    assert f"{NAME}: first in, first out" in help_text  # --system's help
    assert "Cache rows of" in help_text and f"{NAME}" in help_text.split("Cache rows of", 1)[1][:200]
    facts = {f["name"]: f for f in out["systems"]}
    assert facts[NAME]["simulated"] == "policy" and facts[NAME]["fidelity"] == "yes"
    assert facts[NAME]["profiled"] == NAME  # profile simulates its own policy
    assert out["profile_exit"] == 0, out["profile_output"]
    assert NAME in out["profile_default"].split("--policies", 1)[1].split("--dim", 1)[0]
    engine = out["engine_per_iteration"]  # the first batches: the policy looks at no later one
    assert engine == out["profiled"][:len(engine)] and sum(engine) > 0
    assert NAME in out["bench_all"] and NAME in out["simulate_default"]
    assert NAME in out["planner_fix"]  # the memory refusal's advice
    assert out["planner_bytes"] == PER_ROW * out["total_rows"]  # its declared per-row state
    assert out["same_tables"] and out["same_dense"]  # exact, as its entry says
    assert 0 < out["fetched"] < out["sync_fetched"]
    row = next(ln for ln in out["simulate"].splitlines() if ln.strip().startswith(NAME)
               or f" {NAME} " in ln)
    assert NAME in row, out["simulate"][-2000:]
