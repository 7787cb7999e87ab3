"""Reading click logs in blocks with exact line numbers: delimited text (plain or .gz) and Parquet.

A text file is read in blocks of whole lines (`block_size` bytes of input, cut after the
last newline), and each block is parsed by `pyarrow.csv.read_csv` on all cores. Since a
block holds whole lines and pyarrow keeps empty lines (as all-null rows), row i of a block
is line `first_line + i` of the file: no per-line Python work is needed to know where a
row came from. Lines with the wrong number of fields are dropped by pyarrow's
`invalid_row_handler`; only then is the block searched for them to learn their line
numbers. A block whose numbers do not convert, or hold inf or nan, is parsed again with
those columns as raw bytes, and the caller validates them itself (the slow path, taken
only for bad input). What a file is, before it is read, is `sniff`'s to say.

The raw bytes are hashed (sha256) as they are read (`stream`), so a checksum costs no
extra read.
"""

from __future__ import annotations

import csv
import hashlib
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from bagpipe_cli.data.preprocess.sniff import MAX_LINE, TextFormat, one_line
from bagpipe_cli.data.preprocess.stream import InputStream
from bagpipe_cli.errors import DataError

_SUB_BLOCK = MAX_LINE  # pyarrow's own parallel parse unit (also the longest line allowed)


@dataclass
class Block:
    """Parsed rows of one block of an input file, with where each row came from."""

    table: pa.Table
    path: Path
    first_line: int  # 1-based line (or, for Parquet, row) number of the block's first line
    line_numbers: np.ndarray | None = None  # per row, when rows were dropped; else consecutive
    bad: list[tuple[int, str, str]] = field(default_factory=list)  # (line, problem, cause) the parser dropped
    unit: str = "line"  # "line" for text, "row" for Parquet

    def lines(self, rows: np.ndarray) -> np.ndarray:
        """Line numbers of row positions `rows`."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.line_numbers is not None:
            return self.line_numbers[rows]
        return self.first_line + rows

    def where(self, line: int) -> str:
        """`FILE:LINE` for text, `FILE: row N` for Parquet (for error messages)."""
        return f"{self.path}:{line}" if self.unit == "line" else f"{self.path}: row {line}"


def _raw_blocks(s: InputStream, block_size: int, skip_header: bool) -> Iterator[tuple[memoryview, int]]:
    """(whole lines, number of lines) from a stream; the header line is skipped.

    Each block is a fresh buffer that the parser reads in place (no copies of the text
    beyond the carried-over partial line).
    """
    carry = b""
    header_pending = skip_header
    while True:
        buf = bytearray(len(carry) + block_size)
        buf[: len(carry)] = carry
        n = s.readinto(memoryview(buf)[len(carry) :])
        if not n:
            break
        end = len(carry) + n
        begin = 0
        if header_pending:
            nl = buf.find(b"\n", 0, end)
            if nl < 0:
                carry = bytes(buf[:end])
                continue
            begin = nl + 1
            header_pending = False
        cut = buf.rfind(b"\n", begin, end)
        if cut < 0:
            carry = bytes(buf[begin:end])
            continue
        carry = bytes(buf[cut + 1 : end])
        if cut + 1 > begin:
            yield memoryview(buf)[begin : cut + 1], buf.count(b"\n", begin, cut + 1)
    if carry and not header_pending:
        yield memoryview(carry), carry.count(b"\n") + 1


def _locate(block: bytes, texts: list[str]) -> list[tuple[int, str]]:
    """(0-based line index, text) in `block` of the lines whose text is in `texts`, sorted."""
    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
    found: dict[int, str] = {}
    for text in sorted(set(texts)):
        t = text.encode("utf-8", "surrogateescape")
        start = 0
        while (off := block.find(t, start)) >= 0:
            start = off + 1
            end = off + len(t)
            if (off == 0 or block[off - 1] == 10) and (
                end == len(block) or block[end] == 10 or block[end : end + 2] == b"\r\n"
            ):
                found[int(np.searchsorted(nl, off))] = text
    return sorted(found.items())


def _quiet_undecodable_rows(u) -> None:
    # pyarrow decodes a bad row's text before it calls `on_invalid`; on invalid UTF-8 that
    # raises inside its callback machinery and is printed as an "ignored" traceback. The row
    # is then reported by read_csv as a parse error, so the traceback is only noise.
    if (isinstance(u.exc_value, UnicodeDecodeError)
            and getattr(u.object, "__qualname__", "") == "_parse.<locals>.on_invalid"):
        return
    _previous_unraisablehook(u)


_previous_unraisablehook = sys.unraisablehook
sys.unraisablehook = _quiet_undecodable_rows


def _parse(block: memoryview, names: list[str], types: dict[str, pa.DataType],
           fmt: TextFormat, expected: int) -> tuple[pa.Table, list[str]]:
    bad_texts: list[str] = []

    def on_invalid(row) -> str:
        bad_texts.append(row.text)
        return "skip"

    table = pcsv.read_csv(
        pa.BufferReader(pa.py_buffer(block)),
        read_options=pcsv.ReadOptions(column_names=names, block_size=_SUB_BLOCK, use_threads=True),
        parse_options=pcsv.ParseOptions(
            delimiter=fmt.delimiter, quote_char='"' if fmt.quoting else False,
            ignore_empty_lines=False, newlines_in_values=False, invalid_row_handler=on_invalid,
        ),
        convert_options=pcsv.ConvertOptions(
            column_types=types, include_columns=list(types), null_values=[""],
            strings_can_be_null=True, quoted_strings_can_be_null=True,
        ),
    )
    return table, bad_texts


def _fields(text: str, fmt: TextFormat) -> int:
    if fmt.quoting:
        try:
            return len(next(csv.reader([text], delimiter=fmt.delimiter)))
        except (csv.Error, StopIteration):
            return text.count(fmt.delimiter) + 1
    return text.count(fmt.delimiter) + 1


def _non_finite(table: pa.Table) -> bool:
    """Whether a float column the parser typed holds inf or NaN (a missing value is null)."""
    for col in table.columns:
        if pa.types.is_floating(col.type):
            finite = pc.sum(pc.is_finite(col)).as_py() or 0
            if finite + col.null_count != len(col):
                return True
    return False


def _unmatched_lines(block: bytes, first: int, path: Path, fmt: TextFormat, more_rows: bool) -> str:
    """Why the parser found another number of rows than a block has lines, at which line.

    More rows: a carriage return that is not part of a \\r\\n ends a row for the parser
    but not a line for us. Fewer: a quoted field holds a line break (two lines, one row).
    """
    lines = block.split(b"\n")
    if more_rows:
        for i, ln in enumerate(lines):
            if b"\r" in ln.rstrip(b"\r"):
                return (f"{path}:{first + i}: a carriage return (\\r) inside the line; lines must "
                        "end in \\n or \\r\\n (convert old Mac line endings)")
    elif fmt.quoting:
        for i, ln in enumerate(lines):
            if ln.count(b'"') % 2:
                return (f"{path}:{first + i}: a quoted field runs onto the next line; line "
                        "breaks inside fields are not supported")
    return (f"{path}:{first}-{first + len(lines) - 2}: could not match rows to lines "
            "(line breaks inside fields are not supported)")


def iter_text_blocks(path: Path, fmt: TextFormat, names: list[str], types: dict[str, pa.DataType],
                     block_size: int, hasher: hashlib._Hash | None = None,
                     field_hint: Callable[[int, str], str] | None = None) -> Iterator[Block]:
    """Parsed blocks of a text file. `names` are all its columns, `types` those to convert.

    Lines with the wrong number of fields are left out of the table and listed in
    `Block.bad`; a block whose numeric columns do not convert comes back with those
    columns as binary (text) for the caller to validate.
    """
    path = Path(path)
    s = InputStream(path, hasher)
    line = 2 if fmt.header else 1
    got_any = False
    try:
        for buf, nlines in _raw_blocks(s, block_size, fmt.header):
            got_any = True
            first = line
            line += nlines
            try:
                table, bad_texts = _parse(buf, names, types, fmt, len(names))
                if _non_finite(table):
                    raise pa.ArrowInvalid("a number that is not finite")
            except pa.ArrowInvalid:
                # A value did not convert, or is inf/nan (or beyond a float64, which the
                # parser makes inf): parse again with every column as text, so that the
                # decoder checks them and names the value as it is written.
                text_types = {c: pa.binary() for c in types}
                try:
                    table, bad_texts = _parse(buf, names, text_types, fmt, len(names))
                except pa.ArrowInvalid as e:
                    raise DataError(f"{path}:{first}-{line - 1}: cannot parse ({one_line(e)})") from e
            block = Block(table, path, first)
            keep = np.ones(nlines, bool)
            if bad_texts:
                located = _locate(bytes(buf), bad_texts)
                block.bad = [
                    (first + i, f"expected {len(names)} fields, found {_fields(t, fmt)}"
                                f"{field_hint(_fields(t, fmt), t) if field_hint else ''}",
                     "wrong number of fields")
                    for i, t in located
                ]
                keep[[i for i, _ in located]] = False
                block.line_numbers = first + np.flatnonzero(keep)
            if int(keep.sum()) != table.num_rows:  # a line break inside a field, or a lone \r
                raise DataError(_unmatched_lines(bytes(buf), first, path, fmt,
                                                 more_rows=table.num_rows > keep.sum()))
            yield block
        s.check_unchanged()
    finally:
        s.close()
    if not got_any:
        raise DataError(f"{path}: empty file" if not fmt.header else f"{path}: no data lines after the header")


def iter_parquet_blocks(path: Path, types: dict[str, pa.DataType], rows: int) -> Iterator[Block]:
    """Blocks of `rows` rows of a Parquet file, columns cast to `types` where they convert."""
    path = Path(path)
    try:
        f = pq.ParquetFile(path)
        start = 0
        for batch in f.iter_batches(batch_size=rows, columns=list(types)):
            cols = {}
            for name in types:
                col = batch.column(name)
                try:
                    cols[name] = _cast_loosely(col, types[name])
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise DataError(f"{path}: column {name!r} holds {col.type} values; preprocess "
                                    "reads columns of numbers, strings or booleans") from None
            table = pa.table(cols)
            yield Block(table, path, start + 1, unit="row")
            start += batch.num_rows
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({one_line(e)})") from e
    if start == 0:
        raise DataError(f"{path}: no rows")


def _cast_loosely(col: pa.Array, typ: pa.DataType) -> pa.Array:
    """Cast to `typ`; a column whose values do not all convert comes back as binary text."""
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if col.type == typ:
        return col
    try:
        if pa.types.is_binary(typ) and not (pa.types.is_string(col.type) or pa.types.is_binary(col.type)):
            return pc.cast(pc.cast(col, pa.string()), pa.binary())
        return pc.cast(col, typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pc.cast(pc.cast(col, pa.string()), pa.binary())


def prefetch(it: Iterator, depth: int = 1) -> Iterator:
    """Run iterator `it` in a background thread, `depth` items ahead (parse while we encode)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for x in it:
                if not put(("item", x)):
                    return
            put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(("error", e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    t = threading.Thread(target=run, name="bagpipe-reader", daemon=True)
    t.start()
    try:
        while True:
            kind, x = q.get()
            if kind == "item":
                yield x
            elif kind == "end":
                return
            else:
                raise x
    finally:
        stop.set()
        t.join()

