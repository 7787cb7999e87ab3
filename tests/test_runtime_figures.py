"""One figure, one definition, in every runtime: bagpipe's and sync's rows fetched and bytes
by kind, in-process (one process counts, and its emulated network charges, what each
trainer's rank would send) and over --procs (each trainer rank counts its own)."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REAL_DATA
from helpers import run_cli

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.comm.traffic import KINDS
from bagpipe_cli.engine.planning.feed import key_batches
from bagpipe_cli.engine.setup import prepare

KW = dict(batch_size=96, iterations=8, lookahead=4, optimizer="adagrad", servers=2,
          eval_rows=0, seed=5, threads=1)


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """The real Criteo log's head, preprocessed."""
    out = tmp_path_factory.mktemp("criteo") / "criteo"
    r = subprocess.run([sys.executable, "-m", "bagpipe_cli", "preprocess", "criteo",
                        str(REAL_DATA / "criteo_kaggle_train_head1999.tsv"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def _data(request, which):
    return request.getfixturevalue("tiny_dataset" if which == "tiny" else "criteo")


def _each_trainers_fetches(cfg: TrainConfig) -> list[int]:
    """Per iteration, the rows every trainer's rank fetches, from the plan: bagpipe's, the
    rows fetched for it that each reads (a row two trainers read counts twice); sync's, each
    trainer's own rows."""
    s = prepare(cfg)
    out = []
    for rp in s.spec.plan(s, 0).planner.plan(key_batches(s.ds, cfg, s.train_rows, s.offsets)):
        for p in rp.iters:
            if cfg.system == "bagpipe":
                out.append(int((p.part.src[p.part.pair_row] < 0).sum()))
            else:
                per = len(p.inverse) // cfg.trainers
                out.append(sum(len(np.unique(p.uniq[p.inverse[i * per:(i + 1) * per]]))
                               for i in range(cfg.trainers)))
    return out[:cfg.iterations]


@pytest.mark.parametrize("which", ["tiny", "criteo"])
@pytest.mark.parametrize("system", ["bagpipe", "sync"])
@pytest.mark.parametrize("trainers", [2, pytest.param(4, marks=pytest.mark.extended)])
def test_in_process_counts_each_trainers_fetches(request, which, system, trainers):
    """In-process, rows_fetched is each trainer's fetches summed (what its rank fetches), and
    rows_fetched_once the logical cache's: every row it fetched goes back once."""
    cfg = TrainConfig(data=str(_data(request, which)), system=system, trainers=trainers, **KW)
    r = train(cfg)
    assert r.metrics["rows_fetched"].tolist() == _each_trainers_fetches(cfg)
    s = r.summary
    assert s["rows_fetched_once"] == int((r.metrics["unique_rows"] - r.metrics["cache_hits"]).sum())
    assert s["rows_fetched"] > s["rows_fetched_once"]  # trainers share rows
    if system == "sync":  # each trainer pushes its own rows' gradients
        assert s["rows_written_back"] == s["rows_fetched"]
        assert s["rows_fetched_once"] == s["unique_rows"]
    else:  # the logical cache's every fetched row, written back once by its home
        assert s["rows_written_back"] + s["rows_written_back_at_end"] == s["rows_fetched_once"]
    t = s["roles"]["trainers"]
    by = t["collective_bytes_by_trainer"]
    assert len(by["sent"]) == trainers and sum(by["sent"]) == t["collective_bytes_sent"]


def _summed(summary: dict, way: str) -> dict[str, int]:
    """Every trainer rank's bytes of each kind, summed (an in-process run's trainers' role)."""
    roles = [v for k, v in summary["roles"].items() if k.startswith("trainer") and "traffic" in v]
    return {k: sum(v["traffic"][way][k] for v in roles) for k in KINDS if k != "control"}


@pytest.mark.slow
@pytest.mark.parametrize("which", ["tiny", pytest.param("criteo", marks=pytest.mark.extended)])
@pytest.mark.parametrize("system", ["bagpipe", pytest.param("sync", marks=pytest.mark.extended)])
@pytest.mark.parametrize("trainers", [2, pytest.param(4, marks=pytest.mark.extended)])
def test_the_same_figures_in_process_and_over_procs(request, tmp_path, which, system, trainers):
    """The same settings in-process and over --procs: the same rows fetched (per iteration),
    written back and fetched once, the same bytes of every kind but control (the trainers'
    sum; each server's), and each trainer's collective bytes."""
    data = _data(request, which)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in KW.items()]
    runs = {}
    for name, extra in (("in", []), ("procs", ["--procs", str(3 + trainers)])):
        r = run_cli("train", str(data), *args, "--system", system, "--trainers", str(trainers),
                    *extra, "--out", str(tmp_path / name))
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = (json.loads((tmp_path / name / "summary.json").read_text()),
                      pd.read_csv(tmp_path / name / "metrics.csv"))
    (si, mi), (sp, mp) = runs["in"], runs["procs"]
    for col in ("rows_fetched", "rows_written_back", "cache_hits"):
        assert mi[col].tolist() == mp[col].tolist(), col
    for key in ("rows_fetched", "rows_written_back", "rows_fetched_once"):
        assert si[key] == sp[key], key
    for way in ("sent", "received"):
        assert _summed(si, way) == _summed(sp, way), way
        for k in range(2):
            got = [x["roles"][f"server{k}"]["traffic"][way] for x in (si, sp)]
            assert {n: got[0][n] for n in got[0] if n != "control"} == \
                {n: got[1][n] for n in got[1] if n != "control"}, (k, way)
    by = si["roles"]["trainers"]["collective_bytes_by_trainer"]
    for i in range(trainers):
        role = sp["roles"][f"trainer{i}"]
        assert by["sent"][i] == role["collective_bytes_sent"], i
        assert by["received"][i] == role["collective_bytes_received"], i
