"""The README's cache-policy definitions are the simulators' docstring, word for word, and the
tie rules they state are the code's."""

import re
from pathlib import Path

import numpy as np

from bagpipe_cli.policies import simulators
from bagpipe_cli.policies.simulators import hot_rows, simulate_belady, simulate_lfu, simulate_lru
from bagpipe_cli.policies.table import POLICIES

README = Path(__file__).resolve().parents[1] / "README.md"


def _bullets(text: str) -> dict[str, str]:
    """`- name(...): definition` bullets (continuation lines indented), whitespace collapsed."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"- (\w+)(\(\w\))?: ", line)
        if m and m.group(1) in POLICIES:
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
    assert sorted(doc) == sorted(POLICIES)
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
