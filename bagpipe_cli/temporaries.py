"""Temporaries beside an output: each made listed in the output's claim (`temporary`), a new
output published by a rename that replaces nothing (`rename_noreplace`), an earlier file kept
aside until a command's outputs are all written (`keep_aside`), and a killed run's leftovers
found and removed (`stale_temporaries`): only those a claim lists, never a path by its name
alone (a user's `.NAME.tmp-mine` is theirs).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bagpipe_cli import claims
from bagpipe_cli.claims import Claim, real
from bagpipe_cli.errors import ConfigError


def temporary(out: str | Path, kind: str, c: Claim, directory: bool) -> tuple[Path, int]:
    """Make a temporary beside output `out` (`.NAME.KIND-*`, a folder or a file), listed in
    its claim `c` and locked (flock) by this process while the returned descriptor is open.
    Its mode follows the umask, as the output's will."""
    r = real(out)
    for _ in range(100):
        p = r.parent / f".{r.name}.{kind}-{secrets.token_hex(4)}"
        try:
            if directory:
                os.mkdir(p, 0o777)
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
            else:
                fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        c.record(p)
        return p, fd
    raise OSError(errno.EEXIST, "cannot make a temporary", str(r.parent))


_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def _renameat2():
    try:
        f = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return f


_NOREPLACE = _renameat2() if sys.platform.startswith("linux") else None


def rename_noreplace(src: str | Path, dst: str | Path) -> None:
    """Rename `src` to `dst` only if nothing is at `dst` (FileExistsError otherwise): renameat2
    with RENAME_NOREPLACE, else (a file system without it) a hard link for a file, else a
    rename of a path found absent (the output's claim keeps other bagpipe writers out)."""
    if _NOREPLACE is not None:
        if _NOREPLACE(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(e, os.strerror(e), str(dst))
    if not os.path.isdir(src):
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV):
                raise
        else:
            os.unlink(src)
            return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


@dataclass(frozen=True)
class StaleTemporary:
    """A temporary of an earlier write next to an output, and what was done with it."""

    path: Path
    removed: bool
    why: str  # why it was kept, or "" when removed


def stale_temporaries(out: Path, remove: bool = True) -> list[StaleTemporary]:
    """The temporaries (`.NAME.tmp-*`, `.NAME.old-*`) that the claim on `out` lists of
    earlier writes killed midway, each removed (with `remove`) when safe. Those of a process
    still writing `out` are named and left alone, and so is a `.old-*` folder holding the only
    copy of an earlier output (a run killed between two renames; also one no claim lists).
    Only a temporary a claim lists is ever removed: never a path by its name alone (a user's
    `.NAME.tmp-mine`)."""
    out = Path(out)
    r = real(out)
    if not r.parent.is_dir():
        return []
    c, mine, alive = claims.held(r), None, False
    if c is None and os.path.lexists(claims.claim_file(r)):
        try:
            c = mine = claims.claim(r)  # a killed writer's claim: this process's while it cleans
        except (ConfigError, OSError):
            alive = True
    listed = list(c.previous) if c is not None else _listed(r) if alive else []
    try:
        found = [_stale(r.parent / n, r, remove, alive) for n in listed
                 if os.path.lexists(r.parent / n)]
    finally:
        if mine is not None:
            mine.release()
    for p in sorted(r.parent.glob(f".{r.name}.old-*")):
        if p.name not in listed and _holds_earlier(p, r):
            found.append(StaleTemporary(p, False, _holds_earlier(p, r)))
    return found


def _listed(r: Path) -> list[str]:
    """The temporaries a live claim's file lists."""
    try:
        text = claims.claim_file(r).read_text(errors="replace")
    except OSError:
        return []
    return [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("temporary ")
            and claims.is_temporary_of(ln.split(" ", 1)[1], r.name)]


def _holds_earlier(p: Path, out: Path) -> str:
    if ".old-" in p.name and (p / "x").exists() and not os.path.lexists(out):
        return f"it holds the earlier {out}: move {p / 'x'} back to {out}"
    return ""


def _stale(p: Path, out: Path, remove: bool, alive: bool) -> StaleTemporary:
    why = "a running process is writing it" if alive else _holds_earlier(p, out) or _locked(p)
    if why or not remove:
        return StaleTemporary(p, False, why)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    gone = not os.path.lexists(p)
    return StaleTemporary(p, gone, "" if gone else "could not be removed")


def _locked(p: Path) -> str:
    try:
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


@contextlib.contextmanager
def kept_aside(paths: list[Path]) -> Iterator[None]:
    """Keep each existing file of `paths` (outputs the block replaces: --overwrite) as it was
    until the block's writes are all done: a hard link (else a copy) in a listed `.NAME.old-*`
    temporary, put back if the block fails (an error, Ctrl-C), removed when it succeeds."""
    kept: list[tuple[Path, Claim, Path, int]] = []
    try:
        for p in map(Path, paths):
            if p.is_file() and not p.is_symlink():
                c = claims.claim(p)
                aside, fd = temporary(p, "old", c, directory=True)
                kept.append((p, c, aside, fd))
                try:
                    os.link(p, aside / "x")
                except OSError:
                    shutil.copy2(p, aside / "x")
        yield
    except BaseException:
        for p, _, aside, _ in kept:
            with contextlib.suppress(OSError):
                os.replace(aside / "x", p)
        raise
    finally:
        for p, c, aside, fd in kept:
            os.close(fd)
            if os.path.lexists(p) or not os.path.lexists(aside / "x"):  # never the only copy
                shutil.rmtree(aside, ignore_errors=True)
            c.release()
