"""The README's cache-policy definitions are the simulators' docstring, word for word, and the
tie rules they state are the code's. (Those are the policy table's; a system's own policy is
defined by its module and its registry entry's summary, as `bagpipe systems` shows.)"""

import re
from pathlib import Path

import numpy as np

from bagpipe_cli.policies import simulators
from bagpipe_cli.policies.simulators import hot_rows, simulate_belady, simulate_lfu, simulate_lru
from bagpipe_cli.policies.table import TABLE

SHARED = {p.name for p in TABLE}  # the policies the table defines

README = Path(__file__).resolve().parents[1] / "README.md"


def _bullets(text: str) -> dict[str, str]:
    """`- name(...): definition` bullets (continuation lines indented), whitespace collapsed."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"- (\w+)(\(\w\))?: ", line)
        if m and m.group(1) in SHARED:
            name = m.group(1)
            out[name] = line
        elif name is not None and line.startswith("  ") and line.strip():
            out[name] += " " + line.strip()
        else:
            name = None
    return {k: " ".join(v.split()) for k, v in out.items()}


def test_the_readme_defines_every_policy_as_the_docstring_does():
    doc = _bullets(simulators.__doc__)
    readme = _bullets(README.read_text())
    assert sorted(doc) == sorted(SHARED)
    assert readme == doc


def test_lru_ties_go_by_the_first_access_within_the_last_use_batch():
    # Rows 0 and 1 are both last used in batch 1, where 1 came first; row 0 came first ever.
    # At batch 2 one must go: the rule evicts row 1, so batch 3's row 0 is a hit (3 fetches);
    # "first access ever" would evict row 0 and fetch it again (4).
    trace = [np.array([0, 1]), np.array([1, 0]), np.array([2]), np.array([0])]
    assert simulate_lru(trace, 2).fetched_rows == 3
    assert simulate_lfu(trace, 2).fetched_rows == 3  # equal counts: the same rule
    assert simulate_belady(trace, 2).fetched_rows == 3  # row 1 is never used again: it goes


def test_fae_ties_go_to_the_smaller_key():
    counts = np.array([0, 0, 0, 4, 0, 4, 1])  # rows 3 and 5 tie for the one hot slot
    assert np.flatnonzero(hot_rows(counts, 1)).tolist() == [3]
    assert np.flatnonzero(hot_rows(counts, 2)).tolist() == [3, 5]


def test_a_policys_decisions_replayed_are_its_simulator():
    """profile simulates a system's own policy by replaying its planner's decisions
    (`simulate_decisions`): for the table's policies that have both, the replay and the
    simulator agree batch by batch (and on the peak of resident rows)."""
    from bagpipe_cli.policies.simulators import simulate_decisions
    from bagpipe_cli.policies.table import capacity_policy_names, policy

    rng = np.random.default_rng(3)
    trace = [np.unique(rng.zipf(1.3, 40) % 300) for _ in range(60)]
    checked = 0
    for name in capacity_policy_names():
        p = policy(name)
        if p.decisions is None or p.simulate is None:
            continue
        for r in (max(len(b) for b in trace), 150, 400):
            got = simulate_decisions(name, trace, r, p.decisions)
            want = p.simulate(trace, r, None, None)
            assert got.fetched_per_batch.tolist() == want.fetched_per_batch.tolist(), (name, r)
            assert got.peak_resident_rows == want.peak_resident_rows, (name, r)
        checked += 1
    assert checked >= 3
