"""Every cache policy `bagpipe profile` simulates and the engine's planners follow.

Two sources, one list (`policies()`):

- `TABLE` below: the policies several systems or commands share: no cache (the reference),
  the lookahead rule (bagpipe's; prefetch's at lookahead 1), the fixed-capacity policies
  whose planners the baselines follow, and Belady (the optimum), each with an exact
  simulator of its own;
- a system's own policy: a fixed-capacity system whose registry entry names its planner's
  `decisions` (engine/registry.py; the decisions in its module under `engine/systems/`) is a
  policy of the same name, simulated by replaying those decisions (`simulate_decisions`).

Where a new policy goes: a policy one system follows is that system's (its decisions and
its registry entry: profile, bench and simulate then show it); one shared by several
systems, or needing a faster simulator than the replay, is an entry here. Code outside asks
a policy what it is (what it is set by, its role, how to simulate it, how a trainer's
planner follows it, its colour) instead of testing its name.
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
    simulate_decisions,
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


def _own(spec: Any) -> Policy:
    """System `spec`'s own policy (its registry entry's `decisions`), simulated by replay."""
    decide = spec.decisions
    return Policy(spec.name, spec.name, spec.color, "cache_rows", decisions=decide,
                  simulate=lambda tr, r, progress, counts: simulate_decisions(spec.name, tr, r, decide,
                                                                             progress))


def policies() -> tuple[Policy, ...]:
    """Every policy, in the order profile shows them: the table's, with every registered
    system's own policy before the optimum (see the module docstring)."""
    from bagpipe_cli.engine.registry import SYSTEMS  # the registry reads this table

    own = tuple(_own(s) for s in SYSTEMS.values() if s.decisions is not None and s.name not in _BY_NAME)
    cut = next(i for i, p in enumerate(TABLE) if p.role == "optimum")
    return TABLE[:cut] + own + TABLE[cut:]


def policy_names() -> tuple[str, ...]:
    """Every policy's name (`policies()`' order): profile's --policies."""
    return tuple(p.name for p in policies())


def capacity_policy_names() -> tuple[str, ...]:
    """The policies set by a capacity R (--cache-rows)."""
    return tuple(p.name for p in policies() if p.setting == "cache_rows")


_BY_NAME = {p.name: p for p in TABLE}


def policy(name: str, option: str = "--policies") -> Policy:
    """The policy `name` (the table's, or a system's own); a ConfigError naming `option` if
    there is none."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    found = next((p for p in policies() if p.name == name), None)
    if found is None:
        raise ConfigError(f"{option}: unknown policy {name!r}; choose from {', '.join(policy_names())}")
    return found


def with_role(role: str) -> Policy:
    """The policy of a role ("reference", "ours", "optimum")."""
    return next(p for p in TABLE if p.role == role)
