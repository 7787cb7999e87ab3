"""Atomic outputs, and the checks that keep a user's inputs safe from them.

Everything is written to a temporary sibling (`.NAME.tmp-*`) and renamed into place, so a
crash, an error, Ctrl-C, SIGTERM or SIGHUP never leaves a half-written dataset, result or
file. While a process writes a temporary it holds an flock on it; the kernel drops the lock
when the process dies, however it dies, so a temporary nobody holds is a leftover of a run
that was killed (`stale_temporaries`). An `--out` that is, holds or lies inside one of the
command's inputs is refused before any work (`check_output_dir`).
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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bagpipe_cli.errors import ConfigError

STARTED = time.time()  # about when this process started (the CLI imports io before any work)


@dataclass(frozen=True)
class Input:
    """A path a command reads, which its output must never replace."""

    option: str  # how the user named it: "DATA", "INPUTS", "--vocab-from", ...
    path: Path
    may_hold_out: bool = False  # the output may lie inside it (a report inside its bench folder)


def _real(p: Path) -> Path:
    """`p` absolute, with symlinks and `..` resolved (as far as it exists)."""
    return Path(os.path.realpath(Path(p).expanduser()))


def check_not_input(out: Path, inputs: Iterable[Input], option: str = "--out") -> None:
    """Refuse an output that is, holds or lies inside one of `inputs`: writing it would
    replace or alter what the command reads."""
    o = _real(out)
    for inp in inputs:
        i = _real(inp.path)
        if o == i:
            how = "is"
        elif o in i.parents:
            how = "holds"
        elif i in o.parents and not inp.may_hold_out:
            how = "lies inside"
        else:
            continue
        raise ConfigError(f"{option} {out} {how} the input {inp.option} {inp.path}; writing it "
                          "would replace or alter that input: choose a path outside it")


def check_output_dir(out: Path, overwrite: bool, option: str = "--out",
                     inputs: Iterable[Input] = ()) -> None:
    """Refuse, before any work, an output directory that is or touches an input (with or
    without `overwrite`), an existing non-empty one unless `overwrite`, and one whose parent
    cannot be made or written. Nothing is touched but a missing parent, which is made."""
    out = Path(out)
    o = _real(out)
    try:
        cwd = _real(Path.cwd())
    except OSError:  # the working directory was removed: it cannot be the output
        cwd = None
    if cwd is not None and (o == cwd or o in cwd.parents):
        what = ("the working directory" if o == cwd
                else f"a folder above the working directory {cwd}")
        raise ConfigError(f"{option} {out} is {what}, which the output would replace: choose a "
                          "new folder for it")
    check_not_input(out, inputs, option)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{option} {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{option} {out} exists and is not empty; pass --overwrite to replace it")
    _check_parent(out, option)


def check_output_file(path: Path, option: str, inputs: Iterable[Input] = ()) -> None:
    """Refuse, before any work, a file to write that is a directory, that is or touches an
    input, or whose folder cannot be made or written (the error names `path`)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file name")
    check_not_input(path, inputs, option)
    _check_parent(path, option)


def check_writable_dir(path: Path, option: str, inputs: Iterable[Input] = ()) -> None:
    """A folder a run writes into, keeping what is there (checkpoints): it is not an input
    or a file, and it can be made and written."""
    path = Path(path)
    check_not_input(path, inputs, option)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} exists and is not a directory")
    if path.is_dir():
        _probe(path, path, option)
    else:
        _check_parent(path, option)


def _check_parent(out: Path, option: str) -> None:
    parent = _real(out).parent
    if not parent.exists():
        # Creating missing parents is what a user expects of `--out a/b/c`.
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{option} {out}: cannot create its folder {parent}: "
                              f"{e.strerror or e}") from None
    if not parent.is_dir():
        raise ConfigError(f"{option} {out}: {parent} is not a directory")
    _probe(parent, out, option)


def _probe(folder: Path, out: Path, option: str) -> None:
    """Make and remove a folder in `folder`: what the write will do (access() says yes to root
    where the file system still says no, as in /proc or on a read-only mount)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{Path(out).name}.probe-", dir=folder))
    except OSError as e:
        raise ConfigError(f"{option} {out}: cannot write in {folder}: {e.strerror or e}") from None


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
