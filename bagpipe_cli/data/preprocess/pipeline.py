"""`bagpipe preprocess`: raw click logs -> a dataset directory, streaming.

Stages, per block of input lines (a block is parsed in a background thread while the
previous one is encoded):

1. parse (`reader`): pyarrow's CSV parser, numbers typed so it validates them;
2. decode (`_decode`): label and dense checks and transform, per-table dictionary
   encoding of the block's categorical values and their keys (`vocab`); bad lines are
   found here by vectorised checks and either reported (`FILE:LINE: problem`) or dropped;
3. pass 1 over the input (count + write): add each table's per-block value counts to a
   `VocabCounter`, and write the block's dense features, labels and each value's
   first-appearance number (a provisional id) to a `DatasetWriter` inside an atomic
   output directory;
4. pass 2 over the written id columns (`_remap_in_place`): once the counts are complete,
   rewrite every provisional id as its popularity id (or 0 below `--min-count`) and
   checksum the final arrays.

The input is parsed once. With `--max-rows-per-table` or `--vocab-from` ids are final in
pass 1 and pass 2 is skipped. Memory is the vocabularies plus a block or two, whatever
the input size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bagpipe_cli.data.format import (
    META_FILE,
    DatasetMeta,
    DatasetWriter,
    TableSpec,
    read_meta,
    sparse_file,
)
from bagpipe_cli.data.preprocess.layout import (
    CatSpec,
    Layout,
    avazu_layout,
    criteo_layout,
    csv_layout,
)
from bagpipe_cli.data.preprocess.reader import (
    Block,
    file_sha256,
    is_parquet,
    iter_parquet_blocks,
    iter_text_blocks,
    prefetch,
)
from bagpipe_cli.data.preprocess.vocab import Vocab, VocabCounter, hash_bucket, hex_bad, value_keys
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.io import atomic_dir, check_output_dir

FORMATS = ("criteo", "avazu", "csv")
VOCAB_DIR = "vocab"
DENSE_TRANSFORM = "log(1 + max(x, 0)); missing or non-finite -> 0"
HASH_RULE = "id = 1 + splitmix64(key) mod (R - 1); key: hex value (Criteo) or SipHash of the value"
_BAD_LINES_KEPT = 10
_DAYS = np.array(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], dtype=object)
_HOURS = np.array([f"{h:02d}" for h in range(24)], dtype=object)

Progress = Callable[[str, "int | None"], AbstractContextManager[Callable[[int], None]]]


@dataclass(frozen=True)
class PreprocessConfig:
    """What `bagpipe preprocess` reads and how it encodes it."""

    format: str  # "criteo", "avazu" or "csv" (csv also reads .parquet)
    inputs: tuple[Path, ...]  # input files, read in this order (.gz is decompressed)
    label: str | None = "label"  # label column (csv); criteo: "label" or None for --no-label
    categorical: tuple[str, ...] = ()  # csv: categorical columns
    dense: tuple[str, ...] = ()  # csv: dense (numeric) columns
    sep: str = ","  # csv: field separator
    hour: str = "split"  # avazu: "split" hour into hour_of_day + day_of_week, or "keep" it
    min_count: int = 1  # values seen fewer times map to id 0
    max_rows_per_table: int | None = None  # hash values into this many ids instead of a vocabulary
    vocab_from: Path | None = None  # reuse the vocabularies (or hashing) of this dataset
    on_bad_line: str = "error"  # "error": stop at the first bad line; "skip": drop and count
    block_size: int = 16 << 20  # bytes of input per block (memory is a few blocks)
    name: str = ""  # dataset name in meta.json

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(Path(p) for p in self.inputs))
        if self.format not in FORMATS:
            raise ConfigError(f"format {self.format!r}: choose one of {', '.join(FORMATS)}")
        if not self.inputs:
            raise ConfigError("INPUT: give at least one input file")
        for p in self.inputs:
            if not p.exists():
                raise ConfigError(f"INPUT {p}: no such file")
            if not p.is_file():
                raise ConfigError(f"INPUT {p}: not a file")
        if self.format == "csv":
            if not self.label:
                raise ConfigError("--label: give the label column")
            if not self.categorical:
                raise ConfigError("--categorical: give at least one categorical column")
            cols = [self.label, *self.categorical, *self.dense]
            dup = sorted({c for c in cols if cols.count(c) > 1})
            if dup:
                raise ConfigError(f"--categorical/--dense/--label: column(s) {', '.join(dup)} "
                                  "given more than once")
            if len(self.sep) != 1:
                raise ConfigError(f"--sep must be one character (got {self.sep!r})")
        elif any(is_parquet(p) for p in self.inputs):
            raise ConfigError(f"INPUT: Parquet input needs `bagpipe preprocess csv`, not {self.format}")
        if self.hour not in ("split", "keep"):
            raise ConfigError(f"--hour {self.hour!r}: choose split or keep")
        if self.min_count < 1:
            raise ConfigError(f"--min-count must be >= 1 (got {self.min_count})")
        if self.max_rows_per_table is not None and self.max_rows_per_table < 2:
            raise ConfigError("--max-rows-per-table must be >= 2 (id 0 is reserved for missing)")
        if self.vocab_from is not None:
            object.__setattr__(self, "vocab_from", Path(self.vocab_from))
            if self.min_count != 1:
                raise ConfigError("--min-count cannot be combined with --vocab-from "
                                  "(the saved vocabulary already fixes the ids)")
            if self.max_rows_per_table is not None:
                raise ConfigError("--max-rows-per-table cannot be combined with --vocab-from")
        if self.on_bad_line not in ("error", "skip"):
            raise ConfigError(f"--on-bad-line {self.on_bad_line!r}: choose error or skip")
        if self.block_size < 1024:
            raise ConfigError(f"--block-mb is too small ({self.block_size} bytes; at least 1 KiB)")

    @property
    def mode(self) -> str:
        """How ids are assigned: "vocab" (count then encode), "hash" or "vocab-from"."""
        if self.vocab_from is not None:
            return "vocab-from"
        return "hash" if self.max_rows_per_table is not None else "vocab"


@dataclass
class TableStats:
    """One table of the result."""

    name: str
    cardinality: int
    distinct: int | None  # distinct values seen while counting (None when not counted)


@dataclass
class PreprocessResult:
    """What `preprocess` produced."""

    meta: DatasetMeta
    tables: list[TableStats]
    bad_lines: int
    seconds: float

    @property
    def rows(self) -> int:
        return self.meta.rows

    @property
    def rows_per_second(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


# --------------------------------------------------------------------------- bad lines


@dataclass
class _BadLines:
    """Bad input lines: the first one is an error, or (skip) all are counted."""

    mode: str
    count: int = 0
    first: list[dict[str, Any]] = field(default_factory=list)
    per_file: dict[str, int] = field(default_factory=dict)

    def take(self, block: Block, found: list[tuple[int, str]]) -> None:
        """Handle (line, problem) pairs of one block: raise, or record them."""
        if not found:
            return
        found.sort(key=lambda x: x[0])
        if self.mode == "error":
            line, problem = found[0]
            raise DataError(f"{block.where(line)}: {problem} (pass --on-bad-line skip to skip "
                            "bad lines)")
        self.count += len(found)
        key = str(block.path)
        self.per_file[key] = self.per_file.get(key, 0) + len(found)
        for line, problem in found[: max(0, _BAD_LINES_KEPT - len(self.first))]:
            self.first.append({"file": key, block.unit: line, "problem": problem})


# --------------------------------------------------------------------------- decoding


@dataclass
class _Cat:
    """One table's values in a block, factorised."""

    codes: np.ndarray  # per row: index into keys
    keys: np.ndarray  # distinct keys of the block, in order of first appearance
    valid: np.ndarray  # per key: False for the entry that stands for a missing value
    values: pa.Array | None  # the valid keys' values (None: the keys are the values)


@dataclass
class _Decoded:
    n: int
    labels: np.ndarray | None
    dense: np.ndarray
    cats: list[_Cat]


# An issue: bad row positions and how to describe one of them.
_Issue = tuple[np.ndarray, Callable[[int], str]]


def _fmt_value(v: Any) -> str:
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return repr(v)


_INT_RE = r"^\s*[+-]?[0-9]+\s*$"
_FLOAT_RE = r"^\s*[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))\s*$"


def _numbers(col: pa.ChunkedArray, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with NaN for missing, bad mask) of a numeric column.

    A typed column was validated by the parser; a text column (the slow path, after a
    value that did not convert) is checked here, vectorised.
    """
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        vals = pc.cast(col, pa.float64()).to_numpy()  # nulls -> NaN
        return vals, np.zeros(len(vals), bool)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = pc.cast(arr, pa.binary())
    ok = pc.fill_null(pc.match_substring_regex(arr, _INT_RE if integer else _FLOAT_RE), True)
    bad = ~ok.to_numpy(zero_copy_only=False)
    clean = pc.if_else(ok, arr, pa.scalar(b"0", pa.binary()))
    text = pc.replace_substring_regex(pc.utf8_trim_whitespace(pc.cast(clean, pa.string())), r"^\+", "")
    vals = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    vals = np.where(bad, np.nan, vals)
    return vals, bad


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


def _cat(spec: CatSpec, col: pa.ChunkedArray) -> tuple[_Cat | None, _Issue | None]:
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
        return None, (rows, lambda r: (f"{spec.name} = {_fmt_value(col[int(r)].as_py())} is not "
                                       "a hexadecimal value of 1-8 digits"))
    return _Cat(codes, keys, valid, values), None


def _hour_parts(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Avazu `hour` (YYMMDDHH) -> (hour of day, day of week, missing, bad) per row."""
    vals, bad = _numbers(col, integer=True)
    missing = np.isnan(vals) & ~bad
    v = np.where(np.isnan(vals), 0, vals).astype(np.int64)
    hh = v % 100
    ymd = v // 100
    dates = pd.to_datetime(
        pd.DataFrame({"year": 2000 + ymd // 10000, "month": (ymd // 100) % 100, "day": ymd % 100}),
        errors="coerce",
    )
    dow = dates.dt.day_of_week.to_numpy(dtype=float, na_value=np.nan)
    bad |= ~missing & ((v < 0) | (v >= 10**8) | (hh > 23) | np.isnan(dow))
    dow = np.where(np.isnan(dow), 0, dow).astype(np.int64)
    return hh, dow, missing, bad


def _derived_cat(labels: np.ndarray, which: np.ndarray, missing: np.ndarray) -> pa.ChunkedArray:
    vals = labels[which].astype(object)
    vals[missing] = None
    return pa.chunked_array([pa.array(vals, pa.string())])


def _dense(name: str, col: pa.ChunkedArray, integer: bool) -> tuple[np.ndarray, _Issue | None]:
    """log(1 + max(x, 0)) of one dense column (missing -> 0), or its bad rows."""
    if pa.types.is_integer(col.type):  # the fast path: no NaN, float32 throughout
        x = np.maximum(pc.fill_null(col, 0).to_numpy(), 0).astype(np.float32)
        x += 1  # exact for integers: log(1 + x) == log1p(x) here, and log is vectorised
        return np.log(x, out=x), None
    vals, bad = _numbers(col, integer)
    issue = None
    if bad.any():
        kind = "an integer" if integer else "a number"
        issue = (np.flatnonzero(bad), lambda r: f"{name} = {_fmt_value(col[int(r)].as_py())} is not {kind}")
    with np.errstate(invalid="ignore"):
        vals = np.log1p(np.maximum(vals, 0.0))  # NaN (missing) stays NaN
    vals[~np.isfinite(vals)] = 0.0
    return vals.astype(np.float32), issue


def _label(layout: Layout, t: pa.Table, empty_rows: Callable[[], np.ndarray],
           issues: list[_Issue]) -> np.ndarray:
    name = layout.label
    raw = t.column(name)
    lab, bad = _numbers(raw, integer=False)
    missing = np.isnan(lab) & ~bad
    wrong = bad | (~missing & (lab != 0) & (lab != 1))
    if missing.any():
        empty = empty_rows()
        issues.append((np.flatnonzero(missing), lambda r: "empty line" if empty[r] else
                       f"missing label ({name})"))
    if wrong.any():
        issues.append((np.flatnonzero(wrong), lambda r: (
            f"{name} = {_fmt_value(raw[int(r)].as_py())} is not 0 or 1")))
    return np.where(np.isnan(lab), 0, lab).astype(np.float32)


def _decode(block: Block, layout: Layout,
            pool: ThreadPoolExecutor) -> tuple[_Decoded, list[tuple[int, str]]]:
    """Validate and transform one block; returns the decoded rows and its bad (line, problem)."""
    t = block.table
    n = t.num_rows
    issues: list[_Issue] = []
    all_null: list[np.ndarray] = []

    def empty_rows() -> np.ndarray:  # rows with every field empty: empty lines
        if not all_null:
            e = np.ones(n, bool)
            for c in t.columns:
                if c.null_count == 0:
                    e[:] = False
                    break
                e &= c.is_null().to_numpy(zero_copy_only=False)
            all_null.append(e)
        return all_null[0]

    # Tables and dense columns are independent: two threads (numpy/pandas/pyarrow release
    # the GIL) while the reader thread parses the next block.
    hour_cols = {c.column for c in layout.cats if c.kind in ("hour_of_day", "day_of_week")}
    hours = {c: pool.submit(_hour_parts, t.column(c)) for c in hour_cols}
    dense_jobs = [pool.submit(_dense, d, t.column(d), layout.dense_integer) for d in layout.dense]

    def cat_job(spec: CatSpec) -> tuple[_Cat | None, _Issue | None]:
        col = t.column(spec.column)
        if spec.kind in ("hour_of_day", "day_of_week"):
            hh, dow, missing, bad = hours[spec.column].result()
            col = (_derived_cat(_HOURS, hh, missing | bad) if spec.kind == "hour_of_day"
                   else _derived_cat(_DAYS, dow, missing | bad))
        return _cat(spec, col)

    cat_jobs = [pool.submit(cat_job, spec) for spec in layout.cats]
    labels = None
    if layout.label is not None:
        labels = _label(layout, t, empty_rows, issues)
    elif n and empty_rows().any():
        issues.append((np.flatnonzero(empty_rows()), lambda r: "empty line"))
    for c, job in hours.items():
        bad = job.result()[3]
        if bad.any():
            col = t.column(c)
            issues.append((np.flatnonzero(bad), lambda r, col=col, c=c: (
                f"{c} = {_fmt_value(col[int(r)].as_py())} is not YYMMDDHH")))
    dense = np.zeros((n, len(layout.dense)), np.float32)
    for j, job in enumerate(dense_jobs):
        dense[:, j], issue = job.result()
        if issue:
            issues.append(issue)
    cats = []
    for job in cat_jobs:
        cat, issue = job.result()
        if issue:
            issues.append(issue)
        else:
            cats.append(cat)

    found: list[tuple[int, str]] = []
    for rows, msg in issues:
        lines = block.lines(rows)
        found += [(int(ln), msg(int(r))) for r, ln in zip(rows, lines, strict=True)]
    return _Decoded(n, labels, dense, cats), found  # type: ignore[arg-type]


def _blocks(path: Path, layout: Layout, block_size: int,
            hasher: hashlib._Hash | None) -> Iterator[Block]:
    if layout.parquet:
        rows = max(1024, block_size // 256)
        return iter_parquet_blocks(path, layout.types(), rows)
    return prefetch(iter_text_blocks(path, layout.text, list(layout.columns), layout.types(),
                                     block_size, hasher, layout.field_hint))


def _decoded_blocks(path: Path, layout: Layout, cfg: PreprocessConfig, bad: _BadLines,
                    hasher: hashlib._Hash | None, pool: ThreadPoolExecutor) -> Iterator[_Decoded]:
    """Decoded blocks of one file, bad lines reported or dropped (and recorded)."""
    for block in _blocks(path, layout, cfg.block_size, hasher):
        dec, found = _decode(block, layout, pool)
        found = block.bad + found
        if found:
            bad.take(block, found)  # raises unless --on-bad-line skip
            # Drop the bad rows (the parser already dropped the wrong-length lines).
            bad_lines = np.array(sorted({ln for ln, _ in found}), dtype=np.int64)
            lines = block.lines(np.arange(block.table.num_rows))
            keep = ~np.isin(lines, bad_lines)
            block = Block(block.table.filter(pa.array(keep)), block.path, block.first_line,
                          lines[keep], unit=block.unit)
            dec, again = _decode(block, layout, pool)
            if again:  # cannot happen: every bad row was dropped
                raise DataError(f"{block.where(again[0][0])}: {again[0][1]}")
        yield dec


# --------------------------------------------------------------------------- the passes


def _layouts(cfg: PreprocessConfig) -> list[Layout]:
    out = []
    for p in cfg.inputs:
        if cfg.format == "criteo":
            out.append(criteo_layout(cfg.label is not None))
        elif cfg.format == "avazu":
            out.append(avazu_layout(p, cfg.hour))
        else:
            out.append(csv_layout(p, cfg.sep, cfg.label or "", cfg.categorical, cfg.dense))
    for p, lay in zip(cfg.inputs[1:], out[1:], strict=True):
        if lay.signature() != out[0].signature():
            raise DataError(f"{p}: its columns differ from those of {cfg.inputs[0]}; all inputs "
                            "must have the same layout")
    return out


def _load_vocabs(cfg: PreprocessConfig, layout: Layout) -> tuple[list[Vocab] | None, int | None]:
    """Vocabularies (or the hash size) saved in the --vocab-from dataset."""
    src = cfg.vocab_from
    assert src is not None
    meta = read_meta(src)
    enc = meta.extra.get("encoding") or {}
    if enc.get("mode") == "hash":
        return None, int(enc["max_rows_per_table"])
    saved = {t["name"]: t for t in (meta.extra.get("vocab") or {}).get("tables", [])}
    vocabs = []
    for spec in layout.cats:
        t = saved.get(spec.name)
        if t is None:
            raise ConfigError(f"--vocab-from {src}: no vocabulary for table {spec.name!r} "
                              f"(it has: {', '.join(saved) or 'none'})")
        if t.get("kind") != spec.vocab_kind:
            raise ConfigError(f"--vocab-from {src}: table {spec.name!r} holds {t.get('kind')} "
                              f"values, this input {spec.vocab_kind}")
        vocabs.append(Vocab.load(src / VOCAB_DIR / t["file"], spec.name, spec.vocab_kind))
    return vocabs, None


def load_vocab(dataset: Path | str, table: str | int) -> Vocab:
    """The saved vocabulary of one table (by name or position) of a preprocessed dataset."""
    dataset = Path(dataset)
    meta = read_meta(dataset)
    tables = (meta.extra.get("vocab") or {}).get("tables", [])
    if not tables:
        raise DataError(f"{dataset}: no saved vocabularies (hashed or not preprocessed)")
    found = [t for i, t in enumerate(tables) if table in (i, t["name"])]
    if not found:
        raise ConfigError(f"{dataset}: no table {table!r}")
    t = found[0]
    return Vocab.load(dataset / VOCAB_DIR / t["file"], t["name"], t["kind"])


def _no_progress(_phase: str, _total: int | None) -> AbstractContextManager[Callable[[int], None]]:
    return contextlib.nullcontext(lambda n: None)


def _remap_in_place(path: Path, vocab: Vocab, chunk: int = 1 << 20) -> str:
    """Rewrite a table's insertion ids as final ids; returns the sha256 of the new data."""
    lut = np.append(vocab.remap, 0).astype(np.int32)  # index -1 (missing) -> 0
    h = hashlib.sha256()
    with open(path, "r+b") as f:
        np.lib.format.read_magic(f)
        np.lib.format.read_array_header_1_0(f)
        pos = f.tell()
        while True:
            ins = np.fromfile(f, np.int32, chunk)
            if not len(ins):
                break
            ids = lut[ins]
            f.seek(pos)
            ids.tofile(f)
            pos = f.tell()
            h.update(ids.data.cast("B"))
    return h.hexdigest()


class _NoHash:
    """Stands in for a checksum that a later pass computes."""

    def update(self, _data: Any) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def preprocess(cfg: PreprocessConfig, out: Path, overwrite: bool = False,
               progress: Progress | None = None) -> PreprocessResult:
    """Turn `cfg.inputs` into a dataset at `out` (atomically); returns what was written.

    `progress(phase, total_rows)` is a context manager yielding `advance(rows)`. Phases:
    "read" (parse, check, count; total unknown) then "write" (remap to final ids), or a
    single "encode" with `--max-rows-per-table` / `--vocab-from`.
    """
    t0 = time.perf_counter()
    progress = progress or _no_progress
    out = Path(out)
    check_output_dir(out, overwrite)  # before reading anything: the first pass can be long
    layouts = _layouts(cfg)
    lay0 = layouts[0]
    bad = _BadLines(cfg.on_bad_line)
    hashers = [None if lay.parquet else hashlib.sha256() for lay in layouts]
    files: list[dict[str, Any]] = []
    vocabs: list[Vocab] | None = None
    hash_rows = cfg.max_rows_per_table
    if cfg.mode == "vocab-from":
        vocabs, hash_rows = _load_vocabs(cfg, lay0)

    with atomic_dir(out, overwrite) as tmp, ThreadPoolExecutor(2) as pool:
        if cfg.mode == "vocab":
            # Pass 1 writes the final dense features and labels, and per table each row's
            # insertion id (-1 = missing) as a placeholder int32 column.
            placeholder = [TableSpec(c.name, 2**31 - 1) for c in lay0.cats]
            w = DatasetWriter(tmp, placeholder, list(lay0.dense), lay0.label)
            for aw in w._sparse:  # their checksums are those of the final ids, from pass 2
                aw.sha = _NoHash()  # type: ignore[assignment]
            try:
                counters = [VocabCounter(c.name, c.vocab_kind) for c in lay0.cats]
                rows = 0
                # Writes (and their checksums) run in their own thread, in order, one block
                # behind, while the next block is decoded.
                with progress("read", None) as advance, ThreadPoolExecutor(1) as writer:
                    pending = None
                    for path, lay, h in zip(cfg.inputs, layouts, hashers, strict=True):
                        start = rows
                        for dec in _decoded_blocks(path, lay, cfg, bad, h, pool):
                            ins = list(pool.map(_count, counters, dec.cats))
                            if pending is not None:
                                pending.result()
                            pending = writer.submit(w.write, dec.dense, ins, dec.labels)
                            rows += dec.n
                            advance(dec.n)
                        files.append(_file_entry(path, start, rows, bad))
                    if pending is not None:
                        pending.result()
                vocabs = []
                for i, c in enumerate(counters):  # one at a time: a counter's memory goes as we go
                    vocabs.append(c.finish(cfg.min_count))
                    vocabs[-1].index = None  # the ids on disk are insertion ids: `remap` is enough
                    counters[i] = None  # type: ignore[call-overload]
                del counters
                specs = [TableSpec(c.name, v.cardinality) for c, v in zip(lay0.cats, vocabs, strict=True)]
                meta = _finish(cfg, w, tmp, lay0, vocabs, None, files, bad, hashers)
            except BaseException:
                w.abort()
                raise
            # Pass 2: insertion ids -> final ids, in place, a table per thread.
            with progress("write", meta.rows) as advance:
                sums = {}
                for t, digest in enumerate(pool.map(_remap_in_place, [tmp / sparse_file(t)
                                                    for t in range(len(specs))], vocabs)):
                    sums[sparse_file(t)] = digest
                    advance(meta.rows * (t + 1) // len(specs) - meta.rows * t // len(specs))
            meta = replace(meta, tables=specs, checksums={**meta.checksums, **sums})
            with open(tmp / META_FILE, "w") as f:
                json.dump(meta.to_json(), f, indent=2)
                f.write("\n")
        else:
            if vocabs is not None:
                specs = [TableSpec(c.name, v.cardinality) for c, v in zip(lay0.cats, vocabs, strict=True)]
            else:
                assert hash_rows is not None
                specs = [TableSpec(c.name, hash_rows) for c in lay0.cats]
            w = DatasetWriter(tmp, specs, list(lay0.dense), lay0.label)
            try:
                with progress("encode", None) as advance:
                    for path, lay, h in zip(cfg.inputs, layouts, hashers, strict=True):
                        start = w.rows
                        for dec in _decoded_blocks(path, lay, cfg, bad, h, pool):
                            sparse = list(pool.map(
                                lambda t, cat: _encode(cat, vocabs[t] if vocabs else None, hash_rows,
                                                       specs[t].dtype),
                                range(len(specs)), dec.cats))
                            w.write(dec.dense, sparse, dec.labels)
                            advance(dec.n)
                        files.append(_file_entry(path, start, w.rows, bad))
                meta = _finish(cfg, w, tmp, lay0, vocabs, hash_rows, files, bad, hashers)
            except BaseException:
                w.abort()
                raise
    stats = [TableStats(s.name, s.cardinality,
                        v.distinct if (v is not None and cfg.mode == "vocab") else None)
             for s, v in zip(specs, vocabs or [None] * len(specs), strict=True)]
    return PreprocessResult(meta, stats, bad.count, time.perf_counter() - t0)


def _count(counter: VocabCounter, cat: _Cat) -> np.ndarray:
    """Count one table's block; returns each row's insertion id (-1 for missing)."""
    counts = np.bincount(cat.codes, minlength=len(cat.keys))
    ids = np.full(len(cat.keys), -1, np.int32)
    ids[cat.valid] = counter.add(cat.keys[cat.valid], counts[cat.valid], cat.values)
    return ids[cat.codes]


def _encode(cat: _Cat, vocab: Vocab | None, hash_rows: int | None, dtype: np.dtype) -> np.ndarray:
    """Final ids of one table's block, by vocabulary or by hashing."""
    ids = vocab.ids(cat.keys) if vocab is not None else hash_bucket(cat.keys, hash_rows)  # type: ignore[arg-type]
    ids[~cat.valid] = 0
    return ids.astype(dtype)[cat.codes]


def _file_entry(path: Path, start: int, stop: int, bad: _BadLines) -> dict[str, Any]:
    return {"path": str(path), "rows": stop - start, "start": start, "stop": stop,
            "bad_lines": bad.per_file.get(str(path), 0)}


def _finish(cfg: PreprocessConfig, w: DatasetWriter, tmp: Path, layout: Layout,
            vocabs: list[Vocab] | None, hash_rows: int | None, files: list[dict[str, Any]],
            bad: _BadLines, hashers: list) -> DatasetMeta:
    """Save the vocabularies and write meta.json."""
    if vocabs is not None:
        (tmp / VOCAB_DIR).mkdir()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: vocabs[t].save(tmp / VOCAB_DIR / _vocab_file(t)),
                          range(len(vocabs))))
    return w.finish(name=cfg.name or _default_name(cfg), source=_source(cfg, hashers),
                    options=_options(cfg),
                    extra=_extra(cfg, layout, vocabs, hash_rows, files, bad))


def _vocab_file(t: int) -> str:
    return f"cat_{t:03d}.parquet"


def _default_name(cfg: PreprocessConfig) -> str:
    return f"{cfg.format}-{cfg.inputs[0].name.split('.')[0]}"


def _options(cfg: PreprocessConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["inputs"] = [str(p) for p in cfg.inputs]
    d["vocab_from"] = str(cfg.vocab_from) if cfg.vocab_from is not None else None
    d["categorical"] = list(cfg.categorical)
    d["dense"] = list(cfg.dense)
    return d


def _source(cfg: PreprocessConfig, hashers: list) -> dict[str, Any]:
    files = []
    for p, h in zip(cfg.inputs, hashers, strict=True):
        files.append({
            "path": str(p.resolve()),
            "bytes": os.path.getsize(p),
            "sha256": h.hexdigest() if h is not None else file_sha256(p),
        })
    return {"kind": "preprocess", "format": cfg.format, "files": files}


def _extra(cfg: PreprocessConfig, layout: Layout, vocabs: list[Vocab] | None, hash_rows: int | None,
           files: list[dict[str, Any]], bad: _BadLines) -> dict[str, Any]:
    tables = []
    for t, spec in enumerate(layout.cats):
        d: dict[str, Any] = {"name": spec.name, "column": spec.column, "kind": spec.vocab_kind}
        if spec.kind not in ("hex", "str"):
            d["derived"] = spec.kind
        if vocabs is not None:
            d.update(file=_vocab_file(t), size=len(vocabs[t].values))
            if cfg.mode == "vocab":
                d["distinct"] = vocabs[t].distinct
        tables.append(d)
    if vocabs is not None:
        encoding: dict[str, Any] = {
            "mode": cfg.mode, "order": "decreasing count, ties by first appearance",
            "min_count": cfg.min_count,
        }
        if cfg.vocab_from is not None:
            encoding["vocab_from"] = str(cfg.vocab_from)
    else:
        encoding = {"mode": "hash", "max_rows_per_table": hash_rows, "rule": HASH_RULE}
    extra: dict[str, Any] = {
        "encoding": encoding,
        "tables": tables,
        "dense_transform": DENSE_TRANSFORM,
        "files": files,
        "bad_lines": {"mode": cfg.on_bad_line, "count": bad.count, "first": bad.first},
    }
    if vocabs is not None:
        extra["vocab"] = {"dir": VOCAB_DIR, "row_to_id": "row i of a table's file has id i + 1; "
                          "id 0 is missing/unknown", "tables": tables}
    if cfg.format == "avazu":
        extra["hour"] = cfg.hour
    return extra
