"""A run's trace as the report reads it: its tracks, a window of steady-state iterations, and
the overlap of transfers with compute (pure functions of the trace file, no plotting).

**Overlap.** Over a window of the trace, with
- T, the union of the intervals in which some server serves a trainer's request: a fetch, a
  write-back or a gradient push (the server tracks' `serve` slices, the emulated link's hold
  included), and
- C, the union of the intervals in which some trainer computes: its forward, backward and
  optimizer slices (on a GPU, the GPU's),

overlap = |T ∩ C| / |T|: the share of transfer time hidden behind compute. 1: every transfer
happened while a trainer computed; 0: the trainers computed nothing during any transfer (they
waited). The window of a run is its measured iterations: from the start of its first round
that begins at or after iteration --warmup to the end of its last iteration. Training pauses
for checkpoints and --eval-every's evaluations: transfers during them are left out of T.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bagpipe_cli.results import read_trace

TRANSFER_CATS = ("serve",)  # slices of T
COMPUTE_CATS = ("forward", "backward", "optimizer")  # slices of C (trainer tracks)
CONTAINER_CATS = ("round", "iteration", "begin")  # slices that only group others
PAUSE_CATS = ("eval", "checkpoint")  # training stops for these (trainer tracks)


@dataclass
class Timeline:
    """A trace's slices (`events`: role, thread, name, cat, start, end in seconds from the
    trace's origin, iteration, round) and its tracks in the trace's order."""

    events: pd.DataFrame
    tracks: list[tuple[str, str]]
    meta: dict


def load_timeline(path: Path) -> Timeline:
    """The slices ("X" events) of the trace at `path` (checked by `results.read_trace`)."""
    doc = read_trace(path)
    names: dict[tuple[str, int], str] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e["name"], e["pid"] if e["name"] == "process_name" else e["tid"])] = \
                e["args"]["name"]
    rows = [(names.get(("process_name", e["pid"]), str(e["pid"])),
             names.get(("thread_name", e["tid"]), str(e["tid"])), e["name"], e.get("cat", ""),
             e["ts"] / 1e6, (e["ts"] + e.get("dur", 0.0)) / 1e6,
             e.get("args", {}).get("iteration", -1), e.get("args", {}).get("round", -1))
            for e in doc["traceEvents"] if e.get("ph") == "X"]
    events = pd.DataFrame(rows, columns=["role", "thread", "name", "cat", "start", "end",
                                         "iteration", "round"])
    order = {(r, t): i for i, (r, t) in enumerate(dict.fromkeys(
        (names.get(("process_name", e["pid"]), ""), names.get(("thread_name", e["tid"]), ""))
        for e in sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"),
                        key=lambda e: (e["pid"], e["tid"]))))}
    tracks = sorted(order, key=order.get)
    return Timeline(events, tracks, doc.get("otherData") or {})


def _trainer(events: pd.DataFrame) -> pd.Series:
    return events["role"].str.startswith("trainer")


def round_starts(tl: Timeline) -> list[int]:
    """The first iteration of every round the trainers ran, in order."""
    ev = tl.events
    rounds = ev[_trainer(ev) & (ev["cat"] == "round") & (ev["name"] == "round")]
    return sorted(set(rounds["iteration"].astype(int)) - {-1})


def window(tl: Timeline, first: int, count: int | None = None) -> tuple[float, float, list[int]]:
    """(start, end, iterations) of the steady state from the first round that begins at or
    after iteration `first`: `count` iterations (None: to the end of the trace). With
    `count`, the first such round whose window has no checkpoint or evaluation in it, the
    window shortened (to 2 iterations at least) where none has."""
    ev = tl.events
    tr = ev[_trainer(ev)]
    starts = [b for b in round_starts(tl) if b >= first] or round_starts(tl)[-1:]
    if not starts:
        return 0.0, 0.0, []
    w = starts[0]
    if count is not None:
        paused = set(tr[tr["cat"].isin(PAUSE_CATS)]["iteration"].astype(int))
        for n in range(count, 1, -1):
            quiet = [b for b in starts if not paused & set(range(b, b + n))]
            if quiet:
                w, count = quiet[0], n
                break
    its = tr[(tr["cat"] == "iteration") & (tr["iteration"] >= w)]
    last = int(its["iteration"].max()) if len(its) else w
    end_it = last if count is None else min(last, w + count - 1)
    rnd = tr[(tr["cat"] == "round") & (tr["name"] == "round") & (tr["iteration"] == w)]
    t0 = float(rnd["start"].min()) if len(rnd) else float(its["start"].min())
    t1 = float(its[its["iteration"] <= end_it]["end"].max())
    return t0, t1, list(range(w, end_it + 1))


def common_start(timelines: list[Timeline], first: int, count: int) -> int | None:
    """The first iteration at or after `first` at which a round starts in every timeline and
    after which no checkpoint or evaluation comes in `count` iterations in any (None: none)."""
    common: set[int] | None = None
    paused: set[int] = set()
    for tl in timelines:
        starts = {b for b in round_starts(tl) if b >= first}
        common = starts if common is None else common & starts
        ev = tl.events
        paused |= set(ev[_trainer(ev) & ev["cat"].isin(PAUSE_CATS)]["iteration"].astype(int))
    quiet = sorted(b for b in common or () if not paused & set(range(b, b + count)))
    return quiet[0] if quiet else None


def _union(intervals: np.ndarray) -> np.ndarray:
    """Disjoint, sorted intervals covering the same time as `intervals` [n, 2]."""
    if not len(intervals):
        return intervals.reshape(0, 2)
    iv = intervals[np.argsort(intervals[:, 0])]
    out = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.array(out)


def _clip(iv: np.ndarray, t0: float, t1: float) -> np.ndarray:
    iv = np.clip(iv, t0, t1)
    return iv[iv[:, 1] > iv[:, 0]]


def _length(iv: np.ndarray) -> float:
    return float((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0.0


def _intersection(a: np.ndarray, b: np.ndarray) -> float:
    """Total length of the intersection of two sets of disjoint sorted intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        total += max(0.0, hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class Overlap:
    """Transfer time in a window, the part of it hidden behind compute, and their share."""

    transfer_s: float
    hidden_s: float

    @property
    def share(self) -> float:
        return self.hidden_s / self.transfer_s if self.transfer_s > 0 else float("nan")


def overlap(tl: Timeline, t0: float | None = None, t1: float | None = None) -> Overlap:
    """|T ∩ C| and |T| between t0 and t1 (default: the whole trace); see the module docstring."""
    ev = tl.events
    t0 = float(ev["start"].min()) if t0 is None else t0
    t1 = float(ev["end"].max()) if t1 is None else t1
    transfer = ev[ev["cat"].isin(TRANSFER_CATS) & ev["role"].str.startswith("server")]
    compute = ev[ev["cat"].isin(COMPUTE_CATS) & _trainer(ev)]
    pause = ev[ev["cat"].isin(PAUSE_CATS) & _trainer(ev)]
    tv = _union(_clip(transfer[["start", "end"]].to_numpy(dtype=float), t0, t1))
    cv = _union(_clip(compute[["start", "end"]].to_numpy(dtype=float), t0, t1))
    pv = _union(_clip(pause[["start", "end"]].to_numpy(dtype=float), t0, t1))
    return Overlap(_length(tv) - _intersection(tv, pv), _intersection(tv, cv))


def measured_overlap(tl: Timeline, warmup: int) -> Overlap:
    """The overlap over a run's measured iterations (see the module docstring)."""
    t0, t1, its = window(tl, warmup)
    return overlap(tl, t0, t1) if its else Overlap(0.0, 0.0)
