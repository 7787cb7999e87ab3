"""An input file's bytes: decompressed if it is gzip, and hashed as they are read.

`InputStream` reads a plain or gzip file in blocks and feeds every raw (compressed) byte
to a sha256, so the input's checksum costs no extra read; `file_sha256` reads a file
only to hash it (for Parquet input, which pyarrow reads itself).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
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
        self._opened = self._stamp()

    def _stamp(self) -> tuple[int, int]:
        st = os.fstat(self._raw_file.fileno())
        return st.st_size, st.st_mtime_ns

    def check_unchanged(self) -> None:
        """Refuse a file that changed while it was read: a file another process still writes
        ends in a half-written line, which would be read as a row."""
        now = self._stamp()
        if now != self._opened:
            raise DataError(f"{self.path}: changed while it was read ({self._opened[0]:,} -> "
                            f"{now[0]:,} bytes): is another process still writing it? "
                            "Preprocess it once it is complete")

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
