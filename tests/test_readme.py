"""The README's tables of what a run records equal the code's definitions
(`engine/records/metrics.py`: COLUMNS for metrics.csv, SUMMARY_KEYS for summary.json)."""

import re
from pathlib import Path

from bagpipe_cli.engine.records.metrics import COLUMNS, SUMMARY_KEYS

README = Path(__file__).resolve().parents[1] / "README.md"


def _table(header: str) -> list[list[str]]:
    """The cells of the README table whose header row is `header`, one list per row."""
    lines = README.read_text().splitlines()
    start = lines.index(header) + 2  # the header and the |---| row
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_readme_metrics_columns_equal_the_code():
    rows = _table("| column | merge | meaning |")
    documented = [(name, merge) for first, merge, _ in rows for name in _names(first)]
    assert documented == [(c.name, c.merge) for c in COLUMNS]


def test_readme_summary_keys_equal_the_code():
    rows = _table("| keys | meaning |")
    assert [name for first, _ in rows for name in _names(first)] == list(SUMMARY_KEYS)

