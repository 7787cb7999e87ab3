"""What a preprocessed dataset records about its encoding, and reading it back.

`write_meta` saves the vocabularies (one Parquet file per table under `vocab/`) and
writes meta.json with the source files and their checksums, the options, and `extra`:
how ids were assigned, each table's column and vocabulary, the dense transform, how the
label was made (and its classes' counts) and the bad lines. `load_vocab` and
`--vocab-from` (`load_saved_vocabs`) read them back. `Observed` gathers what the written
rows hold, and `dataset_warnings` says what makes the dataset of little use.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bagpipe_cli.data.format import META_FILE, DatasetMeta, read_meta
from bagpipe_cli.data.preprocess.config import PreprocessConfig
from bagpipe_cli.data.preprocess.decoder import BadLines, DecodedBlock
from bagpipe_cli.data.preprocess.layout import Layout
from bagpipe_cli.data.preprocess.stream import file_sha256
from bagpipe_cli.data.preprocess.vocab import Vocab
from bagpipe_cli.data.writer import DatasetWriter
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.limits import check_table_rows

VOCAB_DIR = "vocab"
DENSE_TRANSFORM = ("log(1 + max(x, 0)); missing (empty) -> 0; a value that is not a finite number "
                   "(inf, nan, beyond a float64) is a bad line")
HASH_RULE = "id = 1 + splitmix64(key) mod (R - 1); key: hex value (Criteo) or SipHash of the value"


def load_saved_vocabs(cfg: PreprocessConfig, layout: Layout) -> tuple[list[Vocab] | None, int | None]:
    """Vocabularies (or the hash size) saved in the --vocab-from dataset."""
    src = cfg.vocab_from
    assert src is not None
    meta = read_meta(src)
    where = f"--vocab-from {src}: {src / META_FILE}"
    enc = meta.extra.get("encoding") or {}
    if not isinstance(enc, dict):
        raise DataError(f"{where}: extra.encoding must be a JSON object")
    if enc.get("mode") == "hash":
        rows = enc.get("max_rows_per_table")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 2:
            raise DataError(f"{where}: extra.encoding.max_rows_per_table must be an integer >= 2 "
                            f"(got {rows!r})")
        check_table_rows(f"--vocab-from {src} (its max_rows_per_table {rows})", len(layout.cats),
                         rows)
        return None, rows
    vocab = meta.extra.get("vocab") or {}
    tables = vocab.get("tables", []) if isinstance(vocab, dict) else None
    if not isinstance(tables, list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("file"), str)
            for t in tables):
        raise DataError(f"{where}: extra.vocab.tables must be a list of {{name, file, kind}}")
    saved = {t["name"]: t for t in tables}
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


@dataclass
class Observed:
    """What the rows written so far hold: label classes and each dense feature's range."""

    rows: int = 0
    ones: int = 0  # rows of label 1
    low: np.ndarray | None = None  # per dense feature: its smallest value after the transform
    high: np.ndarray | None = None  # ... and its largest

    def add(self, dec: DecodedBlock) -> None:
        self.rows += dec.n
        if dec.labels is not None:
            self.ones += int(np.count_nonzero(dec.labels))
        if dec.n and dec.dense.shape[1]:
            lo, hi = dec.dense.min(axis=0), dec.dense.max(axis=0)
            self.low = lo if self.low is None else np.minimum(self.low, lo)
            self.high = hi if self.high is None else np.maximum(self.high, hi)


def write_meta(cfg: PreprocessConfig, w: DatasetWriter, tmp: Path, layout: Layout,
            vocabs: list[Vocab] | None, hash_rows: int | None, files: list[dict[str, Any]],
            bad: BadLines, hashers: list, seen: Observed) -> DatasetMeta:
    """Save the vocabularies and write meta.json."""
    if vocabs is not None:
        (tmp / VOCAB_DIR).mkdir()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda t: vocabs[t].save(tmp / VOCAB_DIR / _vocab_file(t)),
                          range(len(vocabs))))
    return w.finish(name=cfg.name or _default_name(cfg), source=_source(cfg, hashers),
                    options=_options(cfg),
                    extra=_extra(cfg, layout, vocabs, hash_rows, files, bad, seen))


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
           files: list[dict[str, Any]], bad: BadLines, seen: Observed) -> dict[str, Any]:
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
        "bad_lines": {"mode": cfg.on_bad_line, "count": bad.count, "causes": bad.causes,
                      "first": bad.first},
    }
    if vocabs is not None:
        extra["vocab"] = {"dir": VOCAB_DIR, "row_to_id": "row i of a table's file has id i + 1; "
                          "id 0 is missing/unknown", "tables": tables}
    if layout.label is not None:
        thr = layout.threshold
        extra["label"] = {"column": layout.label, "threshold": str(thr) if thr else None,
                          "rule": thr.rule if thr else "the column's value, 0 or 1",
                          "rows_0": seen.rows - seen.ones, "rows_1": seen.ones}
    if cfg.format == "avazu":
        extra["hour"] = cfg.hour
    return extra


def dataset_warnings(layout: Layout, seen: Observed, bad: BadLines) -> list[str]:
    """What makes a finished dataset of little use, one line each: most input rows dropped as
    bad, a label of one class, dense features that are the same in every row."""
    out = []
    read = seen.rows + bad.count
    dropped = ""
    if bad.count:
        cause, n = max(bad.causes.items(), key=lambda kv: kv[1], default=("", 0))
        dropped = (f"--on-bad-line skip dropped {bad.count:,} of the {read:,} rows read "
                   f"({bad.count / read:.0%})" + (f", most for '{cause}' ({n:,})" if cause else ""))
    if bad.count * 2 > read:
        fix = ""
        if layout.label is not None and f"{layout.label}: not 0 or 1" in bad.causes:
            fix = (f"; to keep those rows, derive a 0/1 label with --label-threshold '{layout.label}>=T' "
                   f"(1 where {layout.label} >= T, else 0)")
        out.append(f"{dropped}; the dataset holds only the other {seen.rows:,}{fix}")
    if layout.label is not None and seen.ones in (0, seen.rows):
        thr = f", by --label-threshold '{layout.threshold}'" if layout.threshold else ""
        out.append(f"every one of the {seen.rows:,} rows has label {1 if seen.ones else 0}{thr}"
                   + (f", after {dropped}" if dropped else "") + ": with one class there is nothing to "
                   "learn and AUC is undefined, so training on it and its AUC are meaningless")
    if seen.low is not None and seen.high is not None:
        same = [f"{name!r} (always {float(lo):.4g}{': missing or <= 0' if lo == 0 else ''})"
                for name, lo, hi in zip(layout.dense, seen.low, seen.high, strict=True) if lo == hi]
        if same:
            one = len(same) == 1
            out.append(f"dense feature{'' if one else 's'} {', '.join(same)} "
                       f"{'is' if one else 'are'} constant after log(1 + max(x, 0)): "
                       f"{'it carries' if one else 'they carry'} nothing a model can learn from")
    return out
