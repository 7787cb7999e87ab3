"""`bagpipe preprocess`: raw click logs -> a dataset directory, streaming.

Stages, per block of input lines (a block is parsed in a background thread while the
previous one is encoded):

1. parse (`reader`): pyarrow's CSV parser, numbers typed so it validates them;
2. decode (`decoder`): label and dense checks and transform, per-table dictionary
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
the input size. What the dataset records about its encoding is written by `manifest`;
what its rows hold (label classes, dense ranges: `manifest.Observed`) is gathered as the
blocks pass, for meta.json and the result's warnings (the library never prints).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bagpipe_cli.data.checks import NPY_HEADER
from bagpipe_cli.data.format import META_FILE, DatasetMeta, TableSpec, sparse_file
from bagpipe_cli.data.preprocess.config import PreprocessConfig
from bagpipe_cli.data.preprocess.decoder import BadLines, CatColumn, DecodedBlock, decoded_blocks
from bagpipe_cli.data.preprocess.layout import Layout, avazu_layout, criteo_layout, csv_layout
from bagpipe_cli.data.preprocess.manifest import (
    Observed,
    dataset_warnings,
    load_saved_vocabs,
    write_meta,
)
from bagpipe_cli.data.preprocess.sniff import check_text, is_parquet
from bagpipe_cli.data.preprocess.vocab import Vocab, VocabCounter, hash_bucket
from bagpipe_cli.data.writer import DatasetWriter
from bagpipe_cli.errors import DataError
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.files.outputs import check_output_dir

Progress = Callable[[str, "int | None"], AbstractContextManager[Callable[[int], None]]]


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
    # For the user (the CLI prints them): one class of label, most rows dropped, constant
    # dense features (`manifest.dataset_warnings`).
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.meta.rows

    @property
    def rows_per_second(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


@dataclass
class _Inputs:
    """What a pass over the input files needs, shared by both kinds of pass."""

    cfg: PreprocessConfig
    layouts: list[Layout]  # per input file
    bad: BadLines  # bad lines so far, over all files
    hashers: list  # per file: sha256 of its bytes as they are read (None: hashed at the end)
    pool: ThreadPoolExecutor  # two threads for a block's tables and dense columns
    seen: Observed = field(default_factory=Observed)  # what the blocks so far hold

    def files(self) -> Iterator[tuple[Path, Iterator[DecodedBlock]]]:
        """Each input file and its decoded blocks, bad lines reported or dropped."""
        for path, lay, h in zip(self.cfg.inputs, self.layouts, self.hashers, strict=True):
            yield path, self._observed(decoded_blocks(path, lay, self.cfg.block_size, self.bad,
                                                      h, self.pool))

    def _observed(self, blocks: Iterator[DecodedBlock]) -> Iterator[DecodedBlock]:
        for dec in blocks:
            self.seen.add(dec)
            yield dec


def _layouts(cfg: PreprocessConfig) -> list[Layout]:
    out = []
    thr = cfg.threshold
    for p in cfg.inputs:
        if not is_parquet(p):
            check_text(p)  # a zstd file or binary junk is named as such, not parsed
        if cfg.format == "criteo":
            lay = criteo_layout(cfg.label is not None)
        elif cfg.format == "avazu":
            lay = avazu_layout(p, cfg.hour)
        else:
            lay = csv_layout(p, cfg.sep, cfg.label or "", cfg.categorical, cfg.dense,
                             "--label-threshold" if thr else "--label")
        out.append(replace(lay, threshold=thr))
    for p, lay in zip(cfg.inputs[1:], out[1:], strict=True):
        if lay.signature() != out[0].signature():
            raise DataError(f"{p}: its columns differ from those of {cfg.inputs[0]}; all inputs "
                            "must have the same layout")
    return out


def _no_progress(_phase: str, _total: int | None) -> AbstractContextManager[Callable[[int], None]]:
    return contextlib.nullcontext(lambda n: None)


def _remap_in_place(path: Path, vocab: Vocab, chunk: int = 1 << 20) -> str:
    """Rewrite a table's insertion ids as final ids; returns the sha256 of the new data."""
    lut = np.append(vocab.remap, 0).astype(np.int32)  # index -1 (missing) -> 0
    h = hashlib.sha256()
    with open(path, "r+b") as f:
        with NPY_HEADER:  # the tables are remapped by several threads
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
    bad = BadLines(cfg.on_bad_line)
    hashers = [None if lay.parquet else hashlib.sha256() for lay in layouts]
    vocabs: list[Vocab] | None = None
    hash_rows = cfg.max_rows_per_table
    if cfg.mode == "vocab-from":
        vocabs, hash_rows = load_saved_vocabs(cfg, layouts[0])

    with atomic_dir(out, overwrite) as tmp, ThreadPoolExecutor(2) as pool:
        inputs = _Inputs(cfg, layouts, bad, hashers, pool)
        if cfg.mode == "vocab":
            meta, vocabs = _count_then_remap(inputs, tmp, progress)
        else:
            meta = _encode_once(inputs, tmp, progress, vocabs, hash_rows)
        if meta.rows == 0:  # raised inside atomic_dir: nothing is written
            raise DataError(_no_rows(cfg, bad))
    specs = meta.tables
    stats = [TableStats(s.name, s.cardinality,
                        v.distinct if (v is not None and cfg.mode == "vocab") else None)
             for s, v in zip(specs, vocabs or [None] * len(specs), strict=True)]
    return PreprocessResult(meta, stats, bad.count, time.perf_counter() - t0,
                            dataset_warnings(layouts[0], inputs.seen, bad))


def _count_then_remap(inputs: _Inputs, tmp: Path,
                      progress: Progress) -> tuple[DatasetMeta, list[Vocab]]:
    """Both passes of the "vocab" mode; returns the final meta and the vocabularies."""
    lay0 = inputs.layouts[0]
    # Pass 1 writes the final dense features and labels, and per table each row's
    # insertion id (-1 = missing) as a placeholder int32 column.
    placeholder = [TableSpec(c.name, 2**31 - 1) for c in lay0.cats]
    w = DatasetWriter(tmp, placeholder, list(lay0.dense), lay0.label)
    for aw in w._sparse:  # their checksums are those of the final ids, from pass 2
        aw.sha = _NoHash()  # type: ignore[assignment]
    try:
        vocabs, files = _count_pass(inputs, w, progress)
        specs = [TableSpec(c.name, v.cardinality) for c, v in zip(lay0.cats, vocabs, strict=True)]
        meta = write_meta(inputs.cfg, w, tmp, lay0, vocabs, None, files, inputs.bad, inputs.hashers,
                          inputs.seen)
    except BaseException:
        w.abort()
        raise
    return _remap_pass(tmp, meta, specs, vocabs, inputs.pool, progress), vocabs


def _count_pass(inputs: _Inputs, w: DatasetWriter,
                progress: Progress) -> tuple[list[Vocab], list[dict[str, Any]]]:
    """Pass 1: count every table and write each block; returns the vocabularies and files."""
    counters = [VocabCounter(c.name, c.vocab_kind) for c in inputs.layouts[0].cats]
    files: list[dict[str, Any]] = []
    rows = 0
    # Writes (and their checksums) run in their own thread, in order, one block
    # behind, while the next block is decoded.
    with progress("read", None) as advance, ThreadPoolExecutor(1) as writer:
        pending = None
        for path, blocks in inputs.files():
            start = rows
            for dec in blocks:
                ins = list(inputs.pool.map(_count, counters, dec.cats))
                if pending is not None:
                    pending.result()
                pending = writer.submit(w.write, dec.dense, ins, dec.labels)
                rows += dec.n
                advance(dec.n)
            files.append(_file_entry(path, start, rows, inputs.bad))
        if pending is not None:
            pending.result()
    vocabs = []
    for i, c in enumerate(counters):  # one at a time: a counter's memory goes as we go
        vocabs.append(c.finish(inputs.cfg.min_count))
        vocabs[-1].index = None  # the ids on disk are insertion ids: `remap` is enough
        counters[i] = None  # type: ignore[call-overload]
    return vocabs, files


def _remap_pass(tmp: Path, meta: DatasetMeta, specs: list[TableSpec], vocabs: list[Vocab],
                pool: ThreadPoolExecutor, progress: Progress) -> DatasetMeta:
    """Pass 2: insertion ids -> final ids, in place, a table per thread; rewrites meta.json."""
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
    return meta


def _encode_once(inputs: _Inputs, tmp: Path, progress: Progress, vocabs: list[Vocab] | None,
                 hash_rows: int | None) -> DatasetMeta:
    """The single pass of `--max-rows-per-table` / `--vocab-from`: ids are final at once."""
    lay0 = inputs.layouts[0]
    if vocabs is not None:
        specs = [TableSpec(c.name, v.cardinality) for c, v in zip(lay0.cats, vocabs, strict=True)]
    else:
        assert hash_rows is not None
        specs = [TableSpec(c.name, hash_rows) for c in lay0.cats]
    w = DatasetWriter(tmp, specs, list(lay0.dense), lay0.label)
    files: list[dict[str, Any]] = []
    try:
        with progress("encode", None) as advance:
            for path, blocks in inputs.files():
                start = w.rows
                for dec in blocks:
                    sparse = list(inputs.pool.map(
                        lambda t, cat: _encode(cat, vocabs[t] if vocabs else None, hash_rows,
                                               specs[t].dtype),
                        range(len(specs)), dec.cats))
                    w.write(dec.dense, sparse, dec.labels)
                    advance(dec.n)
                files.append(_file_entry(path, start, w.rows, inputs.bad))
        return write_meta(inputs.cfg, w, tmp, lay0, vocabs, hash_rows, files, inputs.bad,
                          inputs.hashers, inputs.seen)
    except BaseException:
        w.abort()
        raise


def _count(counter: VocabCounter, cat: CatColumn) -> np.ndarray:
    """Count one table's block; returns each row's insertion id (-1 for missing)."""
    counts = np.bincount(cat.codes, minlength=len(cat.keys))
    ids = np.full(len(cat.keys), -1, np.int32)
    ids[cat.valid] = counter.add(cat.keys[cat.valid], counts[cat.valid], cat.values)
    return ids[cat.codes]


def _encode(cat: CatColumn, vocab: Vocab | None, hash_rows: int | None, dtype: np.dtype) -> np.ndarray:
    """Final ids of one table's block, by vocabulary or by hashing."""
    ids = vocab.ids(cat.keys) if vocab is not None else hash_bucket(cat.keys, hash_rows)  # type: ignore[arg-type]
    ids[~cat.valid] = 0
    return ids.astype(dtype)[cat.codes]


def _no_rows(cfg: PreprocessConfig, bad: BadLines) -> str:
    """Why a dataset of 0 rows is not written."""
    names = ", ".join(map(str, cfg.inputs))
    if not bad.count:
        return f"{names}: no data rows; nothing was written"
    first = bad.first[0]
    where = f"{first['file']}:{first['line']}" if "line" in first else f"{first['file']}: row {first['row']}"
    return (f"{names}: every one of the {bad.count:,} data lines was bad (the first: {where}: "
            f"{first['problem']}); a dataset of 0 rows was not written")


def _file_entry(path: Path, start: int, stop: int, bad: BadLines) -> dict[str, Any]:
    return {"path": str(path), "rows": stop - start, "start": start, "stop": stop,
            "bad_lines": bad.per_file.get(str(path), 0)}
