"""`--trace`: a run's timeline in the Chrome trace-event format, every role on one clock.

The trace file parses as trace-event JSON with a process per role and a thread per track,
every slice tagged with its iteration and round, and flow arrows whose ends pair up; under
an emulated network Bagpipe's prefetches overlap the trainer's compute and sync's fetches do
not (computed here from the events); a `--procs` run merges every rank's events into one
file with measured clock offsets.
"""

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from helpers import run_cli

from bagpipe_cli.engine import TrainConfig, train
from bagpipe_cli.engine.records.trace import NO_TRACE, Tracer, trace_document
from bagpipe_cli.report.timeline import Timeline, load_timeline, measured_overlap, overlap
from bagpipe_cli.results import read_trace, write_trace

KW = dict(batch_size=256, iterations=16, lookahead=4, optimizer="adagrad", eval_rows=1000, seed=1)


def _names(doc: dict) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    return procs, threads


def readme_threads(runtime: str) -> set[str]:
    """The trainer threads the README names for `runtime` ("in-process" or "over
    torch.distributed")."""
    text = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    m = re.search(r"threads (`[^;:]*?) in-process, (`[^;:]*?) over torch\.distributed", text)
    assert m, "the README's sentence on the trainers' threads"
    part = m[1] if runtime == "in-process" else m[2]
    return set(re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", part)))


def _check_document(doc: dict) -> tuple[dict[int, str], list[dict]]:
    """What every trace must satisfy; returns (role of each pid, the slices)."""
    procs, threads = _names(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert slices
    for e in slices:
        assert e["pid"] in procs and (e["pid"], e["tid"]) in threads
        assert e["dur"] >= 0 and isinstance(e["ts"], float | int)
        assert {"iteration", "round"} <= set(e["args"])
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    by_id = Counter((e["id"], e["ph"]) for e in flows)
    for (fid, ph), n in by_id.items():
        assert n == 1, f"flow {fid} has {n} '{ph}' events"
        assert by_id[(fid, "s" if ph == "f" else "f")] == 1, f"flow {fid} has one end only"
    for e in flows:
        if e["ph"] == "f":
            assert e["bp"] == "e"
    return procs, slices


def _enclosing(slices: list[dict], flow: dict) -> dict:
    """The slice a flow event binds to: on its thread, enclosing its timestamp (innermost)."""
    hits = [s for s in slices if (s["pid"], s["tid"]) == (flow["pid"], flow["tid"])
            and s["ts"] <= flow["ts"] <= s["ts"] + s["dur"]]
    assert hits, f"flow {flow['id']} at {flow['ts']} binds to no slice"
    return min(hits, key=lambda s: s["dur"])


def test_in_process_trace_is_trace_event_json_with_roles_tracks_and_flows(tiny_dataset, tmp_path):
    r = train(TrainConfig(data=str(tiny_dataset), system="bagpipe", trainers=2, servers=2,
                          trace=str(tmp_path / "t.json"), net_gbps=0.5,
                          checkpoint_every=8, checkpoint_dir=str(tmp_path / "ck"), **KW))
    path = write_trace(tmp_path / "t.json", r.trace)
    doc = json.loads(path.read_text())  # plain JSON, as Perfetto reads it
    assert read_trace(path) == doc
    procs, slices = _check_document(doc)
    assert sorted(procs.values()) == ["planner", "server 0", "server 1", "trainers 0-1"]
    _, threads = _names(doc)
    role_threads = {(procs[p], t) for (p, _), t in threads.items()}
    assert role_threads == {("planner", "planner"), ("server 0", "serving"),
                            ("server 1", "serving"), ("trainers 0-1", "main"),
                            ("trainers 0-1", "collectives")}
    assert {t for r, t in role_threads if r.startswith("trainer")} == readme_threads("in-process")
    cats = Counter((procs[e["pid"]].split()[0], e["cat"]) for e in slices)
    for role, cat in [("planner", "plan"), ("planner", "planning"),
                      ("server", "serve"), ("trainers", "data"), ("trainers", "wait"),
                      ("trainers", "request"), ("trainers", "forward"), ("trainers", "backward"),
                      ("trainers", "collective"), ("trainers", "optimizer"), ("trainers", "evict"),
                      ("trainers", "checkpoint"), ("trainers", "iteration"), ("trainers", "round")]:
        assert cats[(role, cat)], f"no {cat} slice on {role}"
    # Both trainer slices' forward passes, every iteration; collectives carry their bytes.
    fwd = [e for e in slices if e["cat"] == "forward"]
    assert Counter(e["args"]["trainer"] for e in fwd) == {0: 16, 1: 16}
    assert {e["args"]["iteration"] for e in fwd} == set(range(16))
    critical = [e for e in slices if e["name"] == "exact sum"]
    assert critical and all(e["args"]["bytes"] > 0 for e in critical)
    served = Counter(e["name"] for e in slices if e["cat"] == "serve")
    assert served["fetch"] and served["write-back"]
    # Arrows: each fetch request to the server slice serving it, and each prefetch to the
    # iterations of the next round that read its rows.
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    ends = {(e["id"], e["ph"]): e for e in flows}
    kinds = Counter(e["name"] for e in flows if e["ph"] == "s")
    assert kinds["request"] > 0 and kinds["prefetch -> read"] > 0
    for (fid, ph), e in ends.items():
        if ph != "f":
            continue
        start, into = _enclosing(slices, ends[(fid, "s")]), _enclosing(slices, e)
        if e["name"] == "request":
            assert procs[e["pid"]].startswith("server") and into["name"] == "fetch"
            assert start["name"] in ("prefetch issued", "begin round", "read rows")
        else:
            assert start["name"] == "prefetch issued" and into["name"] == "read rows"
            assert into["args"]["round"] == start["args"]["for_round"]


def _intervals(doc: dict, keep) -> list[list[float]]:
    procs, _ = _names(doc)
    out: list[list[float]] = []
    for s, e in sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                       if e["ph"] == "X" and keep(procs[e["pid"]], e)):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _hidden_share(doc: dict, warmup: int) -> tuple[float, float]:
    """(fetch ms, share of it during trainer compute) of the fetches served from --warmup on."""
    fetch = _intervals(doc, lambda role, e: role.startswith("server") and e["name"] == "fetch"
                       and e["args"]["iteration"] >= warmup)
    compute = _intervals(doc, lambda role, e: role.startswith("trainer")
                         and e["cat"] in ("forward", "backward", "optimizer"))
    total = sum(e - s for s, e in fetch)
    both = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in fetch for s2, e2 in compute)
    return total / 1e3, both / total


def test_prefetch_transfers_overlap_compute_under_an_emulated_network(tiny_dataset, tmp_path):
    kw = dict(KW, batch_size=1024, iterations=24, lookahead=8, warmup=4, net_gbps=0.1,
              bottom_mlp=(128, 64), top_mlp=(128, 64), trace="t.json")
    runs = {s: train(TrainConfig(data=str(tiny_dataset), system=s, **kw))
            for s in ("sync", "bagpipe")}
    fetch_ms, hidden = {}, {}
    for s, r in runs.items():
        fetch_ms[s], hidden[s] = _hidden_share(r.trace, 4)
    assert fetch_ms["sync"] > 2 * fetch_ms["bagpipe"] > 0
    assert hidden["bagpipe"] > 0.5, hidden  # the next round's rows move while the model computes
    assert hidden["sync"] < 0.05, hidden  # sync's trainer waits for every fetch
    # The report's overlap (every server request, measured iterations) tells the same story.
    shares = {}
    for s, r in runs.items():
        tl = load_timeline(write_trace(tmp_path / f"{s}.json", r.trace))
        shares[s] = measured_overlap(tl, 4).share
    assert shares["bagpipe"] > shares["sync"] + 0.2, shares


def test_overlap_of_hand_made_intervals():
    ev = pd.DataFrame(
        [("server 0", "serving", "fetch", "serve", 0.0, 4.0, 0, 0),
         ("server 0", "serving", "write-back", "serve", 3.0, 6.0, 0, 0),  # union T = [0, 6]
         ("trainer 0", "main", "forward", "forward", 1.0, 2.0, 0, 0),
         ("trainer 0", "main", "backward", "backward", 2.0, 5.0, 0, 0),  # C = [1, 5]
         ("trainer 0", "main", "evaluate", "eval", 5.5, 6.0, 0, 0),  # a pause: out of T
         ("trainer 0", "main", "wait rows", "wait", 0.0, 1.0, 0, 0)],
        columns=["role", "thread", "name", "cat", "start", "end", "iteration", "round"])
    tl = Timeline(ev, [("server 0", "serving"), ("trainer 0", "main")], {})
    o = overlap(tl)
    assert o.transfer_s == pytest.approx(5.5) and o.hidden_s == pytest.approx(4.0)
    assert o.share == pytest.approx(4.0 / 5.5)
    assert overlap(tl, 2.0, 3.0).share == pytest.approx(1.0)


def test_no_trace_records_nothing_and_costs_no_allocation(tiny_dataset):
    assert NO_TRACE.span("a", "b") is NO_TRACE.span("c", "d", rows=3)  # one shared object
    assert NO_TRACE.export()["events"] == []
    r = train(TrainConfig(data=str(tiny_dataset), system="bagpipe", **KW))
    assert r.trace is None
    t = Tracer()
    t.name_thread("trainer 0", "main")
    with t.span("x", "forward", rows=2):
        t.flow_out("request", 0, 1)
    doc = trace_document([t.export()], {"system": "test"})
    assert [e["ph"] for e in doc["traceEvents"] if e["ph"] != "M"] == ["X"]  # lone flow dropped


@pytest.mark.slow
def test_procs_run_merges_every_rank_on_one_clock(tiny_dataset, tmp_path):
    """--procs: rank 0 writes one trace with every rank's tracks; the offsets measured at
    start-up are small on one machine (one monotonic clock), and within half a round trip."""
    args = ["train", str(tiny_dataset), "--system", "bagpipe",
            "--batch-size", "256", "--iterations", "16", "--lookahead", "4", "--optimizer",
            "adagrad", "--trainers", "2", "--servers", "1", "--eval-rows", "1000", "--seed", "1",
            "--procs", "4", "--trace", str(tmp_path / "dist.json"), "--out", str(tmp_path / "run")]
    p = run_cli(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads((tmp_path / "dist.json").read_text())
    procs, slices = _check_document(doc)
    assert sorted(procs.values()) == ["planner", "server 0", "trainer 0", "trainer 1"]
    _, threads = _names(doc)
    for i in (0, 1):  # the threads the README names, on every trainer
        mine = {t for (p, _), t in threads.items() if procs[p] == f"trainer {i}"}
        assert mine == readme_threads("over torch.distributed") == {"main", "dense sums", "later sums"}
    offsets = doc["otherData"]["clock_offsets"]
    assert set(offsets) == {"planner", "server 0", "trainer 0", "trainer 1"}
    for who, o in offsets.items():
        assert abs(o["offset_us"]) <= o["round_trip_us"] / 2 + 200, (who, o)
    # Requests cross processes: a trainer's fetch arrow ends on the server's slice serving it.
    flows = {(e["id"], e["ph"]): e for e in doc["traceEvents"] if e["ph"] in ("s", "f")}
    crossing = [fid for (fid, ph), e in flows.items() if ph == "f" and e["name"] == "request"
                and procs[flows[(fid, "s")]["pid"]].startswith("trainer")
                and procs[e["pid"]] == "server 0"]
    assert crossing
    served = [e for e in slices if procs[e["pid"]] == "server 0" and e["cat"] == "serve"]
    assert {e["args"]["trainer"] for e in served} == {0, 1}
    assert {e["args"]["iteration"] for e in served} >= set(range(4, 16))  # from the headers
    # One clock: the trainers' critical collective of an iteration (bagpipe's partitioned
    # cache: the partials' exchange, its last) cannot end on one before it has started on
    # the other, so on an aligned clock their slices meet (within the offsets' uncertainty,
    # half a round trip).
    slack = max(o["round_trip_us"] for o in offsets.values()) / 2
    coll = {(procs[e["pid"]], e["args"]["iteration"]): e for e in sorted(slices, key=lambda e: e["ts"])
            if e["name"] == "exchange rows"}
    for b in range(16):
        a, c = coll[("trainer 0", b)], coll[("trainer 1", b)]
        assert a["ts"] + a["dur"] + slack >= c["ts"] and c["ts"] + c["dur"] + slack >= a["ts"], b


def test_bench_trace_key(tiny_dataset):
    from bagpipe_cli.bench.config import parse_bench_config
    from bagpipe_cli.bench.plan import plan_runs
    from bagpipe_cli.errors import ConfigError

    raw = {"name": "t", "datasets": [{"path": str(tiny_dataset)}], "systems": ["sync", "bagpipe"],
           "base": {"iterations": 8, "warmup": 2}}
    assert all(p.config.trace is None for p in plan_runs(parse_bench_config(raw)))
    traced = parse_bench_config({**raw, "trace": True})
    assert [p.config.trace for p in plan_runs(traced)] == ["trace.json", "trace.json"]
    assert traced.to_json()["trace"] is True
    with pytest.raises(ConfigError, match="trace must be true or false"):
        parse_bench_config({**raw, "trace": "yes"})
    with pytest.raises(ConfigError, match="at the top of the bench file"):
        parse_bench_config({**raw, "base": {"trace": "x.json"}})


def test_damaged_trace_is_refused(tmp_path):
    from bagpipe_cli.errors import DataError

    bad = tmp_path / "t.json"
    bad.write_text('{"traceEvents": [')
    with pytest.raises(DataError, match="not valid JSON"):
        read_trace(bad)
    bad.write_text('{"traceEvents": [], "otherData": {"bagpipe_trace": 99}}')
    with pytest.raises(DataError, match="version 99"):
        read_trace(bad)
    for doc in ("[]", '{"traceEvents": {}}'):
        bad.write_text(doc)
        with pytest.raises(DataError, match="not a JSON object|no traceEvents list"):
            read_trace(bad)
