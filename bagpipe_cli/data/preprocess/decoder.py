"""Decoding blocks of input: checks, the dense transform and per-table factorisation.

`decoded_blocks` turns one file's parsed blocks (`reader`) into `DecodedBlock`s: labels
checked to be 0 or 1 (or derived by a `--label-threshold`), dense features as
log(1 + max(x, 0)), and each table's values factorised into a `CatColumn` (distinct keys,
see `vocab`, and each row's index into them). Bad lines are found by vectorised checks and handed to `BadLines`, which raises on
the first one (`FILE:LINE: problem`) or, with `--on-bad-line skip`, records them while
the block is decoded again without them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bagpipe_cli.data.preprocess.layout import CatSpec, Layout
from bagpipe_cli.data.preprocess.reader import (
    Block,
    iter_parquet_blocks,
    iter_text_blocks,
    prefetch,
)
from bagpipe_cli.data.preprocess.values import (
    fmt_value,
    not_finite,
    numbers,
    threshold_hint,
    threshold_label,
)
from bagpipe_cli.data.preprocess.vocab import hex_bad, value_keys
from bagpipe_cli.errors import DataError

_BAD_LINES_KEPT = 10
# A bad line: (line, problem, cause, what would fix it: asked only when it stops the run).
_Found = tuple[int, str, str, Callable[[], str | None] | None]
_DAYS = np.array(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], dtype=object)
_HOURS = np.array([f"{h:02d}" for h in range(24)], dtype=object)


# --------------------------------------------------------------------------- bad lines


@dataclass
class BadLines:
    """Bad input lines: the first one is an error, or (skip) all are counted.

    A line counts once however many problems it has; `causes` counts the lines per cause
    ("COLUMN: what is wrong", e.g. "price: not finite"), so meta.json and the summary say
    which columns were dropped for what.
    """

    mode: str
    count: int = 0
    first: list[dict[str, Any]] = field(default_factory=list)
    per_file: dict[str, int] = field(default_factory=dict)
    causes: dict[str, int] = field(default_factory=dict)

    def take(self, block: Block, found: list[_Found]) -> None:
        """Handle the (line, problem, cause, fix) of one block's bad lines: raise, or record them."""
        if not found:
            return
        found.sort(key=lambda x: x[0])  # stable: a line's problems stay in the order listed
        if self.mode == "error":
            line, problem, _, fix = found[0]
            how = fix() if fix is not None else None
            raise DataError(f"{block.where(line)}: {problem}" + (
                f"; {how}, or pass --on-bad-line skip to drop such lines" if how
                else " (pass --on-bad-line skip to skip bad lines)"))
        by_line: dict[int, list[tuple[str, str]]] = {}
        for line, problem, cause, _ in found:
            by_line.setdefault(line, []).append((problem, cause))
        self.count += len(by_line)
        key = str(block.path)
        self.per_file[key] = self.per_file.get(key, 0) + len(by_line)
        for problems in by_line.values():
            for cause in dict.fromkeys(c for _, c in problems):
                self.causes[cause] = self.causes.get(cause, 0) + 1
        for line, problems in list(by_line.items())[: max(0, _BAD_LINES_KEPT - len(self.first))]:
            self.first.append({"file": key, block.unit: line,
                               "problem": "; ".join(dict.fromkeys(p for p, _ in problems))})


# --------------------------------------------------------------------------- decoding


@dataclass
class CatColumn:
    """One table's values in a block, factorised."""

    codes: np.ndarray  # per row: index into keys
    keys: np.ndarray  # distinct keys of the block, in order of first appearance
    valid: np.ndarray  # per key: False for the entry that stands for a missing value
    values: pa.Array | None  # the valid keys' values (None: the keys are the values)


@dataclass
class DecodedBlock:
    """One block's rows, checked and transformed, ready to be counted or encoded."""

    n: int
    labels: np.ndarray | None
    dense: np.ndarray
    cats: list[CatColumn]


# An issue: bad row positions, how to describe one of them, and its cause for the counts
# (`BadLines.causes`: "COLUMN: what is wrong"); maybe what would fix one of them.
_Issue = tuple[np.ndarray, Callable[[int], str], str] | tuple[
    np.ndarray, Callable[[int], str], str, Callable[[int], str | None]]


def _dict_encode(col: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """(codes, distinct values in order of first appearance); missing rows get len(values)."""
    enc = pc.dictionary_encode(col)
    chunks = [c for c in (enc.chunks if isinstance(enc, pa.ChunkedArray) else [enc])]
    if not chunks:
        return np.zeros(0, np.int64), pa.array([], col.type)
    dictionary = chunks[-1].dictionary  # pyarrow unifies the dictionary across chunks
    u = len(dictionary)
    codes = np.concatenate([pc.fill_null(c.indices, u).to_numpy() for c in chunks])
    return codes.astype(np.int64, copy=False), dictionary


def _words(col: pa.ChunkedArray) -> np.ndarray:
    """The 8 bytes of each fixed_size_binary(8) value as an int64 (-1 where missing).

    No copy, no conversion: -1 is never 8 ASCII bytes.
    """
    parts = [np.frombuffer(c.buffers()[1], "<i8")[c.offset : c.offset + len(c)]
             for c in col.chunks if len(c)]
    keys = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if col.null_count:
        keys[~pc.is_valid(col).to_numpy(zero_copy_only=False)] = -1  # keys is our own copy
    return keys


def _merge_equal_keys(codes: np.ndarray, keys: np.ndarray,
                      values: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Merge distinct values that share a key ("abc" and "00000abc" in hex).

    `codes` index `keys`, with len(keys) for missing; so do the returned codes.
    """
    uniq_codes, uniq = pd.factorize(keys)
    if len(uniq) == len(keys):
        return codes, keys, values
    cm = np.maximum.accumulate(uniq_codes)
    first = np.flatnonzero(np.concatenate(([True], cm[1:] > cm[:-1])))
    codes = np.append(uniq_codes, len(uniq))[codes]
    return codes, np.asarray(uniq, dtype=np.int64), values.take(pa.array(first))


def _cat(spec: CatSpec, col: pa.ChunkedArray) -> tuple[CatColumn | None, _Issue | None]:
    """Factorise one table's column; or the rows whose value is not valid for its kind."""
    if pa.types.is_fixed_size_binary(col.type):  # Criteo, the fast path
        codes, uniq = pd.factorize(_words(col))
        keys = np.asarray(uniq, dtype=np.int64)
        valid = keys != -1
        bad = hex_bad(keys) & valid
        values = None
    else:
        codes, values = _dict_encode(col)
        keys, bad = value_keys(spec.vocab_kind, values)
        if not bad.any():
            codes, keys, values = _merge_equal_keys(codes, keys, values)
        keys, bad = np.append(keys, -1), np.append(bad, False)
        valid = np.ones(len(keys), bool)
        valid[-1] = False
    if bad.any():
        rows = np.flatnonzero(bad[codes])
        return None, (rows, lambda r: (f"{spec.name} = {fmt_value(col[int(r)].as_py())} is not "
                                       "a hexadecimal value of 1-8 digits"),
                      f"{spec.name}: not hexadecimal")
    return CatColumn(codes, keys, valid, values), None


def _hour_parts(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Avazu `hour` (YYMMDDHH) -> (hour of day, day of week, missing, bad) per row."""
    vals, bad, missing = numbers(col, integer=True)
    with np.errstate(invalid="ignore"):
        huge = ~np.isnan(vals) & (np.abs(vals) >= 1e10)  # no YYMMDDHH; beyond int64, maybe
    bad |= huge
    v = np.where(np.isnan(vals) | huge, 0, vals).astype(np.int64)
    hh = v % 100
    ymd = v // 100
    dates = pd.to_datetime(
        pd.DataFrame({"year": 2000 + ymd // 10000, "month": (ymd // 100) % 100, "day": ymd % 100}),
        errors="coerce",
    )
    dow = dates.dt.day_of_week.to_numpy(dtype=float, na_value=np.nan)
    bad |= ~missing & ((v < 0) | (v >= 10**8) | (hh > 23) | np.isnan(dow))
    hh = np.where(bad, 0, hh)  # a bad row's derived values are never used, but must index
    dow = np.where(np.isnan(dow), 0, dow).astype(np.int64)
    return hh, dow, missing, bad


def _derived_cat(labels: np.ndarray, which: np.ndarray, missing: np.ndarray) -> pa.ChunkedArray:
    vals = labels[which].astype(object)
    vals[missing] = None
    return pa.chunked_array([pa.array(vals, pa.string())])


def _dense(name: str, col: pa.ChunkedArray, integer: bool) -> tuple[np.ndarray, list[_Issue]]:
    """log(1 + max(x, 0)) of one dense column (missing -> 0), or its bad rows.

    A value that is not a number, and one that is not finite (inf, nan, 1e400), is a bad
    line: no value of the transform stands for it, and 0 would pass for a real one.
    """
    if pa.types.is_integer(col.type):  # the fast path: no NaN, float32 throughout
        x = np.maximum(pc.fill_null(col, 0).to_numpy(), 0).astype(np.float32)
        x += 1  # exact for integers: log(1 + x) == log1p(x) here, and log is vectorised
        return np.log(x, out=x), []
    vals, bad, missing = numbers(col, integer)
    issues: list[_Issue] = []
    if bad.any():
        kind = "an integer" if integer else "a number"
        issues.append((np.flatnonzero(bad), lambda r: f"{name} = {fmt_value(col[int(r)].as_py())} "
                                                       f"is not {kind}", f"{name}: not {kind}"))
    inf_or_nan = ~bad & ~missing & ~np.isfinite(vals)
    if inf_or_nan.any():
        issues.append((np.flatnonzero(inf_or_nan), lambda r: not_finite(name, col, int(r)),
                       f"{name}: not finite"))
    with np.errstate(invalid="ignore"):
        vals = np.log1p(np.maximum(vals, 0.0))  # NaN (missing or bad) stays NaN
    vals[~np.isfinite(vals)] = 0.0  # missing -> 0; a bad row's value is never written
    return vals.astype(np.float32), issues


def _label(layout: Layout, t: pa.Table, empty_rows: Callable[[], np.ndarray],
           issues: list[_Issue]) -> np.ndarray:
    name = layout.label
    raw = t.column(name)
    lab, bad, missing = numbers(raw, integer=False)
    if missing.any():
        empty = empty_rows()
        for rows, what, cause in ((missing & empty, "empty line", "empty line"),
                                  (missing & ~empty, f"missing label ({name})",
                                   f"{name}: missing label")):
            if rows.any():
                issues.append((np.flatnonzero(rows), lambda r, what=what: what, cause))
    if layout.threshold is not None:
        return threshold_label(layout.threshold, raw, lab, bad, missing, issues)
    wrong = ~missing & (lab != 0) & (lab != 1)  # nan, inf and a bad value too (NaN)
    if wrong.any():
        issues.append((np.flatnonzero(wrong), lambda r: (
            f"{name} = {fmt_value(raw[int(r)].as_py())} is not 0 or 1"), f"{name}: not 0 or 1",
            lambda r: threshold_hint(name, float(lab[r]))))
    return np.where(wrong | missing, 0, lab).astype(np.float32)


def _decode(block: Block, layout: Layout,
            pool: ThreadPoolExecutor) -> tuple[DecodedBlock, list[_Found]]:
    """Validate and transform one block; returns the decoded rows and its bad (line, problem)."""
    t = block.table
    n = t.num_rows
    empty_rows = functools.cache(lambda: _empty_rows(t))  # only computed when asked for

    # Tables and dense columns are independent: two threads (numpy/pandas/pyarrow release
    # the GIL) while the reader thread parses the next block.
    hour_cols = {c.column for c in layout.cats if c.kind in ("hour_of_day", "day_of_week")}
    hours = {c: pool.submit(_hour_parts, t.column(c)) for c in hour_cols}
    dense_jobs = [pool.submit(_dense, d, t.column(d), layout.dense_integer) for d in layout.dense]
    cat_jobs = [pool.submit(_table_cat, spec, t, hours) for spec in layout.cats]

    # Issues are listed in this order (label, hour, dense, tables): `BadLines` reports the
    # earliest line, and of a line's several problems the first one listed.
    issues: list[_Issue] = []
    labels = None
    if layout.label is not None:
        labels = _label(layout, t, empty_rows, issues)
    elif n and empty_rows().any():
        issues.append((np.flatnonzero(empty_rows()), lambda r: "empty line", "empty line"))
    issues += _hour_issues(t, hours)
    dense = _gather_dense(n, dense_jobs, issues)
    cats = _gather_cats(cat_jobs, issues)
    return DecodedBlock(n, labels, dense, cats), _located(block, issues)


def _empty_rows(t: pa.Table) -> np.ndarray:
    """Per row: every field is empty (an empty line)."""
    e = np.ones(t.num_rows, bool)
    for c in t.columns:
        if c.null_count == 0:
            e[:] = False
            break
        e &= c.is_null().to_numpy(zero_copy_only=False)
    return e


_HourParts = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # see `_hour_parts`


def _table_cat(spec: CatSpec, t: pa.Table,
               hours: dict[str, Future[_HourParts]]) -> tuple[CatColumn | None, _Issue | None]:
    """`_cat` of one table; an hour-derived table takes its values from the parsed hour."""
    col = t.column(spec.column)
    if spec.kind in ("hour_of_day", "day_of_week"):
        hh, dow, missing, bad = hours[spec.column].result()
        col = (_derived_cat(_HOURS, hh, missing | bad) if spec.kind == "hour_of_day"
               else _derived_cat(_DAYS, dow, missing | bad))
    return _cat(spec, col)


def _hour_issues(t: pa.Table, hours: dict[str, Future[_HourParts]]) -> list[_Issue]:
    """The rows of each hour column that are not a valid YYMMDDHH."""
    issues: list[_Issue] = []
    for c, job in hours.items():
        bad = job.result()[3]
        if bad.any():
            col = t.column(c)
            issues.append((np.flatnonzero(bad), lambda r, col=col, c=c: (
                f"{c} = {fmt_value(col[int(r)].as_py())} is not YYMMDDHH"), f"{c}: not YYMMDDHH"))
    return issues


def _gather_dense(n: int, jobs: list[Future[tuple[np.ndarray, list[_Issue]]]],
                  issues: list[_Issue]) -> np.ndarray:
    """The dense features [n, D] from their per-column jobs; their issues go to `issues`."""
    dense = np.zeros((n, len(jobs)), np.float32)
    for j, job in enumerate(jobs):
        dense[:, j], found = job.result()
        issues += found
    return dense


def _gather_cats(jobs: list[Future[tuple[CatColumn | None, _Issue | None]]],
                 issues: list[_Issue]) -> list[CatColumn]:
    """The tables' columns from their jobs; a table with bad values adds its issue instead."""
    cats = []
    for job in jobs:
        cat, issue = job.result()
        if issue:
            issues.append(issue)
        else:
            cats.append(cat)
    return cats  # type: ignore[return-value]


def _located(block: Block, issues: list[_Issue]) -> list[_Found]:
    """(line, problem, cause, fix) of every bad row named by `issues`."""
    found: list[_Found] = []
    for rows, msg, cause, *fix in issues:
        lines = block.lines(rows)
        found += [(int(ln), msg(int(r)), cause, functools.partial(fix[0], int(r)) if fix else None)
                  for r, ln in zip(rows, lines, strict=True)]
    return found


def _blocks(path: Path, layout: Layout, block_size: int,
            hasher: hashlib._Hash | None) -> Iterator[Block]:
    if layout.parquet:
        rows = max(1024, block_size // 256)
        return iter_parquet_blocks(path, layout.types(), rows)
    return prefetch(iter_text_blocks(path, layout.text, list(layout.columns), layout.types(),
                                     block_size, hasher, layout.hint))


def decoded_blocks(path: Path, layout: Layout, block_size: int, bad: BadLines,
                   hasher: hashlib._Hash | None, pool: ThreadPoolExecutor) -> Iterator[DecodedBlock]:
    """Decoded blocks of one file, bad lines reported or dropped (and recorded)."""
    for block in _blocks(path, layout, block_size, hasher):
        dec, found = _decode(block, layout, pool)
        found = [(ln, p, c, None) for ln, p, c in block.bad] + found
        if found:
            bad.take(block, found)  # raises unless --on-bad-line skip
            # Drop the bad rows (the parser already dropped the wrong-length lines).
            bad_lines = np.array(sorted({ln for ln, *_ in found}), dtype=np.int64)
            lines = block.lines(np.arange(block.table.num_rows))
            keep = ~np.isin(lines, bad_lines)
            block = Block(block.table.filter(pa.array(keep)), block.path, block.first_line,
                          lines[keep], unit=block.unit)
            dec, again = _decode(block, layout, pool)
            if again:  # cannot happen: every bad row was dropped
                raise DataError(f"{block.where(again[0][0])}: {again[0][1]}")
        yield dec
