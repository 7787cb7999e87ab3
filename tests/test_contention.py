"""A run's speed figures have one definition each, and a run says when the machine was busy.

samples/s is --batch-size over the mean iteration (summary.json's `mean_iter_ms`); the
console shows the summary's own values. The contention figures come from /proc: a run under
a load it did not make says so, and one that oversubscribes its own cores (more --procs ranks
than cores) is not called loaded.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys

import pandas as pd
import pytest
from helpers import run_cli

from bagpipe_cli.launch import contention
from bagpipe_cli.launch.contention import ContentionMeter, describe, sched_times, wait_delta

SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_console_and_summary_show_the_same_figures(tiny_dataset, tmp_path):
    out = tmp_path / "run"
    r = run_cli("train", str(tiny_dataset), "--system", "bagpipe", "--batch-size", "512",
                "--iterations", "12", "--warmup", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    it = pd.read_csv(out / "metrics.csv")["time"].to_numpy()[2:]
    assert s["mean_iter_ms"] == pytest.approx(1e3 * it.mean(), rel=1e-12)
    assert s["samples_per_s"] == pytest.approx(512 / (s["mean_iter_ms"] / 1e3), rel=1e-12)
    text = " ".join(r.stdout.split())
    assert f"{s['samples_per_s']:,.0f} (512 samples / {s['mean_iter_ms']:.1f} ms mean" in text
    assert re.search(rf"median iteration \(p10-p90\) . {s['median_iter_ms']:.1f} ms "
                     rf"\({s['p10_iter_ms']:.1f}-{s['p90_iter_ms']:.1f}\)", text), text
    c = s["contention"]
    assert c["cores"] >= 1 and c["processes"] == 1
    assert c["run_queue_wait_share"] is None or 0 <= c["run_queue_wait_share"] <= 1
    assert c["loaded"] == bool(c["note"] and c["note"].startswith("Ran on a busy machine"))


def test_other_processes_load_is_seen_and_our_own_is_not():
    """Whatever else runs on the machine: three spinning processes are three runnable tasks
    more when they are others' than when they are the run's own, and this process's own
    running thread is never counted."""
    me = os.getpid()
    busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    try:
        pids = [p.pid for p in busy]
        theirs = [contention.others_runnable([me]) - contention.others_runnable([me, *pids])
                  for _ in range(5)]
        own = [contention.others_runnable(pids) - contention.others_runnable([me, *pids])
               for _ in range(5)]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert statistics.median(theirs) >= 2, theirs
    assert statistics.median(own) >= 1, own


def test_waiting_for_a_cpu_is_measured():
    before = sched_times()
    t = sum(range(2_000_000))  # some CPU time on this thread
    run, wait = wait_delta(before, sched_times())
    assert t and run > 0 and wait >= 0


def test_the_meter_reports_a_load_it_did_not_make(monkeypatch):
    monkeypatch.setattr(contention, "others_runnable", lambda pids: 5.0)
    c = ContentionMeter(2).figures([(1_000, 3_000)])
    assert c["load_per_core"] == 2.5 and c["run_queue_wait_share"] == 0.75 and c["loaded"]
    assert c["note"].startswith("Ran on a busy machine: 5.0 other runnable processes on its 2 "
                                "cores") and "waited for a CPU 75%" in c["note"]


@pytest.mark.parametrize("figures, loaded, says", [
    (dict(load_per_core=0.0, run_queue_wait_share=0.05, steal_share=0.0), False, None),
    (dict(load_per_core=None, run_queue_wait_share=None, steal_share=None), False, None),
    (dict(load_per_core=1.0, run_queue_wait_share=0.2, steal_share=0.0), True, "2.0 other"),
    # load seen at the start only, the run's threads hardly waiting: it passed
    (dict(load_per_core=1.0, run_queue_wait_share=0.03, steal_share=0.0), False, None),
    # the run's own helper threads beside torch's wait up to about a third on an idle machine
    (dict(load_per_core=0.0, run_queue_wait_share=0.33, steal_share=0.0), False, None),
    (dict(load_per_core=0.0, run_queue_wait_share=0.0, steal_share=0.3), True, "hypervisor"),
    (dict(load_per_core=0.0, run_queue_wait_share=0.6, steal_share=0.0), True, "waited"),
    # a --procs run of more ranks than cores waits by design: said, not called loaded
    (dict(load_per_core=0.0, run_queue_wait_share=0.6, steal_share=0.0, processes=4), False,
     "Its 4 processes shared 2 cores"),
])
def test_loaded_is_decided_by_the_thresholds(figures, loaded, says):
    c = describe({"cores": 2, "processes": 1, **figures})
    assert c["loaded"] is loaded
    assert (c["note"] is None) == (says is None) and (says is None or says in c["note"])


def test_a_cgroup_quota_caps_the_cores(monkeypatch):
    monkeypatch.setattr(contention, "cgroup_quota", lambda: 1.5)
    assert contention.usable_core_count(8) == 2
    monkeypatch.setattr(contention, "cgroup_quota", lambda: 0.2)
    assert contention.usable_core_count(8) == 1
    monkeypatch.setattr(contention, "cgroup_quota", lambda: None)
    assert contention.usable_core_count(8) == 8
