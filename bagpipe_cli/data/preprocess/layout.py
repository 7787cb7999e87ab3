"""Input layouts: which columns of Criteo, Avazu or a user's CSV/Parquet become what.

A layout maps input columns to the label, the dense features and the categorical tables,
and says which pyarrow type each column is parsed as (numbers typed so that pyarrow's
parser validates them; categorical values as raw bytes). A label may be derived from its
column by a `LabelThreshold` (`--label-threshold 'rating>=4'`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bagpipe_cli.data.preprocess.sniff import TextFormat, is_parquet, read_header
from bagpipe_cli.errors import ConfigError, DataError

# Field separators a file may use instead of the expected one, as messages name them.
SEPARATORS = {"\t": "tabs", ",": "','", ";": "';'", "|": "'|'"}
CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_CATS = [f"C{i}" for i in range(1, 27)]
AVAZU_LABEL = "click"
AVAZU_ID = "id"
AVAZU_HOUR = "hour"
THRESHOLD_OPS = (">=", ">", "<=", "<", "==", "!=")  # two-character ones first: `>=` is not `>`
_COMPARE = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less,
            "==": np.equal, "!=": np.not_equal}
_NUMBER = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
# Greedy COLUMN: the operator is the one right before the number (`a<b>=4` is `a<b` >= 4).
_THRESHOLD = re.compile(rf"(?P<column>.*)(?P<op>{'|'.join(map(re.escape, THRESHOLD_OPS))})"
                        rf"\s*(?P<number>{_NUMBER})\s*", re.S)


def shown_number(v: float) -> str:
    """4.0 -> '4', 0.5 -> '0.5': a threshold as a user writes it."""
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


@dataclass(frozen=True)
class LabelThreshold:
    """A 0/1 label derived from a numeric column: 1 where `column op value` holds, else 0."""

    column: str
    op: str  # one of THRESHOLD_OPS
    value: float

    @classmethod
    def parse(cls, text: str) -> LabelThreshold:
        """'rating>=4' -> LabelThreshold('rating', '>=', 4.0); a ConfigError naming the option."""
        m = _THRESHOLD.fullmatch(text)
        column = m.group("column").strip() if m else ""
        if not m or not column or column[-1] in "<>=!":
            raise ConfigError(f"--label-threshold {text!r}: expected COLUMN OP NUMBER, OP one of "
                              f"{', '.join(THRESHOLD_OPS)} (e.g. 'rating>=4')")
        value = float(m.group("number"))
        if not math.isfinite(value):
            raise ConfigError(f"--label-threshold {text!r}: {m.group('number')} is beyond the range "
                              "of a 64-bit float; give a finite number")
        return cls(column, m.group("op"), value)

    def __str__(self) -> str:
        return f"{self.column}{self.op}{shown_number(self.value)}"

    @property
    def rule(self) -> str:
        return f"1 where {self.column} {self.op} {shown_number(self.value)}, else 0"

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Per value: whether the comparison holds."""
        return _COMPARE[self.op](x, self.value)


@dataclass(frozen=True)
class CatSpec:
    """One categorical table and where its values come from."""

    name: str  # table name in the dataset
    column: str  # input column
    kind: str  # "hex" (Criteo), "str", or a derived feature: "hour_of_day", "day_of_week"

    @property
    def vocab_kind(self) -> str:
        return "hex" if self.kind == "hex" else "str"


@dataclass(frozen=True)
class Layout:
    """Which columns of one input file are the label, dense features and tables."""

    text: TextFormat
    columns: tuple[str, ...]  # every column of the file, in order
    label: str | None
    dense: tuple[str, ...]
    dense_integer: bool  # dense values must be integers (Criteo)
    cats: tuple[CatSpec, ...]
    parquet: bool = False
    field_hints: tuple[tuple[int, str], ...] = ()  # (fields found, what it means) for messages
    other_sep: str = "pass --sep '{sep}'"  # what to do when lines use another separator
    threshold: LabelThreshold | None = None  # the label is derived from its column by this

    def types(self) -> dict[str, pa.DataType]:
        """pyarrow type of every column that is read."""
        t: dict[str, pa.DataType] = {}
        if self.label is not None:
            t[self.label] = pa.float64()
        for d in self.dense:
            t[d] = pa.int64() if self.dense_integer else pa.float64()
        for c in self.cats:
            if c.kind in ("hour_of_day", "day_of_week"):
                t[c.column] = pa.int64()
            elif c.kind == "hex":
                t[c.column] = pa.binary(8)  # fixed width: the 8 bytes are the key, no copy
            else:
                t[c.column] = pa.binary()
        return t

    def hint(self, found: int, text: str) -> str:
        """What a line of `found` fields (`text`) may mean, appended to its error message."""
        for n, why in self.field_hints:
            if n == found:
                return f" ({why})"
        own = self.text.delimiter
        other = next((sep for sep in SEPARATORS if sep != own and sep in text), None)
        if found == 1 and other is not None and self.other_sep:
            return (f" (it is separated by {SEPARATORS[other]}, not {SEPARATORS.get(own, repr(own))}; "
                    + self.other_sep.format(sep="\\t" if other == "\t" else other) + ")")
        return ""

    def signature(self) -> tuple:
        """What must agree between several input files."""
        return (self.label, str(self.threshold), self.dense,
                tuple((c.name, c.kind) for c in self.cats))


def criteo_layout(label: bool) -> Layout:
    cols = (["label"] if label else []) + CRITEO_DENSE + CRITEO_CATS
    hint = ((len(cols) - 1, "a file without labels, like Kaggle's test.txt, needs --no-label")
            if label else (len(cols) + 1, "a file with labels is read without --no-label"))
    return Layout(
        text=TextFormat(delimiter="\t", quoting=False, header=False),
        columns=tuple(cols),
        label="label" if label else None,
        dense=tuple(CRITEO_DENSE),
        dense_integer=True,
        cats=tuple(CatSpec(c, c, "hex") for c in CRITEO_CATS),
        field_hints=(hint,),
        other_sep="`bagpipe preprocess csv --sep '{sep}'` reads such a file",
    )


def avazu_layout(path: Path, hour: str) -> Layout:
    fmt = TextFormat(delimiter=",", quoting=True, header=True)
    header = read_header(path, fmt)
    for need in (AVAZU_LABEL, AVAZU_HOUR):
        if need not in header:
            raise DataError(f"{path}:1: no {need!r} column in the header; not an Avazu file "
                            f"(columns: {', '.join(header)})")
    cats: list[CatSpec] = []
    for c in header:
        if c in (AVAZU_ID, AVAZU_LABEL):
            continue
        if c == AVAZU_HOUR and hour == "split":
            cats += [CatSpec("hour_of_day", c, "hour_of_day"), CatSpec("day_of_week", c, "day_of_week")]
        else:
            cats.append(CatSpec(c, c, "str"))
    names = [c.name for c in cats]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a table is known by its name (meta.json, --save-model): one name, one table
        raise DataError(f"{path}:1: the header has a column {twice[0]!r} and --hour split "
                        f"derives a table of that name from {AVAZU_HOUR!r}; pass --hour keep "
                        "(one raw hour table), or rename the column")
    return Layout(fmt, tuple(header), AVAZU_LABEL, (), False, tuple(cats), other_sep="")


def csv_layout(path: Path, sep: str, label: str, categorical: tuple[str, ...],
               dense: tuple[str, ...], label_option: str = "--label") -> Layout:
    parquet = is_parquet(path)
    fmt = TextFormat(delimiter=sep, quoting=True, header=True)
    header = read_header(path, fmt)
    where = "schema" if parquet else "header"
    if not parquet and len(header) == 1:
        other = next((sep for sep in SEPARATORS if sep != fmt.delimiter and sep in header[0]), None)
        if other is not None:
            shown = "\\t" if other == "\t" else other
            raise ConfigError(f"--sep {sep!r}: the header of {path} has no {sep!r} but has "
                              f"{SEPARATORS[other]} ({header[0]!r}); pass --sep '{shown}'")
    for opt, names in ((label_option, [label]), ("--categorical", categorical), ("--dense", dense)):
        for n in names:
            if n not in header:
                raise ConfigError(f"{opt}: column {n!r} not in {path} {where} "
                                  f"(columns: {', '.join(header)})")
    return Layout(
        fmt, tuple(header), label, tuple(dense), False,
        tuple(CatSpec(c, c, "str") for c in categorical), parquet=parquet,
    )
