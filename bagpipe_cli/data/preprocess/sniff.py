"""What an input file is, before it is parsed: Parquet or text, and its columns.

`is_parquet` knows a Parquet file by its first bytes (`PAR1`), whatever its name.
`check_text` looks at a text input's first bytes (after gzip, if it is gzip), so that a
file that is not text is named for what it is ("looks like a zstd-compressed file"), not
for the first parse error it would cause. `read_header` reads the column names from a
text file's first line or a Parquet file's schema, and refuses a name given twice.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bagpipe_cli.data.preprocess.stream import GZIP_MAGIC, InputStream
from bagpipe_cli.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_MAGIC = b"PAR1"
MAX_LINE = 1 << 20  # the longest line read (pyarrow's parallel parse unit)
_SNIFF_BYTES = 1 << 16  # how much of a file `check_text` looks at

# (first bytes, what a file that starts with them is): formats a click log may arrive in by
# mistake. Each signature holds a byte that text does not, or is long enough not to be a
# header line by chance.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file"),
    (b"\xfd7zXZ\x00", "an xz-compressed file"),
    (b"\x04\x22\x4d\x18", "an LZ4-compressed file"),
    (b"\xff\x06\x00\x00sNaPpY", "a Snappy-framed file"),
    (b"\x1f\x9d", "a Unix compress (.Z) file"),
    (b"PK\x03\x04", "a zip archive (or an .xlsx workbook)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an OLE file (an .xls workbook?)"),
    (b"ARROW1", "an Arrow IPC (Feather) file"),
    (b"Obj\x01", "an Avro file"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
    (b"\x00\x00\xfe\xff", "UTF-32 text (save it as UTF-8)"),
    (b"\xff\xfe\x00\x00", "UTF-32 text (save it as UTF-8)"),
    (b"\xfe\xff", "UTF-16 text (save it as UTF-8)"),
    (b"\xff\xfe", "UTF-16 text (save it as UTF-8)"),
    (b"PAR1", "a Parquet file"),
    (GZIP_MAGIC, "a gzip-compressed file"),
)
# Bytes that text (UTF-8 or Latin-1) does not hold: C0 controls but tab, LF, VT, FF, CR, ESC.
_CONTROL = bytes(sorted(set(range(32)) - {9, 10, 11, 12, 13, 27}) + [127])


def describe_bytes(head: bytes) -> str | None:
    """What a file starting with `head` looks like when it is not text (None: it may be)."""
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return what
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] == b"1AY&SY":
        return "a bzip2-compressed file"
    if len(head) > 262 and head[257:262] == b"ustar":
        return "a tar archive"
    if b"\x00" in head:
        for zeros, text in ((head[0::2], head[1::2]), (head[1::2], head[0::2])):
            # ASCII as UTF-16: every other byte is NUL, and the others are not
            if len(text) >= 4 and zeros.count(0) * 10 >= len(zeros) * 9 >= text.count(0) * 90:
                return "UTF-16 text without a byte-order mark (save it as UTF-8)"
        return f"binary data (a NUL byte at offset {head.index(0)})"
    controls = len(head) - len(head.translate(None, _CONTROL))
    if controls * 20 > len(head):  # over 5% control bytes: not text in any encoding
        return f"binary data ({controls} control bytes in the first {len(head):,})"
    return None


def check_text(path: Path, what: str = "a text file") -> None:
    """Refuse a file that is not (gzip-compressed) text, naming what it looks like instead."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    gz = head.startswith(GZIP_MAGIC)
    if gz:
        s = InputStream(path)
        try:
            head = s.read(_SNIFF_BYTES)
        finally:
            s.close()
    found = describe_bytes(head)
    if found is None:
        return
    if gz:
        found = "a gzip-compressed file that holds " + found
    raise DataError(f"{path}: not {what}: it looks like {found}")



@dataclass(frozen=True)
class TextFormat:
    """How a delimited text file is laid out."""

    delimiter: str = ","
    quoting: bool = True  # '"' quotes fields (CSV); off for Criteo's TSV
    header: bool = True  # the first line holds column names


def one_line(e: BaseException | str) -> str:
    """A library's error message as one printable line (pyarrow's may span several, or hold
    bytes of the file it could not read)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return "".join(c if c.isprintable() else "?" for c in text)


def is_parquet(path: Path) -> bool:
    """Whether `path` is a Parquet file, by its magic bytes (`PAR1` at the start; any name:
    `clicks.parquet.brotli` too). A file named like Parquet without them is an error."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(len(PARQUET_MAGIC))
    except OSError:
        return False  # reading it later gives the error
    if magic == PARQUET_MAGIC:
        return True
    if path.suffix.lower() in PARQUET_SUFFIXES:
        with open(path, "rb") as f:
            looks = describe_bytes(f.read(1 << 12))
        raise DataError(f"{path}: named like a Parquet file, but it does not start with "
                        f"{PARQUET_MAGIC.decode()}: not a Parquet file"
                        + (f" (it looks like {looks})" if looks else ""))
    return False


def read_header(path: Path, fmt: TextFormat) -> list[str]:
    """Column names from a text file's first line, or a Parquet file's schema.

    Names must be distinct: a file with two columns of one name is refused, naming it.
    """
    path = Path(path)
    if is_parquet(path):
        try:
            names = list(pq.ParquetFile(path).schema_arrow.names)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable Parquet file ({one_line(e)})") from e
        if not names:
            raise DataError(f"{path}: the Parquet schema has no columns")
        _check_distinct(path, names, f"{path}: the Parquet schema")
        return names
    s = InputStream(path)
    try:
        buf = b""
        while b"\n" not in buf and len(buf) <= MAX_LINE:
            more = s.read(1 << 16)
            if not more:
                break
            buf += more
    finally:
        s.close()
    if not buf.strip():
        raise DataError(f"{path}: empty file (no header line, no rows)")
    if b"\n" not in buf and len(buf) > MAX_LINE:
        raise DataError(f"{path}:1: no line break in the first {MAX_LINE:,} bytes; the first "
                        "line must be a header naming the columns (lines may end in \\n or \\r\\n)")
    line = buf.split(b"\n", 1)[0].rstrip(b"\r")
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:1: header is not UTF-8 text (byte {line[e.start]:#04x} at "
                        f"column {e.start + 1}); save the file as UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}:1: the first line is empty; it must be a header naming the columns")
    if "\r" in text:
        raise DataError(f"{path}:1: a carriage return (\\r) inside the line; lines must end in \\n "
                        "or \\r\\n (convert old Mac line endings)")
    if fmt.quoting:
        try:
            names = next(csv.reader([text], delimiter=fmt.delimiter, strict=True))
        except (csv.Error, StopIteration) as e:  # an unclosed quote, a lone carriage return
            raise DataError(f"{path}:1: the header is not a CSV line ({e})") from None
    else:
        names = text.split(fmt.delimiter)
    names = [n.strip() for n in names]
    _check_distinct(path, names, f"{path}:1: the header")
    return names


def _check_distinct(path: Path, names: list[str], where: str) -> None:
    """Refuse a header or schema that names a column twice: which one would be read?"""
    seen: dict[str, int] = {}
    for i, n in enumerate(names):
        if n in seen:
            raise DataError(f"{where} names column {n!r} twice (columns {seen[n] + 1} and {i + 1}); "
                            "rename one")
        seen[n] = i
