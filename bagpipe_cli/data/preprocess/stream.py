"""An input file's bytes: decompressed if it is gzip, and hashed as they are read.

`InputStream` reads a plain or gzip file in blocks and feeds every raw (compressed) byte
to a sha256, so the input's checksum costs no extra read; `file_sha256` reads a file
only to hash it (for Parquet input, which pyarrow reads itself). `check_text` looks at a
file's first bytes (after gzip, if it is gzip) before it is parsed, so that a file that is
not text is named for what it is ("looks like a zstd-compressed file"), not for the first
parse error it would cause.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import zlib
from pathlib import Path

from bagpipe_cli.errors import DataError


class _HashingReader(io.RawIOBase):
    """A raw file that feeds every byte read to a hash and counts them."""

    def __init__(self, f: io.BufferedReader, hasher: hashlib._Hash | None):
        self.f = f
        self.hasher = hasher
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self.f.readinto(b)
        if n:
            if self.hasher is not None:
                self.hasher.update(memoryview(b)[:n])
            self.nbytes += n
        return n or 0


GZIP_MAGIC = b"\x1f\x8b"
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


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


class InputStream:
    """The decompressed bytes of a file, read in blocks; errors name the file."""

    def __init__(self, path: Path, hasher: hashlib._Hash | None = None):
        self.path = Path(path)
        self.hasher = hasher
        self._raw_file = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        self.gz = _is_gzip(self.path)
        self._gz = gzip.GzipFile(fileobj=_HashingReader(self._raw_file, hasher)) if self.gz else None

    def read(self, n: int) -> bytes:
        if self._gz is None:
            buf = self._raw_file.read(n)
            if self.hasher is not None:
                self.hasher.update(buf)
            return buf
        try:
            return self._gz.read(n)
        except EOFError as e:
            raise DataError(f"{self.path}: truncated gzip file ({e})") from e
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{self.path}: corrupt gzip file ({e})") from e

    def readinto(self, view: memoryview) -> int:
        """Fill `view` as far as the input goes; returns the bytes read (0 at the end)."""
        got = 0
        try:
            while got < len(view):
                f = self._gz if self._gz is not None else self._raw_file
                n = f.readinto(view[got:])
                if not n:
                    break
                if self._gz is None and self.hasher is not None:
                    self.hasher.update(view[got : got + n])
                got += n
        except EOFError as e:
            raise DataError(f"{self.path}: truncated gzip file ({e})") from e
        except (gzip.BadGzipFile, zlib.error) as e:
            raise DataError(f"{self.path}: corrupt gzip file ({e})") from e
        return got

    def close(self) -> None:
        if self._gz is not None:
            self._gz.close()
        self._raw_file.close()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while buf := f.read(1 << 23):
            h.update(buf)
    return h.hexdigest()
