"""Input layouts: which columns of Criteo, Avazu or a user's CSV/Parquet become what.

A layout maps input columns to the label, the dense features and the categorical tables,
and says which pyarrow type each column is parsed as (numbers typed so that pyarrow's
parser validates them; categorical values as raw bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
        return (self.label, self.dense, tuple((c.name, c.kind) for c in self.cats))


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
    return Layout(fmt, tuple(header), AVAZU_LABEL, (), False, tuple(cats), other_sep="")


def csv_layout(path: Path, sep: str, label: str, categorical: tuple[str, ...],
               dense: tuple[str, ...]) -> Layout:
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
    for opt, names in (("--label", [label]), ("--categorical", categorical), ("--dense", dense)):
        for n in names:
            if n not in header:
                raise ConfigError(f"{opt}: column {n!r} not in {path} {where} "
                                  f"(columns: {', '.join(header)})")
    return Layout(
        fmt, tuple(header), label, tuple(dense), False,
        tuple(CatSpec(c, c, "str") for c in categorical), parquet=parquet,
    )
