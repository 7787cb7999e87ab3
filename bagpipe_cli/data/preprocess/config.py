"""What `bagpipe preprocess` is asked to do: `PreprocessConfig`, validated on creation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from bagpipe_cli.data.preprocess.layout import AVAZU_LABEL, LabelThreshold
from bagpipe_cli.data.preprocess.sniff import is_parquet
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.limits import check_int, check_memory, check_table_rows

FORMATS = ("criteo", "avazu", "csv")
BLOCKS_IN_FLIGHT = 8  # input blocks' worth of memory a pass holds at once (raw, parsed, decoded)


def _check_roles(label: str, categorical: tuple[str, ...], dense: tuple[str, ...],
                 label_option: str = "--label") -> None:
    """Refuse a column named twice: in one option, in two, or as the label and a feature.

    A column is read once and means one thing; a second mention would become a second table
    (or feature) holding the same values, or feed the label to the model.
    """
    seen: dict[str, str] = {"": ""}
    for opt, names in ((label_option, (label,)), ("--categorical", categorical), ("--dense", dense)):
        for n in names:
            if n == "":
                raise ConfigError(f"{opt}: an empty column name (two commas in a row?)")
            if n in seen:
                where = f"twice in {opt}" if seen[n] == opt else f"to both {seen[n]} and {opt}"
                raise ConfigError(f"{opt}: column {n!r} is given {where}; a column is read once, "
                                  "as the label, a categorical or a dense feature")
            seen[n] = opt


@dataclass(frozen=True)
class PreprocessConfig:
    """What `bagpipe preprocess` reads and how it encodes it."""

    format: str  # "criteo", "avazu" or "csv" (csv also reads .parquet)
    inputs: tuple[Path, ...]  # input files, read in this order (.gz is decompressed)
    label: str | None = "label"  # label column (csv); criteo: "label" or None for --no-label
    # The label is 1 where "COLUMN OP NUMBER" holds (e.g. "rating>=4"), else 0; csv: COLUMN is
    # the label column (`label` None or the same), criteo/avazu: their label column only.
    label_threshold: str | None = None
    categorical: tuple[str, ...] = ()  # csv: categorical columns
    dense: tuple[str, ...] = ()  # csv: dense (numeric) columns
    sep: str = ","  # csv: field separator
    hour: str = "split"  # avazu: "split" hour into hour_of_day + day_of_week, or "keep" it
    min_count: int = 1  # values seen fewer times map to id 0
    max_rows_per_table: int | None = None  # hash values into this many ids instead of a vocabulary
    vocab_from: Path | None = None  # reuse the vocabularies (or hashing) of this dataset
    on_bad_line: str = "error"  # "error": stop at the first bad line; "skip": drop and count
    block_size: int = 16 << 20  # bytes of input per block (memory is a few blocks); MiB x 2^20
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
        self._check_threshold()
        if self.format == "csv":
            if not self.label:
                raise ConfigError("--label: give the label column, or derive a 0/1 label from a "
                                  "numeric column with --label-threshold (e.g. 'rating>=4')")
            if not self.categorical:
                raise ConfigError("--categorical: give at least one categorical column")
            _check_roles(self.label, self.categorical, self.dense,
                         "--label-threshold" if self.label_threshold else "--label")
            if len(self.sep) != 1:
                raise ConfigError(f"--sep must be one character (got {self.sep!r})")
            if self.sep in '"\r\n':
                raise ConfigError(f"--sep {self.sep!r}: a quote or a line break cannot separate "
                                  "fields")
        elif any(is_parquet(p) for p in self.inputs):
            raise ConfigError(f"INPUT: Parquet input needs `bagpipe preprocess csv`, not {self.format}")
        if self.hour not in ("split", "keep"):
            raise ConfigError(f"--hour {self.hour!r}: choose split or keep")
        check_int("--min-count", self.min_count, 1)
        check_int("--max-rows-per-table", self.max_rows_per_table, 2)
        if self.max_rows_per_table is not None:  # id 0 is reserved for missing values
            tables = len(self.categorical) if self.format == "csv" else 26 if self.format == "criteo" else 1
            check_table_rows(f"--max-rows-per-table {self.max_rows_per_table}", tables,
                             self.max_rows_per_table)
        if self.vocab_from is not None:
            object.__setattr__(self, "vocab_from", Path(self.vocab_from))
            if self.min_count != 1:
                raise ConfigError("--min-count cannot be combined with --vocab-from "
                                  "(the saved vocabulary already fixes the ids)")
            if self.max_rows_per_table is not None:
                raise ConfigError("--max-rows-per-table cannot be combined with --vocab-from")
        if self.on_bad_line not in ("error", "skip"):
            raise ConfigError(f"--on-bad-line {self.on_bad_line!r}: choose error or skip")
        self._check_block()

    def _check_threshold(self) -> None:
        """Parse --label-threshold (kept as written back: 'rating >= 4' -> 'rating>=4'); its
        column is the label column: csv's --label (given or implied), Criteo's or Avazu's own."""
        if self.label_threshold is None:
            return
        given = f"--label-threshold {self.label_threshold!r}"
        thr = LabelThreshold.parse(self.label_threshold)
        object.__setattr__(self, "label_threshold", str(thr))
        if self.format == "csv":
            if self.label and self.label != thr.column:
                raise ConfigError(f"{given} derives the label from column {thr.column!r}, but "
                                  f"--label is {self.label!r}; give one of them (the threshold's "
                                  "column is the label column)")
            object.__setattr__(self, "label", thr.column)
            return
        fixed = AVAZU_LABEL if self.format == "avazu" else "label"
        if self.label is None:
            raise ConfigError(f"{given} cannot be combined with --no-label: the files have no "
                              "label column to derive a label from")
        if thr.column != fixed:
            raise ConfigError(f"{given}: the label of {self.format} input is its {fixed!r} column; "
                              f"a threshold can only derive the label from it (e.g. '{fixed}>=1')")

    @property
    def threshold(self) -> LabelThreshold | None:
        """The parsed --label-threshold, or None."""
        return LabelThreshold.parse(self.label_threshold) if self.label_threshold else None

    def _check_block(self) -> None:
        """A block size in bytes (the command line gives MiB, maybe fractional) whose few
        blocks in flight fit this machine's memory."""
        mb = self.block_size / 2**20
        if not math.isfinite(self.block_size) or self.block_size < 1024:
            raise ConfigError(f"--block-mb {mb:g}: give at least 0.001 (1 KiB), a finite number")
        object.__setattr__(self, "block_size", int(self.block_size))
        # Read, parsed (pyarrow) and decoded copies of a block or two are in flight at once.
        check_memory(BLOCKS_IN_FLIGHT * self.block_size,
                     f"--block-mb {mb:g}: {BLOCKS_IN_FLIGHT} blocks in flight", "lower --block-mb")

    @property
    def mode(self) -> str:
        """How ids are assigned: "vocab" (count then encode), "hash" or "vocab-from"."""
        if self.vocab_from is not None:
            return "vocab-from"
        return "hash" if self.max_rows_per_table is not None else "vocab"
