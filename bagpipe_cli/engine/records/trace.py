"""A run's trace in the Chrome trace-event format (`--trace PATH`): Perfetto (ui.perfetto.dev)
and chrome://tracing open it.

Every role records onto tracks of its own, one per thread: the planner (the planning
pass, each round's plan), each server (every request it serves: fetch, write-back, push),
each trainer process (data wait, rows read, prefetch issued and landed, forward, backward,
every collective with its bytes, optimizer, evictions, checkpoints, evaluations). Every
event carries the iteration and the round it belongs to; flow arrows link a fetch request
to the server slice that serves it, and a prefetch to each iteration that reads its rows.

    tracer = Tracer()                      # NO_TRACE when tracing is off: records nothing
    tracer.name_thread(role, thread)       # the calling thread's track
    tracer.at(b) / tracer.at_round(plan)   # the iteration and round of the events that follow
    with tracer.span("forward", "forward"): ...
    tracer.complete(name, cat, t0, t1)     # an interval timed by its caller (perf_counter s)
    tracer.flow_out(name, a, b) ... flow_in(name, a, b)   # an arrow from a slice to another
    part = tracer.export(offset)           # plain data, picklable (ranks send it to rank 0)
    trace_document([part, ...], meta)      # the JSON object, one clock for every part

Times are `time.perf_counter()` seconds: in-process every role shares that clock; over
torch.distributed each rank's is shifted onto rank 0's by the offset measured at start-up
(`engine/distributed/time_sync.py`). `NO_TRACE` allocates nothing per event: its `span` returns
one shared object, and callers pass numbers, never dictionaries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Any

import torch

from bagpipe_cli.engine.comm.collective import Collective

PLANNER = "planner"
REQUEST_FLOW = "request"  # a fetch request -> the server slice serving it
READ_FLOW = "prefetch -> read"  # a prefetch -> each iteration that reads its rows
TRACE_VERSION = 1
# An event: (phase, name, cat, t0 s, duration s, track, iteration, round, rows, bytes, peer,
# for_round, flow key). track: a thread ident, or (role, thread) for a named track.
Event = tuple
# What `peer` means on each category of event (see `_args`).
_PEER = {"serve": "trainer", "forward": "trainer", "backward": "trainer", "request": "server"}


def server_role(k: int) -> str:
    return f"server {k}"


def trainer_role(first: int, count: int) -> str:
    """The role of a process running trainers first..first+count-1."""
    return f"trainer {first}" if count == 1 else f"trainers {first}-{first + count - 1}"


class _NullSpan:
    """What NO_TRACE's `span` returns: one shared, reusable do-nothing context."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


_NULL_SPAN = _NullSpan()


class NoTracer:
    """Tracing off: every call returns at once and nothing is kept."""

    enabled = False

    def name_thread(self, role: str, thread: str) -> None:
        return None

    def role(self) -> str | None:
        return None

    def at(self, b: int, r: int | None = None) -> None:
        return None

    def at_round(self, plan: Any) -> None:
        return None

    @property
    def position(self) -> tuple[int, int]:
        return (-1, -1)

    def span(self, name: str, cat: str, rows: int = -1, nbytes: int = -1, peer: int = -1,
             target: int = -1, track: tuple[str, str] | None = None) -> _NullSpan:
        return _NULL_SPAN

    def complete(self, name: str, cat: str, t0: float, t1: float, rows: int = -1,
                 nbytes: int = -1, peer: int = -1, target: int = -1,
                 track: tuple[str, str] | None = None,
                 position: tuple[int, int] | None = None) -> None:
        return None

    def flow_out(self, name: str, a: int, b: int = -1, c: int = -1,
                 at: float | None = None) -> None:
        return None

    def flow_in(self, name: str, a: int, b: int = -1, c: int = -1,
                at: float | None = None) -> None:
        return None

    def export(self) -> dict[str, Any]:
        return {"events": [], "origin": 0.0}


NO_TRACE = NoTracer()


class _Span:
    """A slice timed from `with` to its end, on the thread (or named track) that opened it."""

    __slots__ = ("tr", "name", "cat", "rows", "nbytes", "peer", "target", "track", "pos", "t0")

    def __init__(self, tr: Tracer, name: str, cat: str, rows: int, nbytes: int, peer: int,
                 target: int, track: tuple[str, str] | None):
        self.tr, self.name, self.cat, self.rows, self.nbytes = tr, name, cat, rows, nbytes
        self.peer, self.target, self.track, self.pos = peer, target, track, tr.position

    def __enter__(self) -> _Span:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.tr.complete(self.name, self.cat, self.t0, time.perf_counter(), self.rows,
                         self.nbytes, self.peer, self.target, self.track, self.pos)
        return False


class Tracer(NoTracer):
    """Records events of every thread of this process (see the module docstring)."""

    enabled = True

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.events: list[Event] = []
        self._tracks: dict[int, tuple[str, str]] = {}
        self._pos = (-1, -1)
        # This clock + offset = the reference clock (rank 0's), within rtt / 2.
        self.offset, self.rtt = 0.0, 0.0

    def name_thread(self, role: str, thread: str) -> None:
        """The calling thread's events go to `thread` of `role`."""
        self._tracks[threading.get_ident()] = (role, thread)

    def role(self) -> str | None:
        """The role of the calling thread (None if it has no track)."""
        track = self._tracks.get(threading.get_ident())
        return track[0] if track else None

    def at(self, b: int, r: int | None = None) -> None:
        """Events that follow belong to iteration b (and round r, when given)."""
        self._pos = (b, self._pos[1] if r is None else r)

    def at_round(self, plan: Any) -> None:
        """Events that follow belong to round `plan.r` and its first iteration."""
        b = plan.iters[0].b if plan.iters else self._pos[0] + 1
        self._pos = (b, plan.r)

    @property
    def position(self) -> tuple[int, int]:
        """(iteration, round) that events recorded now belong to."""
        return self._pos

    def span(self, name: str, cat: str, rows: int = -1, nbytes: int = -1, peer: int = -1,
             target: int = -1, track: tuple[str, str] | None = None) -> _Span:
        return _Span(self, name, cat, rows, nbytes, peer, target, track)

    def complete(self, name: str, cat: str, t0: float, t1: float, rows: int = -1,
                 nbytes: int = -1, peer: int = -1, target: int = -1,
                 track: tuple[str, str] | None = None,
                 position: tuple[int, int] | None = None) -> None:
        b, r = position if position is not None else self._pos
        where = track if track is not None else threading.get_ident()
        self.events.append(("X", name, cat, t0, t1 - t0, where, b, r, rows, nbytes, peer, target,
                            None))

    def _flow(self, phase: str, key: tuple, at: float | None) -> None:
        t = time.perf_counter() if at is None else at
        b, r = self._pos
        self.events.append((phase, key[0], "flow", t, 0.0, threading.get_ident(), b, r, -1, -1,
                            -1, -1, key))

    def flow_out(self, name: str, a: int, b: int = -1, c: int = -1,
                 at: float | None = None) -> None:
        """Arrow `(name, a, b, c)` starts at the slice open on this thread now (or at `at`);
        the numbers make it unique in the run (e.g. trainer, server, request)."""
        self._flow("s", (name, a, b, c), at)

    def flow_in(self, name: str, a: int, b: int = -1, c: int = -1,
                at: float | None = None) -> None:
        """Arrow `(name, a, b, c)` ends at the slice open on this thread now (or at `at`)."""
        self._flow("f", (name, a, b, c), at)

    def export(self) -> dict[str, Any]:
        """This process's events as plain data, tracks named and times on the reference clock
        (this process's clock + `self.offset`)."""
        out = []
        for e in list(self.events):
            track = e[5] if isinstance(e[5], tuple) else self._tracks.get(e[5], ("other", "thread"))
            out.append((*e[:3], e[3] + self.offset, e[4], *track, *e[6:]))
        roles = sorted({e[5] for e in out})
        return {"events": out, "origin": self.origin + self.offset, "roles": roles,
                "offset_s": self.offset, "rtt_s": self.rtt}


def trace_meta(cfg: Any, clock: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """What a trace says of its run (the document's `otherData`): the run, and how its clocks
    were put on one (every part's measured offset to the first part's and round trip)."""
    offsets = {", ".join(p["roles"]) or f"part {i}": {"offset_us": round(p["offset_s"] * 1e6, 3),
                                                     "round_trip_us": round(p["rtt_s"] * 1e6, 3)}
               for i, p in enumerate(parts)}
    return {"system": cfg.system, "iterations": cfg.iterations, "warmup": cfg.warmup,
            "trainers": cfg.trainers, "servers": cfg.servers, "clock": clock,
            "clock_offsets": offsets}


def _role_order(role: str) -> tuple[int, int]:
    if role == PLANNER:
        return (0, 0)
    kind, _, rest = role.partition(" ")
    num = int(rest.split("-")[0].split()[0]) if rest[:1].isdigit() else 0
    return ({"server": 1, "trainer": 2, "trainers": 2}.get(kind, 3), num)


def _args(e: tuple) -> dict[str, Any]:
    _, _, cat, _, _, _, _, b, r, rows, nbytes, peer, target, _ = e
    args: dict[str, Any] = {"iteration": b, "round": r}
    if rows >= 0:
        args["rows"] = rows
    if nbytes >= 0:
        args["bytes"] = nbytes
    if peer >= 0:
        args[_PEER.get(cat, "peer")] = peer
    if target >= 0:
        args["for_round"] = target
    return args


def trace_document(parts: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """One trace from every process's exported events (`Tracer.export`): a process (pid) per
    role, a thread (tid) per track, times in µs from the first part's origin; flows whose
    start or end is missing are left out."""
    origin = parts[0]["origin"] if parts else 0.0
    events = [e for p in parts for e in p["events"]]
    roles = sorted({e[5] for e in events}, key=_role_order)
    pid = {role: i + 1 for i, role in enumerate(roles)}
    tid: dict[tuple[str, str], int] = {}
    for e in events:
        tid.setdefault((e[5], e[6]), len(tid) + 1)
    out: list[dict[str, Any]] = []
    for role, p in pid.items():
        out += [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": role}},
                {"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                 "args": {"sort_index": p}}]
    for (role, thread), t in tid.items():
        out += [{"ph": "M", "name": "thread_name", "pid": pid[role], "tid": t,
                 "args": {"name": thread}},
                {"ph": "M", "name": "thread_sort_index", "pid": pid[role], "tid": t,
                 "args": {"sort_index": t}}]
    starts = {e[13] for e in events if e[0] == "s"}
    ends = {e[13] for e in events if e[0] == "f"}
    flow_id: dict[Hashable, int] = {}
    for e in sorted(events, key=lambda e: e[3]):
        ph, name, cat, t, dur, role, thread = e[:7]
        ev = {"ph": ph, "name": name, "cat": cat, "ts": round((t - origin) * 1e6, 3),
              "pid": pid[role], "tid": tid[(role, thread)]}
        if ph == "X":
            ev["dur"] = round(dur * 1e6, 3)
            ev["args"] = _args(e)
        else:
            key = e[13]
            if key not in starts or key not in ends:
                continue
            ev["id"] = flow_id.setdefault(key, len(flow_id) + 1)
            if ph == "f":
                ev["bp"] = "e"  # bound to the slice that encloses it
        out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"bagpipe_trace": TRACE_VERSION, **meta}}


class _TracedSum:
    """A background sum in flight; waiting for it is traced."""

    def __init__(self, inner: Any, tracer: Tracer, nbytes: int):
        self.inner, self.tracer, self.nbytes = inner, tracer, nbytes

    def result(self) -> torch.Tensor:
        with self.tracer.span("wait sum (sync_later)", "collective", nbytes=self.nbytes):
            return self.inner.result()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class TracedCollective(Collective):
    """Any runtime's collective with its sums traced (their bytes, critical or background);
    everything else (the dense buckets' module, the counters) is the inner collective's."""

    def __init__(self, inner: Collective, tracer: Tracer):
        self.inner, self.tracer, self.size = inner, tracer, inner.size

    def allreduce_(self, tensors: list[torch.Tensor], values: list[torch.Tensor],
                   dense: list[torch.Tensor] = (), overlap_s: float = 0.0) -> list:
        # the rows' gradients and every trainer's loss (the dense ones were summed in buckets)
        nbytes = sum(t.numel() * t.element_size() for t in tensors) + 4 * self.size
        with self.tracer.span(f"{self.inner.kind} sum", "collective", nbytes=nbytes):
            return self.inner.allreduce_(tensors, values, dense, overlap_s)

    def start_sum(self, x: torch.Tensor) -> _TracedSum:
        nbytes = x.numel() * x.element_size()
        with self.tracer.span("start sum (sync_later)", "collective", nbytes=nbytes):
            return _TracedSum(self.inner.start_sum(x), self.tracer, nbytes)

    def exchange(self, parts: list[torch.Tensor], counts: list[int], later: bool = False):
        nbytes = sum(p.numel() * p.element_size() for p in parts)
        name = "start exchange (sync_later)" if later else "exchange rows"
        with self.tracer.span(name, "collective", nbytes=nbytes):
            out = self.inner.exchange(parts, counts, later)
        return _TracedSum(out, self.tracer, nbytes) if later else out

    def move_rows(self, sent, received, row_bytes: int, x: torch.Tensor | None = None,
                  later: bool = False):
        nbytes = int(sent.max(initial=0)) * row_bytes
        with self.tracer.span("exchange rows", "collective", nbytes=nbytes):
            out = self.inner.move_rows(sent, received, row_bytes, x, later)
        return _TracedSum(out, self.tracer, nbytes) if later else out

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.inner.wrap(model)

    def take_dense_wait(self) -> float:
        return self.inner.take_dense_wait()

    def close(self) -> None:
        self.inner.close()

    def __getattribute__(self, name: str) -> Any:
        if name in _COUNTERS:  # the inner collective's, not the base class's defaults
            return getattr(object.__getattribute__(self, "inner"), name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_COUNTERS = frozenset({"kind", "bytes_sent", "bytes_received", "busy_s", "exposed_s"})


def traced(collective: Collective, tracer: NoTracer) -> Collective:
    """`collective`, traced when `tracer` records."""
    return TracedCollective(collective, tracer) if tracer.enabled else collective

