"""Guidance from the size of the data: whether every embedding table fits on a trainer.

A cache (Bagpipe's, or any other system's) exists because the tables do not fit in a
trainer's memory. When they fit many times over, `local` (LOCAL: every table on each
trainer) can run. That is a fact of sizes, not a verdict: which system is fastest is for a
measurement or the model at the user's settings to say (`local` sums every row gradient
among the trainers, which can cost more than a cache's fetches). `table_fit` says the fact,
for `profile` (a dataset and this machine's memory), `bench` and `report` (stored runs:
`runs_fit`; `report.verdict` adds the measurements beside it where they disagree).

Definitions:
- a table's bytes: its rows of `row_dim` floats (E, +1 for a model with first-order
  weights) and their optimizer state (row-wise adagrad: one float a row), float32; the
  `tables` part of `engine/memory.py`'s estimate;
- a trainer's memory: what a run recorded as its machine's (`memory.machine_bytes` in
  summary.json), else this machine's (`limits.machine_memory`: its memory, or its cgroup's
  limit where lower);
- the tables *fit many times over* when they take at most 1/FITS_TIMES of that memory.

Standard library, and pandas for stored runs (imported when asked).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bagpipe_cli.engine.memory import table_bytes
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.limits import human_bytes, machine_memory

FITS_TIMES = 10  # the tables fit many times over: at most 1/10 of a trainer's memory
# Floats of optimizer state per row: engine/trainer/optim.py's RowOptimizer.state_dim (which imports
# torch), held equal by tests/test_guidance.py.
ROW_STATE_FLOATS = {"sgd": 0, "adagrad": 1}
LOCAL = spec("local").summary  # what `local` is, in the registry's words (`bagpipe systems`)
THIS_MACHINE = "this machine's"
RECORDED = "recorded by the runs"


@dataclass(frozen=True)
class TableFit:
    """How a dataset's tables compare with a trainer's memory."""

    dataset: str
    tables: int
    rows: int
    row_dim: int
    state_dim: int
    memory_bytes: int
    memory_source: str  # THIS_MACHINE or RECORDED

    @property
    def table_bytes(self) -> int:
        return table_bytes(self.rows, self.row_dim, self.state_dim)

    @property
    def times(self) -> float:
        """How many times over the tables fit (inf for tables of no bytes)."""
        return self.memory_bytes / self.table_bytes if self.table_bytes else math.inf

    @property
    def fits_many(self) -> bool:
        return self.table_bytes * FITS_TIMES <= self.memory_bytes

    def sentence(self) -> str | None:
        """One sentence when the tables fit many times over (None otherwise): the fact, that
        `local` can run, and no winner (a size check names none)."""
        if not self.fits_many:
            return None
        what = (f"All {self.tables} tables" if self.tables != 1 else "The one table")
        size = human_bytes(self.table_bytes) + (" with their optimizer state" if self.state_dim
                                                else "")
        fit = "fit" if self.tables != 1 else "fits"
        lead = f"Dataset `{self.dataset}`: {what[0].lower()}{what[1:]}" if self.dataset else what
        return (f"{lead} ({self.rows:,} rows of {self.row_dim} floats, {size}) {fit} in a "
                f"trainer's memory ({human_bytes(self.memory_bytes)}, {self.memory_source}) "
                f"~{about(self.times)} times over, so `local` ({LOCAL}) can run here; which "
                "system is fastest is for a measurement (`bagpipe bench`) or the model "
                "(`bagpipe simulate`) at your settings to say.")

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "tables": self.tables, "rows": self.rows,
                "row_dim": self.row_dim, "state_dim": self.state_dim,
                "table_bytes": self.table_bytes, "memory_bytes": self.memory_bytes,
                "memory_source": self.memory_source, "times": self.times,
                "fits_many": self.fits_many}


def about(x: float) -> str:
    """A count to two significant figures: 7 -> '7', 18,763 -> '19,000'."""
    if math.isinf(x):
        return "infinitely many"
    if x < 100:
        return f"{x:.0f}"
    digits = len(str(int(x))) - 2
    return f"{round(x, -digits):,.0f}"


def state_dim(optimizer: str | None) -> int:
    """Floats of optimizer state per row under the embedding optimizer `optimizer`."""
    return ROW_STATE_FLOATS.get(str(optimizer or "sgd"), 0)


def table_fit(cardinalities: list[int] | tuple[int, ...], row_dim: int, optimizer: str | None,
              memory: int | None = None, dataset: str = "") -> TableFit:
    """The fit of tables of `cardinalities` rows with rows of `row_dim` floats under
    `optimizer`, in `memory` bytes (default: this machine's)."""
    return TableFit(dataset, len(cardinalities), int(sum(cardinalities)), int(row_dim),
                    state_dim(optimizer), int(memory if memory is not None else machine_memory()),
                    THIS_MACHINE if memory is None else RECORDED)


def runs_fit(runs: Any) -> list[TableFit]:
    """Per dataset of stored runs (`results.load_runs(...).runs`: `dataset`, `dataset_tables`,
    `embedding_rows`, `row_dim` or `emb_dim`, `optimizer`, `memory_machine_bytes`): the fit of
    the largest tables its runs trained (the widest rows, with optimizer state)."""
    import pandas as pd

    out = []
    if not len(runs) or "embedding_rows" not in runs:
        return out
    for dataset, g in runs.groupby("dataset", sort=False, dropna=False):
        best: TableFit | None = None
        for _, r in g.iterrows():
            rows, tables = _int(r.get("embedding_rows")), _int(r.get("dataset_tables"))
            dim = _int(r.get("row_dim")) or _int(r.get("emb_dim"))
            if not rows or not tables or not dim:
                continue
            mem = pd.to_numeric(g.get("memory_machine_bytes"), errors="coerce")
            recorded = mem.dropna() if mem is not None else []
            fit = TableFit(str(dataset) if pd.notna(dataset) else "", tables, rows, dim,
                           state_dim(r.get("optimizer")),
                           int(recorded.median()) if len(recorded) else machine_memory(),
                           RECORDED if len(recorded) else THIS_MACHINE)
            if best is None or fit.table_bytes > best.table_bytes:
                best = fit
        if best is not None:
            out.append(best)
    return out


def small_data_sentences(runs: Any) -> dict[str, str]:
    """The sentence of every dataset of stored runs whose tables fit many times over, by
    dataset (`TableFit.dataset`)."""
    return {f.dataset: s for f in runs_fit(runs) if (s := f.sentence())}


def _int(v: Any) -> int:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0
    return int(x) if math.isfinite(x) else 0
