"""Per-table vocabularies: value -> contiguous id in popularity order, built from counts.

Every categorical value is first turned into a 64-bit integer *key*:

- `hex` (Criteo): the value's 8 ASCII bytes (hex digits, checked) read as an int64, so
  the key is exact (no collisions), costs no conversion, and is the value itself;
- `str` (everything else): a 63-bit SipHash-2-4 of the value's bytes (pandas'
  `hash_array`, fixed key, so stable across runs and machines). Two distinct values
  share a key with probability about V^2 / 2^64 for V distinct values (about 5e-6 for
  ten million); collisions inside one chunk are detected and reported.

Keys are counted in `KeyIndex`, an open-addressing hash table held in numpy arrays and
probed a whole array at a time, so counting costs a few vectorised passes per chunk and
about 40 bytes per distinct value, not a Python object per value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from bagpipe_cli.errors import DataError

KINDS = ("hex", "str")
MAX_VOCAB = 2**31 - 1  # ids are int32, and a vocabulary's ids count from 1


class TooManyValues(DataError):
    """More distinct values than a vocabulary's int32 ids can number."""

    def __init__(self, n: int, table: str = ""):
        self.n = n
        where = f"table {table!r}" if table else "one table"
        super().__init__(f"{where}: more than {MAX_VOCAB - 1:,} distinct values, more than a "
                         "vocabulary's int32 ids can number; pass --max-rows-per-table R to hash "
                         "them into R ids")
_MAX_LOAD = 0.7  # linear probing stays short; ~17-34 bytes of table per key

# --------------------------------------------------------------------------- keys


def mix64(keys: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a fixed bijective scramble of int64 keys to uint64."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.int64, copy=False).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


def _binary_parts(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n+1] int64, data uint8) of a binary/string array without nulls."""
    if values.null_count:
        raise ValueError("values must not contain nulls")
    values = values.cast(pa.large_binary())
    bufs = values.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


_B = 0x0101010101010101  # one in every byte


def hex_bad(keys: np.ndarray) -> np.ndarray:
    """Which `hex` keys (8 ASCII bytes in an int64) are not 8 hexadecimal digits.

    Eight bytes at a time (SWAR): decode each byte as a hex digit, encode it back in
    lower case and compare with the byte (letters lower-cased); any difference, or a
    "digit" above 15, is a non-hex byte.
    """
    w = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64)
    u = np.uint64
    with np.errstate(over="ignore"):
        v = (w & u(0x0F * _B)) + u(9) * ((w >> u(6)) & u(_B))  # digit value per byte (<= 24)
        over15 = (v + u(0x70 * _B)) & u(0x80 * _B)
        over9 = ((v + u(0x76 * _B)) >> u(7)) & u(_B)
        enc = v + u(0x30 * _B) + u(0x27) * over9  # '0'-'9', 'a'-'f'
        lower = w | ((w >> u(1)) & u(0x20 * _B))  # sets bit 5 where bit 6 is set
    return (enc != lower) | (over15 != 0)


def hex_word_keys(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """`hex` keys of binary values of any length (the slow path); returns (keys, bad).

    A key is the value's 8 bytes read as a little-endian int64; shorter values are
    left-padded with '0' (so "abc" and "00000abc" are one value).
    """
    n = len(values)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    offsets, data = _binary_parts(values)
    start, length = offsets[:-1], np.diff(offsets)
    bad = (length < 1) | (length > 8)
    ln = np.clip(length, 1, 8)
    j = np.arange(8)[None, :]
    lead = (8 - ln)[:, None]
    pos = np.clip(start[:, None] + j - lead, 0, max(data.size - 1, 0))
    chars = np.where(j >= lead, data[pos] if data.size else ord("0"), ord("0")).astype(np.uint8)
    keys = np.ascontiguousarray(chars).view("<i8").reshape(n)
    return keys, bad | hex_bad(keys)


def hex_values(keys: np.ndarray) -> pa.Array:
    """The 8-character strings of `hex` keys."""
    k = np.ascontiguousarray(keys, dtype=np.int64)
    offsets = pa.py_buffer((np.arange(len(k) + 1, dtype=np.int32) * 8).tobytes())
    return pa.StringArray.from_buffers(len(k), offsets, pa.py_buffer(k.tobytes()))


def str_keys(values: pa.Array) -> np.ndarray:
    """63-bit stable hash keys of string/binary values (no nulls)."""
    if len(values) == 0:
        return np.zeros(0, np.int64)
    objs = values.cast(pa.binary()).to_numpy(zero_copy_only=False)
    h = pd.util.hash_array(objs, categorize=False)
    return (h >> np.uint64(1)).astype(np.int64)


def value_keys(kind: str, values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(keys, bad) of distinct values for a table of `kind`."""
    if kind == "hex":
        return hex_word_keys(values)
    keys = str_keys(values)
    return keys, np.zeros(len(keys), bool)


def hash_bucket(keys: np.ndarray, rows: int) -> np.ndarray:
    """Ids 1..rows-1 from keys (the `--max-rows-per-table` hashing), int64."""
    return (mix64(keys) % np.uint64(rows - 1)).astype(np.int64) + 1


# --------------------------------------------------------------------------- hash table


class KeyIndex:
    """int64 key -> id (0, 1, 2, ... in insertion order): linear probing in numpy arrays.

    Every operation takes a whole array of keys; each probe step is one vectorised pass
    over the keys not yet placed, so the Python overhead is per probe round, not per key.
    A key's first slot is the top bits of mix64(key).
    """

    def __init__(self, capacity: int = 1024):
        self._alloc(1 << max(4, int(capacity - 1).bit_length()))
        self.size = 0

    def _alloc(self, cap: int) -> None:
        self._keys = np.zeros(cap, np.int64)
        self._ids = np.full(cap, -1, np.int32)
        self._shift = np.uint64(64 - (cap.bit_length() - 1))

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (mix64(keys) >> self._shift).astype(np.int64)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key: where it is stored, or the empty slot that ends its probe."""
        mask = len(self._ids) - 1
        out = np.empty(len(keys), np.int64)
        idx = np.arange(len(keys))
        pos = self._home(keys)
        k = keys
        while idx.size:
            done = (self._ids[pos] < 0) | (self._keys[pos] == k)
            out[idx[done]] = pos[done]
            more = ~done
            idx, k, pos = idx[more], k[more], (pos[more] + 1) & mask
        return out

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Ids of `keys` (int64), -1 where a key is absent."""
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        return self._ids[self._slots(keys)].astype(np.int64)

    def _place(self, keys: np.ndarray, ids: np.ndarray, pos: np.ndarray | None = None) -> None:
        # keys are distinct and absent; `pos` is where to start probing (default: home).
        # Keys racing for one empty slot: one wins (numpy keeps one of the duplicate
        # writes), the others probe on.
        mask = len(self._ids) - 1
        if pos is None:
            pos = self._home(keys)
        while keys.size:
            free = np.flatnonzero(self._ids[pos] < 0)
            self._ids[pos[free]] = ids[free]
            won = np.zeros(len(keys), bool)
            won[free] = self._ids[pos[free]] == ids[free]
            self._keys[pos[won]] = keys[won]
            lost = ~won
            keys, ids, pos = keys[lost], ids[lost], (pos[lost] + 1) & mask

    def add(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ids of distinct `keys`, inserting absent ones in order; returns (ids, new mask)."""
        if len(keys) == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        if (self.size + len(keys)) > len(self._ids) * _MAX_LOAD:  # room for all, then probe once
            cap = len(self._ids)
            while self.size + len(keys) > cap * _MAX_LOAD:
                cap *= 2
            used = self._ids >= 0
            old_keys, old_ids = self._keys[used], self._ids[used]
            self._alloc(cap)
            self._place(old_keys, old_ids)
        slots = self._slots(keys)
        ids = self._ids[slots].astype(np.int64)
        new = ids < 0
        n_new = int(new.sum())
        if n_new:
            if self.size + n_new >= MAX_VOCAB:
                raise TooManyValues(self.size + n_new)
            fresh = np.arange(self.size, self.size + n_new, dtype=np.int64)
            self._place(keys[new], fresh.astype(np.int32), slots[new])  # from the probe's end
            ids[new] = fresh
            self.size += n_new
        return ids, new


class _Grow:
    """An append-only int64 array with amortised doubling."""

    def __init__(self) -> None:
        self.a = np.zeros(1024, np.int64)
        self.n = 0

    def extend(self, x: np.ndarray) -> None:
        need = self.n + len(x)
        if need > len(self.a):
            b = np.zeros(max(need, len(self.a) + len(self.a) // 4), np.int64)  # 1.25x: less slack
            b[: self.n] = self.a[: self.n]
            self.a = b
        self.a[self.n : need] = x
        self.n = need

    def view(self) -> np.ndarray:
        return self.a[: self.n]


# --------------------------------------------------------------------------- vocabularies


class VocabCounter:
    """Counts the values of one table across chunks (first pass)."""

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind
        self.index = KeyIndex()
        self.keys = _Grow()
        self.counts = _Grow()
        self._values: list[pa.Array] = []  # values of new keys, in id order (str kind)

    def add(self, keys: np.ndarray, counts: np.ndarray, values: pa.Array | None) -> np.ndarray:
        """Count distinct `keys` (in order of first appearance) seen `counts` times.

        Returns each key's insertion id (its position in first-appearance order).
        """
        try:
            ids, new = self.index.add(keys)
        except TooManyValues as e:
            raise TooManyValues(e.n, self.name) from None
        if new.any():
            self.keys.extend(keys[new])
            self.counts.extend(np.zeros(int(new.sum()), np.int64))
            if self.kind == "str":
                assert values is not None
                self._values.append(values.filter(pa.array(new)))
        self.counts.view()[ids] += counts
        return ids

    def finish(self, min_count: int = 1) -> Vocab:
        """The vocabulary: ids 1..n by decreasing count, ties by first appearance."""
        counts = self.counts.view()
        order = np.argsort(-counts, kind="stable")  # insertion order = first appearance
        if min_count > 1:
            order = order[counts[order] >= min_count]
        remap = np.zeros(len(counts), np.int32)  # ids < 2^31 (KeyIndex.add checks)
        remap[order] = np.arange(1, len(order) + 1, dtype=np.int32)
        keys = self.keys.view()[order]
        if self.kind == "hex":
            values = hex_values(keys)
        else:
            all_values = pa.concat_arrays(self._values) if self._values else pa.array([], pa.binary())
            values = _as_text(all_values.take(pa.array(order)))
        return Vocab(self.name, self.kind, values, counts[order], self.index, remap, len(counts))


def _as_text(values: pa.Array) -> pa.Array:
    """Binary values as UTF-8 strings where they are valid UTF-8 (nicer to read back)."""
    try:
        return values.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return values


@dataclass
class Vocab:
    """A finished vocabulary: `values[i]` (seen `counts[i]` times) has id i + 1."""

    name: str
    kind: str
    values: pa.Array
    counts: np.ndarray
    index: KeyIndex | None  # key -> insertion id (None once dropped to save memory)
    remap: np.ndarray  # insertion id -> final id (0 = dropped)
    distinct: int  # distinct values seen (before --min-count)

    @property
    def cardinality(self) -> int:
        return len(self.values) + 1

    def ids(self, keys: np.ndarray) -> np.ndarray:
        """Final ids of keys, 0 for unknown or dropped values (int64)."""
        assert self.index is not None, "vocabulary index was dropped"
        ins = self.index.lookup(keys)
        out = np.zeros(len(keys), np.int64)
        known = ins >= 0
        out[known] = self.remap[ins[known]]
        return out

    def decode(self, ids: np.ndarray) -> list[str | None]:
        """Values of ids (None for id 0): to check an encoded row against its input."""
        ids = np.asarray(ids)
        vals = self.values.to_pylist()
        return [None if i == 0 else vals[i - 1] for i in ids.tolist()]

    def save(self, path: Path) -> None:
        table = pa.table({"value": self.values, "count": pa.array(self.counts, pa.int64())})
        # Hex and hashed-looking values hardly compress; counts do.
        pq.write_table(table, path, compression={"value": "none", "count": "snappy"})

    @classmethod
    def load(cls, path: Path, name: str, kind: str) -> Vocab:
        """Read a vocabulary saved by `save` (row i = id i + 1)."""
        try:
            t = pq.read_table(path)
            values = t.column("value").combine_chunks()
            counts = t.column("count").to_numpy().astype(np.int64)
        except (OSError, KeyError, pa.ArrowException) as e:
            raise DataError(f"{path}: not a readable vocabulary file ({e})") from e
        if values.null_count:
            raise DataError(f"{path}: vocabulary has missing values")
        keys, bad = value_keys(kind, values)
        if bad.any():
            raise DataError(f"{path}: vocabulary value {values[int(np.argmax(bad))]} is not {kind}")
        index = KeyIndex(len(keys) * 2)
        ids, new = index.add(keys)
        if not new.all():
            raise DataError(f"{path}: vocabulary has duplicate values")
        remap = np.arange(1, len(keys) + 1, dtype=np.int32)
        return cls(name, kind, values, counts, index, remap, len(keys))
