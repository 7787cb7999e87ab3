"""Reading the records bagpipe reads back, with limits: one reader for every JSON record
(a dataset's meta.json, a run's config.json and summary.json, a bench's bench.json,
index.json and environment.json, a trace, a profile.json, a checkpoint's state.json,
metrics.json and checksums.json) and every YAML/TOML input (bench files, cluster files).

`read_record(path, kind)` refuses, in one line naming the file (and the key) and what was
expected, a file larger than its kind's `max_bytes`, nested deeper than `MAX_DEPTH` levels,
not valid JSON/YAML/TOML, of the wrong top-level type, with a `schema_version` other than
its kind's (a newer one: which version is needed), or whose keys the tool uses are missing
or of the wrong type (`Kind.required`, `Kind.optional`). Depth is checked without
recursion: a JSON file's brackets are counted outside its strings before it is parsed, and
a YAML/TOML file's parser is stopped if it recurses too deep (then its result is walked
iteratively). `load_record` is the same without the key check, `check_fields` the key
check alone. Standard library only (YAML is imported by `io.read_yaml` when read).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from bagpipe_cli import __version__
from bagpipe_cli.errors import ConfigError, DataError
from bagpipe_cli.files.atomic import read_text, read_yaml

MAX_DEPTH = 64  # levels of nesting (objects and lists) any record may have
MiB = 1 << 20


class RecordError(DataError, ValueError):
    """A stored record that cannot be read (exit 2). Also a ValueError, as the JSON parser's
    error it replaces is: a reader that treats a bad optional record as absent still does."""


# A key's type: (the Python types it may have, what to call it in an error). bool is never
# a number, although Python makes it an int.
Type = tuple[tuple[type, ...], str]
INT: Type = ((int,), "an integer")
NUMBER: Type = ((int, float), "a number")
STRING: Type = ((str,), "a string")
OBJECT: Type = ((dict,), "a JSON object")
LIST: Type = ((list,), "a list")


def nullable(t: Type) -> Type:
    return (*t[0], type(None)), f"{t[1]} or null"


@dataclass(frozen=True)
class Kind:
    """A kind of record: how large and what shape it may be, and what to do when it is not."""

    what: str  # what the file is, in errors ("a run's summary.json")
    max_bytes: int
    fix: str  # what to do about a damaged one
    version: int | None = None  # the schema_version it carries (None: none of its own)
    top: Type | None = OBJECT  # the top-level value (None: the reader checks it)
    required: dict[str, Type] = field(default_factory=dict)  # keys the tool needs
    optional: dict[str, Type] = field(default_factory=dict)  # keys it uses when present
    writer: tuple[str, ...] = ()  # where the record names the bagpipe version that wrote it
    error: type[Exception] = RecordError  # the error raised (inputs a user edits: ConfigError)
    syntax: str = "json"  # or "yaml", or "yaml/toml" (TOML for a .toml file)
    redo: str = "rerun the benchmark with this one"  # for a schema_version this one cannot read


RERUN = "the file is damaged; rerun the run"
KINDS: dict[str, Kind] = {
    # Tables and the preprocess record (bad lines, causes) make a dataset's the largest.
    "dataset": Kind("a dataset's meta.json", 64 * MiB, "re-create the dataset (bagpipe synth "
                    "or bagpipe preprocess)", version=1, writer=("bagpipe_version",),
                    redo="re-create the dataset with this version"),
    "run config": Kind("a run's config.json", 16 * MiB, RERUN, version=1, optional={
        "train": OBJECT, "model": OBJECT, "dataset": OBJECT, "layout": nullable(OBJECT),
        "bench": nullable(OBJECT), "environment": nullable(OBJECT), "row_dim": nullable(INT)},
        writer=("environment", "bagpipe_version")),
    # What every report row needs: the figures are never null (a run writes every key; a
    # library's stub may leave some out), and the mappings it reads.
    "run summary": Kind("a run's summary.json", 16 * MiB, RERUN, version=1, required={
        "system": STRING, "iterations": NUMBER}, optional={
        "model": STRING, "measured_iterations": NUMBER, "samples_per_s": NUMBER,
        "median_iter_ms": NUMBER, **{k: nullable(OBJECT) for k in (
            "median_time_ms", "roles", "contention", "memory", "environment", "resumed_from")}},
        writer=("environment", "bagpipe_version")),
    # 100,000 planned run ids (and their index rows) at most: a bench's files stay below these.
    "bench": Kind("a bench's bench.json", 32 * MiB, "the bench folder is damaged; start the "
                  "bench afresh in another --out", version=1,
                  optional={"kind": STRING, "planned_runs": LIST}),
    "bench index": Kind("a bench's index.json", 256 * MiB, "the bench folder is damaged; "
                        "rerun the bench with --resume", version=1,
                        optional={"runs": LIST, "planned": INT, "completed": INT}),
    "environment": Kind("a bench's environment.json", 1 * MiB, "the bench folder is damaged"),
    "trace": Kind("a trace", 2048 * MiB, "rerun the run with --trace"),
    "profile": Kind("a profile.json", 64 * MiB, "rerun bagpipe profile", version=1,
                    required={"dataset": OBJECT, "config": OBJECT},
                    redo="rerun bagpipe profile with this one"),
    "checkpoint state": Kind("a checkpoint's state.json", 16 * MiB, "", required={
        "iteration": INT, "config": OBJECT, "dataset": OBJECT},
        optional={"versions": OBJECT, "created": STRING}, writer=("versions", "bagpipe")),
    # A record per iteration and trainer: it grows with the run, so its limit is memory's.
    "checkpoint metrics": Kind("a checkpoint's metrics.json", 4096 * MiB, "", top=LIST),
    "checkpoint checksums": Kind("a checkpoint's checksums.json", 1 * MiB, "",
                                 required={"sha256": OBJECT}),
    "bench file": Kind("a bench file", 4 * MiB, "fix the file", top=None, error=ConfigError,
                       syntax="yaml/toml"),
    "cluster file": Kind("a cluster file", 1 * MiB, "fix the file", top=None, error=ConfigError,
                         syntax="yaml"),
}


def read_record(path: Path, kind: str | Kind, *, name: str | None = None,
                error: type[Exception] | None = None, max_depth: int = MAX_DEPTH,
                max_bytes: int | None = None) -> Any:
    """The record in `path` (JSON, YAML or TOML: the kind's `syntax`), checked against
    `kind` (a name of `KINDS`, or a Kind): its size, depth, top-level type, schema_version
    and keys. `name` is what errors call the file (default: its path); `error` the error
    type (default the kind's)."""
    k = KINDS[kind] if isinstance(kind, str) else kind
    obj = load_record(path, k, name=name, error=error, max_depth=max_depth, max_bytes=max_bytes)
    check_fields(obj, k, name or str(path), error)
    return obj


def load_record(path: Path, kind: str | Kind, *, name: str | None = None,
                error: type[Exception] | None = None, max_depth: int = MAX_DEPTH,
                max_bytes: int | None = None) -> Any:
    """`read_record` without the check of the keys."""
    k = KINDS[kind] if isinstance(kind, str) else kind
    err, where, path = error or k.error, name or str(path), Path(path)
    limit = k.max_bytes if max_bytes is None else max_bytes
    if k.syntax == "json":
        obj = _load_json(path, where, limit, max_depth, err, k)
    else:
        toml = k.syntax == "yaml/toml" and path.suffix.lower() == ".toml"
        obj = _load_text(path, where, toml, limit, max_depth, err, k)
    if k.top is not None and not is_a(obj, k.top):
        kind_of = "JSON object" if k.top is OBJECT else k.top[1].removeprefix("a ")
        raise err(f"{where}: not a {kind_of}; not written by bagpipe")
    if k.version is not None:
        _check_version(obj, k, where, err)
    return obj


def check_fields(obj: dict[str, Any], kind: str | Kind, where: str,
                 error: type[Exception] | None = None) -> None:
    """The keys `kind` requires are there, and they and its optional keys have their types."""
    k = KINDS[kind] if isinstance(kind, str) else kind
    err = error or k.error
    fix = f"; {k.fix}" if k.fix else ""
    for key, t in k.required.items():
        if key not in obj:
            raise err(f"{where}: lacks {key} ({t[1]}){fix}")
    for key, t in (*k.required.items(), *k.optional.items()):
        if key in obj and not is_a(obj[key], t):
            raise err(f"{where}: {key} is {shown(obj[key])}, not {t[1]}{fix}")


def is_a(v: Any, t: Type) -> bool:
    """Whether `v` has type `t` (a bool is no number)."""
    return isinstance(v, t[0]) and not (isinstance(v, bool) and bool not in t[0])


def shown(v: Any, width: int = 60) -> str:
    """A value as an error shows it: null for None, else its repr, cut short."""
    s = "null" if v is None else repr(v)
    return s if len(s) <= width else s[: width - 3] + "..."


def _size(path: Path, where: str, limit: int, err: type[Exception], k: Kind) -> None:
    """Refuse a file larger than `limit` before reading it (and anything but a regular file
    or a pipe: a device would be read forever)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise err(f"{where}: cannot read: {e.strerror or e}") from None
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        raise err(f"{where}: not a regular file (it is a device or a socket)")
    if st.st_size > limit:
        raise err(f"{where}: {st.st_size / MiB:,.1f} MiB, more than the {limit / MiB:,.0f} MiB "
                  f"{k.what} may have; the file is damaged or not written by bagpipe")


def _too_deep(where: str, max_depth: int, k: Kind) -> str:
    return (f"{where}: nested more than {max_depth} levels deep, which {k.what} never is; the "
            "file is damaged or not written by bagpipe")


_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_OTHER = bytes(c for c in range(256) if c not in b"[{]}")


def json_depth(data: bytes) -> int:
    """The deepest nesting of objects and lists in a JSON text, counted without parsing it:
    escapes and strings are removed, then the brackets left are summed in order."""
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", data)).translate(_STEP, _OTHER)
    return max(accumulate(brackets, lambda depth, c: depth + c - 1, initial=0))


def _load_json(path: Path, where: str, limit: int, max_depth: int, err: type[Exception],
               k: Kind) -> Any:
    _size(path, where, limit, err, k)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise err(f"{where}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:  # a pipe, or a file that grew
        raise err(f"{where}: more than the {limit / MiB:,.0f} MiB {k.what} may have")
    if json_depth(data) > max_depth:
        raise err(_too_deep(where, max_depth, k))
    try:
        return json.loads(data)
    except RecursionError:  # (the brackets say otherwise: not valid JSON then)
        raise err(_too_deep(where, max_depth, k)) from None
    except ValueError as e:  # UnicodeDecodeError is one
        fix = f"; {k.fix}" if k.fix else ""
        raise err(f"{where}: corrupt JSON (not valid JSON: {e}){fix}") from None


def _load_text(path: Path, where: str, toml: bool, limit: int, max_depth: int,
               err: type[Exception], k: Kind) -> Any:
    """A YAML or TOML file: parsed, stopped if the parser recurses too deep, then walked."""
    _size(path, where, limit, err, k)
    try:
        if toml:
            try:
                obj = tomllib.loads(read_text(path, where))
            except tomllib.TOMLDecodeError as e:
                raise err(f"{where}: not valid TOML: {e}") from None
        else:
            obj = read_yaml(path, where)
    except RecursionError:
        raise err(_too_deep(where, max_depth, k)) from None
    if nesting_exceeds(obj, max_depth):
        raise err(_too_deep(where, max_depth, k) + " (or it refers to itself)")
    return obj


def nesting_exceeds(obj: Any, max_depth: int) -> bool:
    """Whether `obj` nests mappings and lists more than `max_depth` deep, found without
    recursion. A value reached twice (a YAML alias) is walked again only from a deeper
    level, so a file of aliases that expands exponentially is walked in linear time; one
    that contains itself is found too deep."""
    deepest: dict[int, int] = {}
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if depth > max_depth:
            return True
        if deepest.get(id(node), 0) >= depth:
            continue
        deepest[id(node)] = depth
        stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False


def _check_version(obj: dict[str, Any], k: Kind, where: str, err: type[Exception]) -> None:
    v = obj.get("schema_version")
    if v is None:
        raise err(f"{where}: no schema_version; not written by bagpipe")
    if not is_a(v, INT):
        raise err(f"{where}: schema_version is {shown(v)}, not an integer; the file is damaged")
    if v == k.version:
        return
    head = f"{where}: schema_version {v} is not supported by this bagpipe (expects {k.version})"
    writer = obj
    for key in k.writer:
        writer = writer.get(key) if isinstance(writer, dict) else None
    if v > k.version and isinstance(writer, str) and writer and writer != __version__:
        raise err(f"{head}: it was written by a newer bagpipe, {writer}; read it with bagpipe "
                  f"{writer} or later (this is bagpipe {__version__})")
    raise err(f"{head}; use the bagpipe version that wrote it, or {k.redo}")
