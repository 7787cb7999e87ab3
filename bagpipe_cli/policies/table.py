"""Every cache policy `bagpipe profile` simulates and the engine's planners follow: one table.

Code outside this table asks a policy what it is (what it is set by, its role, how to
simulate it, how a trainer's planner follows it, its colour) instead of testing its name,
so a new policy is one entry here plus its simulator or decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.policies.decisions import EvictingDecisions, HotSetDecisions
from bagpipe_cli.policies.simulators import (
    PolicyResult,
    lfu_count_bound,
    lfu_priority,
    simulate_belady,
    simulate_fae,
    simulate_lfu,
    simulate_lru,
)
from bagpipe_cli.policies.trace import Trace

# simulate(trace, capacity, progress, row_counts) -> PolicyResult
Simulate = Callable[[Trace, int, Any, Any], PolicyResult]
# decisions(trace, capacity, hot_sample) -> EvictingDecisions | HotSetDecisions
Decide = Callable[[Trace, int, float], Any]


@dataclass(frozen=True)
class Policy:
    """One cache policy."""

    name: str
    label: str  # in legends
    color: str  # in every plot (systems that plan by this policy share it)
    setting: str | None  # what it is set by: "lookahead" (L), "cache_rows" (R), or nothing
    role: str = "baseline"  # "reference": no cache, what the others save against; "ours";
    #                         "optimum": offline, the best any R-row cache can do; "baseline"
    simulate: Simulate | None = None  # a fixed-capacity policy's exact simulator
    decisions: Decide | None = None  # what a trainer's planner follows (engine baselines)
    needs_row_counts: bool = False  # simulated from every row's access count (the skew pass's)
    lookahead: int | None = None  # the lookahead rule at this fixed lookahead (prefetch's 1)
    line: str = "-"  # line style in plots


def _lru(tr: Trace, r: int, hot_sample: float) -> EvictingDecisions:
    return EvictingDecisions(tr, r, lambda b, lo, u: None, 0)


def _lfu(tr: Trace, r: int, hot_sample: float) -> EvictingDecisions:
    return EvictingDecisions(tr, r, lfu_priority(tr), lfu_count_bound(tr))


TABLE = (
    Policy("none", "no cache", "#7f7f7f", None, role="reference", line=":"),
    Policy("bagpipe", "bagpipe", "#d62728", "lookahead", role="ours"),
    Policy("prefetch", "prefetch (next batch)", "#e377c2", None, lookahead=1),
    Policy("lru", "lru", "#1f77b4", "cache_rows",
           simulate=lambda tr, r, progress, counts: simulate_lru(tr, r, progress), decisions=_lru),
    Policy("lfu", "lfu", "#2ca02c", "cache_rows",
           simulate=lambda tr, r, progress, counts: simulate_lfu(tr, r, progress), decisions=_lfu),
    Policy("fae", "fae", "#9467bd", "cache_rows",
           simulate=lambda tr, r, progress, counts: simulate_fae(tr, r, row_counts=counts),
           decisions=HotSetDecisions, needs_row_counts=True),
    Policy("belady", "belady", "#000000", "cache_rows", role="optimum", line="--",
           simulate=lambda tr, r, progress, counts: simulate_belady(tr, r, progress)),
)
POLICIES = tuple(p.name for p in TABLE)
_BY_NAME = {p.name: p for p in TABLE}
CAPACITY_POLICIES = tuple(p.name for p in TABLE if p.setting == "cache_rows")


def policy(name: str, option: str = "--policies") -> Policy:
    """The table's entry of `name`; a ConfigError naming `option` if there is none."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"{option}: unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None


def with_role(role: str) -> Policy:
    """The policy of a role ("reference", "ours", "optimum")."""
    return next(p for p in TABLE if p.role == role)
