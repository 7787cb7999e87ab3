"""Atomic outputs, and the checks that keep a user's inputs safe from them.

Everything is written to a temporary sibling (`.NAME.tmp-*`) and renamed into place, so a
crash, an error, Ctrl-C, SIGTERM or SIGHUP never leaves a half-written dataset, result or
file. While a process writes a temporary it holds an flock on it; the kernel drops the lock
when the process dies, however it dies, so a temporary nobody holds is a leftover of a run
that was killed (`stale_temporaries`). What may be written at all is one rule's
(`outputs.check_output`), checked before any work.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.outputs import _real, check_output_dir, special

STARTED = time.time()  # about when this process started (the CLI imports io before any work)



def _lock(path: Path) -> int:
    """Hold an exclusive flock on `path` (a folder or file) until the returned fd is closed."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


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
    """Yield a temporary directory next to `out`; on success it replaces `out` by rename.

    On any exception (KeyboardInterrupt, SIGTERM and SIGHUP included: see `signals`) the
    temporary directory is removed and `out` is left exactly as it was.
    """
    out = Path(out)
    check_output_dir(out, overwrite)
    parent = _real(out).parent
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write in {parent}: {e.strerror or e}") from None
    lock = _lock(tmp)
    try:
        try:
            yield tmp
        except OSError as e:
            raise _renamed(e, tmp, out) from None
        _replace(tmp, out, parent)
    finally:
        os.close(lock)
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded


def _replace(tmp: Path, out: Path, parent: Path) -> None:
    """Rename `tmp` over `out`; an earlier `out` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
        os.rename(out, old / "x")
    try:
        os.rename(tmp, out)
    except OSError as e:
        if old is not None:
            os.rename(old / "x", out)
        raise OSError(e.errno, f"cannot move the output into place: {e.strerror}",
                      str(out)) from None
    except BaseException:
        if old is not None:
            os.rename(old / "x", out)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file next to `path` for writing; rename it over `path` on success.
    An error names `path`, never the temporary file."""
    path = Path(path)
    what = special(path)
    if what is not None:  # (the commands refuse it before any work: `check_output`)
        raise ConfigError(f"{path} is {what}, which bagpipe never replaces")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as e:
        raise OSError(e.errno, f"cannot write: {e.strerror or e}", str(path)) from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _renamed(e, Path(tmp), path) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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


NEWER = "made since this run started"


@dataclass(frozen=True)
class StaleTemporary:
    """A temporary of an earlier write next to an output, and what was done with it."""

    path: Path
    removed: bool
    why: str  # why it was kept, or "" when removed


def stale_temporaries(out: Path, remove: bool = True) -> list[StaleTemporary]:
    """The temporaries (`.NAME.tmp-*`, `.NAME.old-*`, `.NAME.probe-*`) of earlier writes of
    `out`, each removed (with `remove`) when safe: no process holds its lock and it is older
    than this process. A temporary held by a running process is named and left alone, and so
    is a `.old-*` folder holding the only copy of an earlier output (a run killed between two
    renames). Those made since this process started are another live run's: not listed."""
    out = Path(out)
    parent = _real(out).parent
    if not parent.is_dir():
        return []
    found = []
    kinds = ("tmp", "old", "probe")
    for p in [q for k in kinds for q in sorted(parent.glob(f".{out.name}.{k}-*"))]:
        why = _why_kept(p, out)
        if why == NEWER:
            continue
        if why or not remove:
            found.append(StaleTemporary(p, False, why))
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        gone = not p.exists()
        found.append(StaleTemporary(p, gone, "" if gone else "could not be removed"))
    return found


def _why_kept(p: Path, out: Path) -> str:
    try:
        if p.lstat().st_mtime >= STARTED:
            return NEWER
        if ".old-" in p.name and (p / "x").exists() and not out.exists():
            return f"it holds the earlier {out}: move {p / 'x'} back to {out}"
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return "cannot be read"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return "a running process is writing it"
    finally:
        os.close(fd)
    return ""


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
