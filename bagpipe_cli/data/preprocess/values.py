"""Numbers read from parsed columns, and values shown in messages.

`numbers` turns a label or dense column (typed by the parser, or raw text on the slow
path) into float64 values with masks of the bad (not a number) and missing (empty) rows;
a value written `nan` or `inf`, or one beyond a float64 (1e400), is neither: the caller
decides. `not_finite` says why such a value cannot be used; `fmt_value` shows a value in
a message, cut short when it is long. `threshold_label` derives 0/1 labels from a numeric
column (`--label-threshold`), and `threshold_hint` suggests one for a label that is not 0/1.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bagpipe_cli.data.preprocess.layout import LabelThreshold, shown_number

_SHOWN = 40  # characters of a bad value a message shows


def fmt_value(v: Any) -> str:
    """A value as a message shows it: quoted text, an integral float as an integer."""
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and len(v) > _SHOWN:  # a message stays one readable line
        return f"{v[: _SHOWN // 2]!r}...({len(v):,} characters)"
    return repr(v)


_INT_RE = r"^\s*[+-]?[0-9]+\s*$"
_FLOAT_RE = r"^\s*[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))\s*$"
_NAMED_NON_FINITE = re.compile(r"^\s*[+-]?(inf|infinity|nan)\s*$", re.IGNORECASE)


def numbers(col: pa.ChunkedArray, integer: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, bad mask, missing mask) of a numeric column.

    Missing is an empty field (null); its value is NaN. A value written as `nan` is NaN but
    not missing, and `inf` or a number beyond a float64 (1e400) is infinite: the callers
    decide what those mean. A typed column was validated by the parser; a text column (the
    slow path, after a value that did not convert) is checked here, vectorised.
    """
    missing = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else np.zeros(len(col), bool)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        vals = pc.cast(col, pa.float64(), safe=False).to_numpy()  # nulls -> NaN; |x| > 2^53 rounds
        return vals, np.zeros(len(vals), bool), missing
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    arr = pc.cast(arr, pa.binary())
    ok = pc.fill_null(pc.match_substring_regex(arr, _INT_RE if integer else _FLOAT_RE), True)
    bad = ~ok.to_numpy(zero_copy_only=False)
    clean = pc.if_else(ok, arr, pa.scalar(b"0", pa.binary()))
    text = pc.replace_substring_regex(pc.utf8_trim_whitespace(pc.cast(clean, pa.string())), r"^\+", "")
    vals = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    vals = np.where(bad, np.nan, vals)
    return vals, bad, missing


def not_finite(name: str, col: pa.ChunkedArray, r: int) -> str:
    """Why value `r` of numeric column `name`, which is inf or NaN, cannot be used."""
    v = col[r].as_py()
    if isinstance(v, bytes | str):  # as written in a text file
        text = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        if not _NAMED_NON_FINITE.match(text):  # digits that overflow: 1e400
            return (f"{name} = {fmt_value(text.strip())} is beyond the range of a 64-bit float "
                    "(about 1.8e308)")
        return f"{name} = {text.strip()!r} is not a finite number; an empty field is a missing value"
    return f"{name} = {v!r} is not a finite number; a null is a missing value"


def threshold_label(thr: LabelThreshold, raw: pa.ChunkedArray, vals: np.ndarray, bad: np.ndarray,
                    missing: np.ndarray,
                    issues: list[tuple[np.ndarray, Callable[[int], str], str]]) -> np.ndarray:
    """The 0/1 labels `thr` derives from its column (`numbers(raw)`: vals, bad, missing); a
    value that is not a finite number is an issue, like a dense one (missing: the caller's)."""
    name = thr.column
    if bad.any():
        issues.append((np.flatnonzero(bad), lambda r: (f"{name} = {fmt_value(raw[r].as_py())} is "
                                                        "not a number"), f"{name}: not a number"))
    inf_or_nan = ~bad & ~missing & ~np.isfinite(vals)
    if inf_or_nan.any():
        issues.append((np.flatnonzero(inf_or_nan), lambda r: not_finite(name, raw, r),
                       f"{name}: not finite"))
    with np.errstate(invalid="ignore"):
        holds = thr.apply(vals)
    return np.where(bad | missing | inf_or_nan, False, holds).astype(np.float32)


def threshold_hint(name: str, v: float) -> str | None:
    """How a label value `v` that is not 0 or 1 becomes one: a --label-threshold on its column
    (None for a value that is not a finite number)."""
    if not math.isfinite(v):
        return None
    expr = f"{name}>0" if v < 0 else f"{name}>={shown_number(v)}"
    return f"derive a 0/1 label with --label-threshold {shlex.quote(expr)}"
