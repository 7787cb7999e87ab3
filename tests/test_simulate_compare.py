"""`bagpipe simulate --validate`'s labels: every setting that differs among the runs."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.registry import REFERENCE, SYSTEM_SETTINGS, SYSTEMS
from bagpipe_cli.simulate.validate import setting_labels


def settings(**kw) -> dict:
    """A run's settings as `MeasuredRun.settings` holds them."""
    return asdict(TrainConfig(data="/data/tiny", **kw))


def reader(setting: str) -> str:
    """A system that reads `setting` at the default cache size."""
    return next(n for n, s in SYSTEMS.items() if setting not in s.ignored_settings(None)
                and not s.external)


def test_two_runs_apart_only_in_their_cache_size_have_different_labels():
    system = reader("cache_rows")
    a, b = setting_labels([settings(system=system, cache_rows=1000),
                           settings(system=system, cache_rows=2000)])
    assert a != b and a.split()[-1] == "R1000" and b.split()[-1] == "R2000"


VALUES = {"lookahead": (8, 16), "round": (2, 4), "cache_rows": (1000, 2000), "staleness": (1, 2),
          "hot_sample": (0.5, 1.0), "snapshot_every": (10, 20), "drop_target": (0.1, 0.2),
          "stale_share": (0.5, 0.7)}


@pytest.mark.parametrize("setting", SYSTEM_SETTINGS)
def test_every_system_setting_read_tells_two_runs_apart(setting):
    system = reader(setting)
    labels = setting_labels([settings(system=system, **{setting: v}) for v in VALUES[setting]])
    assert len(set(labels)) == 2, labels


def test_a_label_shows_what_differs_and_only_what_the_system_reads():
    cached, plain = reader("cache_rows"), REFERENCE
    assert "cache_rows" in SYSTEMS[plain].ignored_settings(None)
    labels = setting_labels([settings(system=cached, cache_rows=1000, emb_dim=8),
                             settings(system=cached, emb_dim=32),
                             settings(system=plain, cache_rows=5, emb_dim=8)])
    # (in the order of `TrainConfig`'s fields)
    assert labels[0].endswith(" R1000 E8") and labels[1].endswith(" R=default E32")
    assert labels[2].endswith(" B1024 E8")  # sync reads no cache size: none in its label
    assert all("N1K1 B1024" in x and "opt=" not in x for x in labels)  # the same everywhere
    # the base every label has: the network, the cluster and the runtime
    net = setting_labels([settings(system=plain, net_gbps=0.5, net_latency_us=20, trainers=2,
                                   servers=3, transport="torch", procs=6)])
    assert net == ["0.5G/20us N2K3 B1024 procs"]
    data = setting_labels([settings(system=plain), {**settings(system=plain), "data": "/d/other"}])
    assert [x.split()[-1] for x in data] == ["data=tiny", "data=other"]
