"""Atomic outputs, and the checks that keep a user's inputs safe from them.

Everything is written inside a temporary sibling (`.NAME.tmp-*/x`) and renamed into place,
so a crash, an error, Ctrl-C, SIGTERM or SIGHUP never leaves a half-written dataset, result
or file. The output is claimed while it is written (`claims`: the command's own claim, held
for its life, or one for the write): one process writes a path at a time, and the claim lists
every temporary made beside it, each a folder holding bagpipe's mark (`temporaries`). While a
process writes a temporary it also holds an flock on it. A temporary that a killed run's
claim lists and that holds the mark the claim names is that run's leftover, removed by the
next claim (`stale_temporaries`); nothing is removed by its name alone, nor because a claim
lists it. What may be written at all is one rule's (`outputs.check_output`), checked before
any work.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files import claims
from bagpipe_cli.files.claims import Claim
from bagpipe_cli.files.outputs import _real, check_output_dir, make_folders, os_error_words, special
from bagpipe_cli.files.temporaries import (  # (stale_temporaries: io's name for it, as before)
    PAYLOAD,
    StaleTemporary,
    discard,
    rename_noreplace,
    stale_temporaries,
    temporary,
)

__all__ = ["StaleTemporary", "stale_temporaries"]  # and the functions below


def _renamed(e: OSError, tmp: Path, final: Path) -> OSError:
    """An error about a file in temporary `tmp` names the file's final path instead (and one
    about no file names `final`)."""
    if e.filename is None:
        e.filename = str(final)
    for attr in ("filename", "filename2"):
        name = getattr(e, attr, None)
        if isinstance(name, str | Path) and str(name).startswith(str(tmp)):
            setattr(e, attr, str(final) + str(name)[len(str(tmp)):])
    return e


@contextlib.contextmanager
def atomic_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to `out` (a temporary's PAYLOAD: `temporaries`); on
    success it replaces `out` by rename.

    An existing `out` is replaced only with `overwrite` and only if the claim on it allows
    it (the command's --overwrite); else the rename replaces nothing (an empty folder aside).
    On any exception (KeyboardInterrupt, SIGTERM and SIGHUP included: see `signals`) the
    temporary directory is removed and `out` is left exactly as it was.
    """
    out = Path(out)
    check_output_dir(out, overwrite)
    try:
        c = claims.claim(out, "--out", overwrite)  # the command's, when it claimed `out`
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write in {_real(out).parent}: "
                          f"{os_error_words(e)}") from None
    tmp, lock = _temporary(out, c, lambda w: os.mkdir(w, 0o777))
    work = tmp / PAYLOAD
    try:
        try:
            yield work
        except OSError as e:
            raise _renamed(e, work, out) from None
        _replace(work, out, c, overwrite and c.overwrite)
    finally:
        discard(tmp, lock)  # (its payload is gone already when the rename succeeded)
        c.release()


def _temporary(out: Path, c: Claim, make: Callable[[Path], Any]) -> tuple[Path, int]:
    """A temporary beside `out`, claimed by `c`, with its payload made (`make(path)`). On a
    failure nothing is left and `c` is released; an OSError names `out`, as a failed write
    in it would."""
    tmp = None
    try:
        tmp, lock = temporary(out, "tmp", c)
        make(tmp / PAYLOAD)
        return tmp, lock
    except BaseException as e:
        if tmp is not None:
            discard(tmp, lock)
        c.release()
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, str(out)) from None
        raise


def _replace(tmp: Path, out: Path, c: Claim, replace: bool) -> None:
    """Rename `tmp` to `out`. With `replace`, an earlier `out` is moved aside first (into a
    listed `.NAME.old-*` temporary) and removed after; without, the rename replaces nothing
    but an empty folder, and an `out` another program made meanwhile is left as it is."""
    if not (replace and os.path.lexists(out)):
        try:
            os.rename(tmp, out)  # a folder over a folder that holds anything, or a file, fails
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise _appeared(out, c) from None
            raise OSError(e.errno, f"cannot move the output into place: {e.strerror}",
                          str(out)) from None
        return
    old, lock = temporary(out, "old", c)
    aside = old / PAYLOAD
    try:
        os.rename(out, aside)
        try:
            os.rename(tmp, out)
        except OSError as e:
            os.rename(aside, out)
            raise OSError(e.errno, f"cannot move the output into place: {e.strerror}",
                          str(out)) from None
        except BaseException:
            os.rename(aside, out)
            raise
    finally:
        os.close(lock)
        if os.path.lexists(out) or not os.path.lexists(aside):  # never the only copy
            shutil.rmtree(old, ignore_errors=True)


def _appeared(out: Path, c: Claim) -> ConfigError:
    return ConfigError(f"{c.option + ' ' if c.option else ''}{out} appeared while this run "
                       "wrote it (another program made it); it is left as it is and nothing "
                       "was written there: move it, or pass --overwrite")


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to `path` (a temporary's PAYLOAD: `temporaries`) for
    writing; rename it to `path` on success: over an existing file only if the claim on `path`
    allows it (the command's --overwrite; a write of the library's own replaces), else with a
    rename that replaces nothing. An error names `path`, never the temporary file."""
    path = Path(path)
    what = special(path)
    if what is not None:  # (the commands refuse it before any work: `check_output`)
        raise ConfigError(f"{path} is {what}, which bagpipe never replaces")
    fds: list[int] = []

    def make(p: Path) -> None:
        fds.append(os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))

    try:
        make_folders(path.parent)
        c = claims.claim(path)
        tmp, lock = _temporary(path, c, make)
    except OSError as e:
        raise OSError(e.errno, f"cannot write: {e.strerror or e}", str(path)) from None
    work = tmp / PAYLOAD
    try:
        with os.fdopen(fds[0], mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _publish_file(work, path, c)
    except OSError as e:
        raise _renamed(e, work, path) from None
    finally:
        discard(tmp, lock)
        c.release()


def _publish_file(tmp: Path, path: Path, c: Claim) -> None:
    if c.overwrite:
        os.replace(tmp, path)
        return
    try:
        rename_noreplace(tmp, path)
    except FileExistsError:
        raise _appeared(path, c) from None


class _Recording:
    """A binary file whose first failed write is kept (torch's writer turns it into an
    unhelpful RuntimeError)."""

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, b: Any) -> int:
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj: Any, target: Path | Any) -> None:
    """`torch.save` into a file (a path, or an open binary file); a write that fails (a full
    disk, a quota, an I/O error) raises the OSError that failed it, naming the file, rather
    than torch's "[enforce fail at inline_container.cc...]"."""
    import torch

    if isinstance(target, str | Path):
        with open(target, "wb") as f:
            torch_save(obj, f)
        return
    rec = _Recording(target)
    try:
        torch.save(obj, rec)
    except RuntimeError:
        if rec.error is None:
            raise
        e = rec.error
        name = getattr(target, "name", None)  # (an int: a file opened from a descriptor)
        raise OSError(e.errno, e.strerror, name if isinstance(name, str) else None) from None


def read_yaml(path: Path, what: str | None = None) -> Any:
    """A YAML input file (UTF-8, as `read_text` reads it), parsed; a file that is not YAML is
    one error naming the file, the line and the problem. A key written twice in one mapping
    (at any depth) is refused too, naming both lines: YAML would keep the later value."""
    import yaml  # only the commands that read a YAML file pay for it

    where = what or str(path)
    try:
        return yaml.load(read_text(path, what), Loader=_unique_key_loader(yaml, where))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        raise ConfigError(f"{where}:{line} not valid YAML ({getattr(e, 'problem', None) or e})") from None


def _unique_key_loader(yaml: Any, where: str) -> type:
    """A yaml.SafeLoader that refuses a key given twice in one mapping. The check runs before
    merge keys (`<<: *base`) are flattened: a key may override a merged one, as YAML means."""

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise ConfigError(f"{where}: line {line}: key {key!r} is given twice in one "
                                          f"mapping (first at line {seen[key]}); remove one (YAML "
                                          "would silently keep the later value)")
                    seen[key] = line
                except TypeError:  # an unhashable key: the base class names it
                    continue
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_text(path: Path, what: str | None = None) -> str:
    """A text input file as UTF-8; a file that is not is one error naming the file, the byte
    and its line. `what` names the file in errors (default: its path)."""
    where = what or str(path)
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            # /dev/zero would be read forever; a pipe (`<(...)`) ends, and is read.
            raise ConfigError(f"{where}: not a regular file (it is a device or a socket); "
                              "give a text file")
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{where}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"{where}: not UTF-8 text (byte {data[e.start]:#04x} at line {line}, "
                          f"column {column}); save the file as UTF-8") from None


def path_record(given: str | Path) -> dict[str, str]:
    """How a result stores an input path: `path` absolute (found from any directory) and
    `given` as the user typed it."""
    return {"path": str(_real(Path(given))), "given": str(given)}


def recorded_path(record: dict[str, Any], fallback: str | Path | None = None) -> Path | None:
    """The input path a result stored: its absolute `path` (results written before the paths
    were absolute hold the user's form there, relative to where that run was made), else
    `fallback`."""
    p = record.get("path") if isinstance(record, dict) else None
    if p:
        return Path(p)
    return Path(fallback) if fallback is not None else None


def write_json(path: Path, obj: Any) -> None:
    """Write `obj` as indented, strict JSON (NaN and infinities become null), atomically."""
    with atomic_file(path) as f:
        json.dump(_finite(obj), f, indent=2, sort_keys=False, default=json_default, allow_nan=False)
        f.write("\n")


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and getattr(o, "ndim", 1) == 0:
        return _finite(o.item())
    return o


def json_default(o: Any) -> Any:
    """`json.dump`'s `default=`: numpy scalars and paths show up in configs and summaries."""
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
