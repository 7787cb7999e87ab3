"""One writer per output path, across processes: a command claims every path it writes before
any work and holds the claim for its life (`claim`); a second writer of the path is refused
in one line naming the path and the process that holds it (pid and command).

A claim is a file beside the output, `.NAME.bagpipe-claim`, created if missing and locked
(flock, LOCK_EX|LOCK_NB) by the writer; the kernel drops the lock when the process dies,
however it dies, and a released claim's file is removed. The file names its holder and lists
every temporary the holder made beside NAME (`temporary NAME TOKEN`: `.NAME.tmp-*`,
`.NAME.old-*`), each with the random token written in the mark inside it (MARK). A claim is
a file anyone can write, so its list alone proves nothing: a later run removes a leftover of
a killed run only when the claim lists it AND it is a folder holding bagpipe's mark with the
token listed (`marked`; `io.stale_temporaries`). Nothing is ever removed by its name alone,
nor by a claim's word alone.

A new output is published by a rename that replaces nothing (`rename_noreplace`: renameat2's
RENAME_NOREPLACE, else a hard link, else a rename of a path checked absent under the claim).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bagpipe_cli.errors import ConfigError

SUFFIX = ".bagpipe-claim"
HEADER = "bagpipe-claim 1"
KINDS = ("tmp", "old")  # the temporaries made beside an output: a write's, an output set aside
PROG = "bagpipe"  # the command, as a holder is named
RETRY_S = 0.05  # a lock held only this long is another process's look (`holder`), not a claim
MARK = ".bagpipe-temporary"  # inside every temporary bagpipe makes: `mark_text`
TOKEN_LEN = 16  # hex digits of a temporary's token


def real(p: str | Path) -> Path:
    """`p` absolute, with symlinks and `..` resolved (as far as it exists)."""
    return Path(os.path.realpath(Path(p).expanduser()))


def claim_file(path: str | Path) -> Path:
    """The claim file of output `path`: `.NAME.bagpipe-claim` beside it."""
    r = real(path)
    return r.parent / f".{r.name}{SUFFIX}"


def command() -> str:
    """This process's command line, as a claim names its holder."""
    argv = sys.argv or ["python"]
    prog = Path(argv[0]).name
    prog = PROG if prog in (PROG, "__main__.py") else prog  # (`python -m bagpipe_cli`)
    return shlex.join([prog, *argv[1:]]).replace("\n", " ")[:300]


@dataclass
class Claim:
    """A claim this process holds on an output (`claim`); `release` it when done."""

    path: Path  # the output, absolute and resolved
    file: Path  # its claim file
    fd: int
    option: str  # how the user named the output ("--out"), or "" for a write of the library's
    overwrite: bool  # an existing output may be replaced (the command's --overwrite)
    listed: list[str]  # the temporaries listed in the claim file (a killed holder's first)
    previous: dict[str, str]  # what an earlier holder's claim listed, name -> token ("": none)
    pid: int = field(default_factory=os.getpid)
    count: int = 1  # claims of one path in one process are counted, released by the last

    def record(self, temporary: Path, token: str) -> None:
        """List a temporary made beside the output, with its mark's token (before anything
        is written in it)."""
        self.listed.append(Path(temporary).name)
        with contextlib.suppress(OSError):  # a full disk: the temporary is then unlisted
            os.write(self.fd, f"temporary {Path(temporary).name} {token}\n".encode())

    def release(self) -> None:
        """Drop the claim (the last of this process's on the path). Its file is removed unless
        it still lists a temporary that is there (one that could not be removed)."""
        with _LOCK:
            self.count -= 1
            if self.count > 0:
                return
            if _HELD.get(self.path) is self:
                del _HELD[self.path]
        left = any(os.path.lexists(self.path.parent / n) for n in self.listed)
        if self.pid == os.getpid() and not left:  # (a forked child never removes it)
            with contextlib.suppress(OSError):
                if os.stat(self.file).st_ino == os.fstat(self.fd).st_ino:
                    os.unlink(self.file)
        with contextlib.suppress(OSError):
            os.close(self.fd)


_HELD: dict[Path, Claim] = {}
_LOCK = threading.Lock()


def held(path: str | Path) -> Claim | None:
    """This process's claim on `path`, if it holds one."""
    c = _HELD.get(real(path))
    return c if c is not None and c.pid == os.getpid() else None


def _named(option: str, path: str | Path) -> str:
    return f"{option} {path}" if option else str(path)


def holder_words(text: str) -> str:
    """'pid N: COMMAND' of a claim file's text."""
    fields_ = dict(ln.split(" ", 1) for ln in text.splitlines() if " " in ln)
    return f"pid {fields_.get('pid', 'unknown')}: {fields_.get('command', 'unknown command')}"


def busy_words(option: str, path: str | Path, text: str, where: str = "",
               then: str = "wait for it to end, or choose another path") -> str:
    """The one line a second writer (or a reader: `then` says what to do) gets."""
    return (f"{_named(option, path)}{where} is being written by another bagpipe process "
            f"({holder_words(text)}); {then}")


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 1 << 16, 0).decode("utf-8", "replace")
    except OSError:
        return ""


def _read_holder(fd: int) -> str:
    """A held claim file's text; a holder that has just locked it writes it a moment later."""
    for _ in range(20):
        text = _read(fd)
        if "\npid " in text:
            return text
        time.sleep(0.005)
    return text


def _lock(fd: int, how: int = fcntl.LOCK_EX) -> bool:
    """Lock `fd` without waiting for a writer: True once locked; a lock held a moment (another
    process looking) is waited out for RETRY_S."""
    end = time.monotonic() + RETRY_S
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > end:
                return False
            time.sleep(0.005)


def _acquire(file: Path, option: str, path: str | Path) -> int:
    """The locked claim file's descriptor, or ConfigError naming the holder."""
    for _ in range(100):
        fd = _open_claim(file, option, path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(_in_the_way(option, path, file, "not a regular file, so not "
                                              "bagpipe's claim"))
            if st.st_size and not _read(fd).startswith(HEADER):
                raise ConfigError(_in_the_way(option, path, file, "a file that is not bagpipe's "
                                              "claim"))
            if not _lock(fd):
                raise ConfigError(busy_words(option, path, _read_holder(fd)))
            try:
                if os.stat(file, follow_symlinks=False).st_ino == st.st_ino:
                    return fd  # (else its holder removed it as we locked it: take the new one)
            except FileNotFoundError:
                pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise ConfigError(f"{_named(option, path)}: cannot claim it ({file} keeps changing)")


def _open_claim(file: Path, option: str, path: str | Path) -> int:
    """The claim file, opened (made if missing); a folder or a link there is named as what
    is in the way (an OSError of another cause is raised as is)."""
    try:
        return os.open(file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError:
        try:
            st = os.lstat(file)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ConfigError(_in_the_way(option, path, file, "a symbolic link (to "
                                          f"{os.readlink(file)}), not bagpipe's claim")) from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ConfigError(_in_the_way(option, path, file, "a folder, not bagpipe's "
                                          "claim")) from None
        raise


def _in_the_way(option: str, path: str | Path, file: Path, what: str) -> str:
    return (f"{_named(option, path)}: {file} is {what}; bagpipe keeps its claim on the output "
            "in a file of that name and never replaces what is there: move or rename it, or "
            "choose another output path")


def claim(path: str | Path, option: str = "", overwrite: bool = True,
          nested: bool = False) -> Claim:
    """Claim output `path` for this process (its folder must exist): ConfigError naming the
    holder when another process holds it. A path this process holds already is claimed once
    more (each claim is released). `nested`: refuse too a path inside, or holding, another
    process's claimed output. An OSError (the folder cannot be written) is raised as is."""
    r = real(path)
    with _LOCK:
        c = _HELD.get(r)
        if c is not None and c.pid == os.getpid():
            c.count += 1
            return c
    if nested:
        refuse_claimed_around(r, option, path)
    file = r.parent / f".{r.name}{SUFFIX}"
    fd = _acquire(file, option, path)
    previous = {n: t for n, t in listed_in(_read(fd), r.name).items()
                if os.path.lexists(r.parent / n)}
    kept = {n: t for n, t in previous.items() if marked(r.parent / n, t)}  # the rest: warned of
    body = [HEADER, f"pid {os.getpid()}", f"command {command()}",
            *[f"temporary {n} {t}" for n, t in kept.items()]]
    with contextlib.suppress(OSError):  # a full disk: the lock alone is the claim
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, ("\n".join(body) + "\n").encode())
    c = Claim(r, file, fd, option, overwrite, list(kept), previous)
    with _LOCK:
        _HELD[r] = c
    return c


def listed_in(text: str, output: str) -> dict[str, str]:
    """The temporaries of output `output` a claim file's text lists: name -> its token ("" for
    a line without one, which no temporary of bagpipe's has)."""
    found = {}
    for ln in text.splitlines():
        if not ln.startswith("temporary "):
            continue
        name, token = ln[len("temporary "):], ""
        head, _, tail = name.rpartition(" ")
        if head and len(tail) == TOKEN_LEN and all(ch in "0123456789abcdef" for ch in tail):
            name, token = head, tail
        if is_temporary_of(name, output):
            found[name] = token
    return found


def mark_text(name: str, token: str) -> str:
    """The mark bagpipe writes inside a temporary it makes (MARK), naming it and its token."""
    return f"bagpipe-temporary 1\nname {name}\ntoken {token}\n"


def marked(p: Path, token: str) -> bool:
    """Whether `p` is a folder (not a link) that holds bagpipe's mark (MARK, a regular file)
    naming it and `token`: a temporary bagpipe made, not a folder or file of the user's."""
    if not token:
        return False
    try:
        if not stat.S_ISDIR(os.lstat(p).st_mode):
            return False
        fd = os.open(Path(p) / MARK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, 1024).decode("utf-8", "replace") == mark_text(Path(p).name, token)
    except OSError:
        return False
    finally:
        os.close(fd)


def is_temporary_of(name: str, output: str) -> bool:
    """Whether `name` is a temporary's name for output `output` (a claim lists only those)."""
    return "/" not in name and any(name.startswith(f".{output}.{k}-") for k in KINDS)


def holder(path: str | Path) -> str | None:
    """The claim file text of another live process that holds `path`, or None."""
    r = real(path)
    if held(r) is not None:
        return None
    try:
        fd = os.open(r.parent / f".{r.name}{SUFFIX}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if _lock(fd, fcntl.LOCK_SH):
            return None
        return _read_holder(fd)
    finally:
        os.close(fd)  # (drops the look's shared lock)


def refuse_claimed_around(r: Path, option: str, path: str | Path) -> None:
    """ConfigError when output `r` lies inside, or holds, another process's claimed output."""
    for above in r.parents:
        text = holder(above) if above != above.parent else None
        if text is not None:
            raise ConfigError(busy_words(option, path, text, f" lies inside {above}, which"))
    if r.is_dir() and not r.is_symlink():
        for f in r.rglob(f".*{SUFFIX}"):
            inner = f.parent / f.name[1:-len(SUFFIX)]
            text = holder(inner)
            if text is not None:
                raise ConfigError(busy_words(option, path, text, f" holds {inner}, which"))
