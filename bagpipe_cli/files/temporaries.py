"""Temporaries beside an output: each made listed in the output's claim (`temporary`), a new
output published by a rename that replaces nothing (`rename_noreplace`), an earlier file kept
aside until a command's outputs are all written (`keep_aside`), and a killed run's leftovers
found and removed (`stale_temporaries`).

Every temporary is a folder, `.NAME.KIND-HEX/`, holding bagpipe's mark (`claims.MARK`: its
name and a random token, which the claim lists beside the name) and what is being written, at
PAYLOAD (`x`): the new folder or file, or an earlier output set aside. A file's temporary is a
folder too, so that it can carry the mark: nothing can be added to a file that is the output
itself, and a mark in its name alone is a name anyone can give. A leftover is removed only
when a killed run's claim lists it and it holds the mark with the token listed; anything else
(a user's `.NAME.tmp-mine`, which a claim file, writable by anyone, may list) is left and
named.
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

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files import claims
from bagpipe_cli.files.claims import Claim, real

PAYLOAD = "x"  # in a temporary folder: what is being written, or an output set aside


def temporary(out: str | Path, kind: str, c: Claim) -> tuple[Path, int]:
    """Make a temporary beside output `out` (`.NAME.KIND-*`): a folder holding bagpipe's mark,
    listed in its claim `c` with the mark's token, and locked (flock) by this process while
    the returned descriptor is open. The caller puts PAYLOAD in it."""
    r = real(out)
    for _ in range(100):
        p = r.parent / f".{r.name}.{kind}-{secrets.token_hex(4)}"
        try:
            os.mkdir(p, 0o777)
        except FileExistsError:
            continue
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except BaseException:
            os.rmdir(p)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            token = secrets.token_hex(claims.TOKEN_LEN // 2)
            c.record(p, token)  # (listed first: a mark-less leftover is named, never lost)
            _write_mark(fd, p.name, token)
        except BaseException:
            discard(p, fd)
            raise
        return p, fd
    raise OSError(errno.EEXIST, "cannot make a temporary", str(r.parent))


def _write_mark(fd: int, name: str, token: str) -> None:
    m = os.open(claims.MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o666, dir_fd=fd)
    try:
        os.write(m, claims.mark_text(name, token).encode())
    finally:
        os.close(m)


def discard(p: Path, fd: int) -> None:
    """Close a temporary's descriptor and remove it, with anything left in it."""
    os.close(fd)
    shutil.rmtree(p, ignore_errors=True)


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
    earlier writes killed midway, each removed (with `remove`) when safe: it holds bagpipe's
    mark with the token the claim lists (`claims.marked`), no process holds it and it is not
    the only copy of an earlier output (a `.old-*` folder of a run killed between two renames,
    named even when no claim lists it). Those of a process still writing `out` are named and
    left alone, and so is anything without the mark: never a path by its name or a claim's
    word alone (a user's `.NAME.tmp-mine`)."""
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
    listed = dict(c.previous) if c is not None else _listed(r) if alive else {}
    try:
        found = [_stale(r.parent / n, r, remove, alive, t) for n, t in listed.items()
                 if os.path.lexists(r.parent / n)]
    finally:
        if mine is not None:
            mine.release()
    for p in sorted(r.parent.glob(f".{r.name}.old-*")):
        if p.name not in listed and _holds_earlier(p, r):
            found.append(StaleTemporary(p, False, _holds_earlier(p, r)))
    return found


def _listed(r: Path) -> dict[str, str]:
    """The temporaries a live claim's file lists."""
    try:
        text = claims.claim_file(r).read_text(errors="replace")
    except OSError:
        return {}
    return claims.listed_in(text, r.name)


def _holds_earlier(p: Path, out: Path) -> str:
    if ".old-" in p.name and (p / PAYLOAD).exists() and not os.path.lexists(out):
        return f"it holds the earlier {out}: move {p / PAYLOAD} back to {out}"
    return ""


UNMARKED = "not bagpipe's"  # a StaleTemporary's `why` when it lacks the mark (`claims.marked`)


def _stale(p: Path, out: Path, remove: bool, alive: bool, token: str) -> StaleTemporary:
    why = ("a running process is writing it" if alive else _holds_earlier(p, out)
           or ("" if claims.marked(p, token) else UNMARKED) or _locked(p))
    if why or not remove:
        return StaleTemporary(p, False, why)
    shutil.rmtree(p, ignore_errors=True)  # (a marked folder, never a link)
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
                aside, fd = temporary(p, "old", c)
                kept.append((p, c, aside, fd))
                try:
                    os.link(p, aside / PAYLOAD)
                except OSError:
                    shutil.copy2(p, aside / PAYLOAD)
        yield
    except BaseException:
        for p, _, aside, _ in kept:
            with contextlib.suppress(OSError):
                os.replace(aside / PAYLOAD, p)
        raise
    finally:
        for p, c, aside, fd in kept:
            os.close(fd)
            if os.path.lexists(p) or not os.path.lexists(aside / PAYLOAD):  # never the only copy
                shutil.rmtree(aside, ignore_errors=True)
            c.release()
