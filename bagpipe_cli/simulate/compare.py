"""What `bagpipe simulate` shows of a prediction, as text the command prints: the table of
every system's predicted times, bagpipe's speed-up over each other system (next to a
scenario's published figures, for the systems its source compared), the fastest system in
words, and the share of the reference's iteration spent waiting for embeddings.

Each function returns rows of strings or lines; none prints (`cli/simulate.py` does).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bagpipe_cli.engine.registry import SYSTEMS, role
from bagpipe_cli.simulate.model import Prediction


@dataclass(frozen=True)
class TextTable:
    """A table as text: its title, caption, column names and rows of cells."""

    title: str
    caption: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    left: tuple[str, ...] = ()  # the columns aligned left (the others: right)


def ratio(slow_ms: float, fast_ms: float) -> str:
    """slow / fast as "2.50x"; "-" where it is not a number."""
    r = slow_ms / fast_ms if fast_ms > 0 else math.nan
    return f"{r:.2f}x" if math.isfinite(r) else "-"


def published(system: str) -> bool:
    """Whether a scenario's `reported:` figures apply to `system` (its registry entry says the
    published comparison ran it; a name the registry does not know: no)."""
    s = SYSTEMS.get(system)
    return bool(s is not None and s.published)


def prediction_table(result: Any) -> TextTable:
    """One row per system of a `SimulateResult`: its predicted times, speed-up over the
    reference, rank 0's work, the megabytes each part sends per iteration (plan, server
    rows, collective: each column names what it counts) and the rows it fetches."""
    cfg, cl = result.config, result.config.cluster
    net = f"{cl.net_gbps:g} Gbit/s" if cl.net_gbps else "infinite bandwidth"
    if cl.trainer_gbps:
        net += f" (trainers {cl.trainer_gbps:g} Gbit/s)"
    title = (f"{cfg.name}: {cl.trainers} trainers, {cl.servers} servers, {net}, "
             f"{cl.net_latency_us:g} us, {cfg.runtime}; batch {cfg.batch_size:,}, L={cfg.lookahead}, "
             f"{result.trace['iterations']:,} iterations traced")
    caption = ("ms per iteration, means after warm-up; fetch, sync, plan: exposed waits (plan: for "
               "rank 0 or the plans' relay); iter = compute + fetch + sync + plan; vs sync: "
               "speed-up of the mean; rank 0: its planning per iteration (its link sends the plans "
               "beside it, a stage of its own). MB per "
               "iteration: plan MB, the plans rank 0 sends; server rows MB, the rows (with their "
               "state) all the servers send; collective MB, the trainers' sums and exchanges "
               "(the busiest trainer's sent); fetched: rows fetched per iteration"
               + "".join(f"\n{n}" for n in setup_notes(result)))
    rows = []
    for p in result.predictions:
        v = result.volumes[p.system]
        rows.append([p.system, f"{p.compute_ms:.2f}", f"{p.exposed_fetch_ms:.2f}",
                     f"{p.exposed_sync_ms:.2f}", f"{p.exposed_plan_ms:.2f}", f"{p.mean_ms:.2f}",
                     f"{p.median_ms:.2f}", f"{p.speedup:.2f}x" if math.isfinite(p.speedup) else "-",
                     f"{p.planner_ms_per_iter:.2f}", f"{p.planner_mb_per_iter:.3f}",
                     f"{p.server_rows_mb_per_iter:.3f}", f"{p.collective_mb_per_iter:.3f}",
                     f"{v['rows_fetched']:,.0f}"])
    columns = ["system", "compute", "fetch", "sync", "plan", "iter", "median", "vs sync",
               "rank 0", "plan MB", "server rows MB", "collective MB", "fetched"]
    return TextTable(title, caption, columns, rows, left=("system",))


def setup_notes(result: Any) -> list[str]:
    """A footnote per system that fetches no rows but whose servers send some: those are its
    tables' setup copy (local: each trainer's copy of every table; sharded: each trainer's
    shard), sent once before training, untimed, spread over the iterations."""
    return [f"* {p.system} fetches 0 rows: its server rows MB are its tables' setup copy, sent "
            "once before training (untimed), spread over the iterations"
            for p in result.predictions
            if result.volumes[p.system]["rows_fetched"] == 0 and p.server_rows_mb_per_iter > 0]


def speedup_table(preds: list[Prediction], reported: dict[str, Any] | None) -> TextTable | None:
    """bagpipe's predicted speed-up over every other system simulated (`local` included), with a `reported` column where the scenario has published figures: a system's
    own entry of `reported.speedup`, else "up to" `reported.speedup_max`, for the systems the
    publication compared (`published`), "-" for the others. None without bagpipe."""
    ours = next((p for p in preds if role(p.system) == "ours"), None)
    if ours is None:
        return None
    rep = reported or {}
    title = ("predicted speed-up of bagpipe over each other system"
             + (f" (reported: {rep.get('source', 'published')})" if rep else ""))
    columns = ["system", "bagpipe speed-up"] + (["reported"] if rep else [])
    rows = []
    for p in preds:
        if p is ours:
            continue
        row = [p.system, ratio(p.mean_ms, ours.mean_ms)]
        if rep:
            row.append(_reported(rep, p.system))
        rows.append(row)
    return TextTable(title, "its mean iteration / bagpipe's (below 1x: faster than bagpipe)",
                     columns, rows, left=("system",))


def _reported(rep: dict[str, Any], system: str) -> str:
    """The published speed-up of bagpipe over `system`, or "-" where none was published."""
    if not published(system):
        return "-"
    per, best = rep.get("speedup") or {}, f"up to {rep.get('speedup_max', '?')}x"
    return str(per.get(system, best) if isinstance(per, dict) else per)


def fastest_line(preds: Iterable[Prediction]) -> str:
    """In words: the fastest system (mean iteration time) and its speed-up over the next
    fastest (the best other) and over the reference (sync) where simulated; "" for fewer
    than two systems."""
    ok = sorted((p for p in preds if math.isfinite(p.mean_ms)), key=lambda p: p.mean_ms)
    if len(ok) < 2:
        return ""
    best, runner = ok[0], ok[1]
    line = (f"fastest: {best.system}, {ratio(runner.mean_ms, best.mean_ms)} over "
            f"{runner.system} (the best other)")
    ref = next((p for p in ok[2:] if role(p.system) == "reference"), None)
    if ref is not None:
        line += f", {ratio(ref.mean_ms, best.mean_ms)} over {ref.system}"
    return line


def embedding_wait_line(preds: Iterable[Prediction], reported: dict[str, Any] | None) -> str:
    """The share of the reference's mean iteration spent waiting for rows and
    synchronisation, with the published share where the scenario has one and its source
    ran the reference; "" without the reference (or a zero iteration)."""
    ref = next((p for p in preds if role(p.system) == "reference"), None)
    if ref is None or not ref.mean_ms > 0:
        return ""
    share = (ref.exposed_fetch_ms + ref.exposed_sync_ms) / ref.mean_ms
    note = (reported or {}).get("embedding_share") if published(ref.system) else None
    return (f"{ref.system} waits for embedding rows and synchronisation {share:.0%} of its "
            f"iteration" + (f" (reported: {note})" if note else ""))
