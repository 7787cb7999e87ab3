"""The one rule for every path a command writes (`check_output`), checked before any work.

Nothing of the user's is replaced without --overwrite; a symbolic link, device, FIFO or
socket never is, nor an input, nor a bagpipe folder of another kind (known by the file it
holds: FOLDER_MARKS). One process writes a path at a time: the command claims it before the
checks that depend on what is there (`claim_output`; `claims`), and an input another process
is writing is refused (`check_inputs_free`). The writes themselves (to a temporary, renamed
into place) are `io.atomic_dir` and `io.atomic_file`. `cli.common.check_outputs` applies the
rule to every parameter a command declares an output (`OutputPath`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files import claims
from bagpipe_cli.files.claims import Claim


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


# The folders bagpipe writes, each known by a file it holds. An output never writes over or
# into a folder that holds one of another kind (a run's --out over a dataset, checkpoints in
# a run folder...).
FOLDER_MARKS = {"dataset": "meta.json", "run": "summary.json", "bench": "bench.json",
                "profile": "profile.json", "report": "report.json", "simulation": "simulate.json",
                "advice": "advice.json"}
CHECKPOINTS = "checkpoints"  # a folder of ckpt-NNNNNNNN folders (engine/records/checkpoint.py)
FILE = "file"


@dataclass(frozen=True)
class Output:
    """A path a command writes: a file (`makes` FILE), a folder of one kind, replaced whole
    (`makes` one of FOLDER_MARKS, or None: any), or a folder written into and kept (CHECKPOINTS)."""

    option: str  # how the user named it: "--out", "--save-model", ...
    path: Path
    makes: str | None = None


def folder_kind(path: Path) -> str | None:
    """The kind of bagpipe folder `path` is (FOLDER_MARKS, or CHECKPOINTS), or None."""
    path = Path(path)
    for kind, mark in FOLDER_MARKS.items():
        if (path / mark).is_file():
            return kind
    if path.is_dir() and any(p.name.startswith("ckpt-") and p.name[5:].isdigit()
                             for p in path.iterdir()):
        return CHECKPOINTS
    return None


# What a failed write's error number means, where its words alone do not say it.
CAUSES = {errno.ENOSPC: " (the disk is full)", errno.EDQUOT: " (a disk quota is used up)",
          errno.ELOOP: " (a symbolic link loop)", errno.EROFS: "", errno.EACCES: "",
          errno.EPERM: "", errno.ENAMETOOLONG: ""}


def os_error_words(e: OSError) -> str:
    """An OSError's cause in words: its strerror, and what it means (CAUSES)."""
    return f"{e.strerror or e}{CAUSES.get(e.errno, '')}"


def special(path: Path) -> str | None:
    """What `path` is when it is neither a regular file nor a folder (a symbolic link, a
    device, a FIFO, a socket), in words; None for those, or for no path at all. An OSError
    other than a missing path (a symlink loop above it, a name too long) is raised."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"a symbolic link (to {os.readlink(path)})"
    for test, what in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(st.st_mode):
            return what
    return None


def check_output(out: Output, overwrite: bool = False, inputs: Iterable[Input] = (),
                 grow: bool = False, fix: str = "pass --overwrite to replace it",
                 claim: bool = False) -> Claim | None:
    """The one rule for every path a command writes, checked before any work (the error
    names the option):

    - a symbolic link, device, FIFO or socket is never replaced;
    - it is not, does not hold and does not lie inside an input (`check_not_input`), nor is
      it the working directory or a folder above it;
    - with `claim`, it is claimed for this process (`claim_output`: no other process writes
      it, or a folder it lies inside or holds), and the claim returned; the checks below
      then hold until the claim is released;
    - an existing file, or a non-empty folder, is replaced only with `overwrite`; a folder
      that holds a bagpipe folder of another kind (`folder_kind`) never is;
    - a folder written into and kept (CHECKPOINTS, or `grow`: a bench --resume continues)
      holds nothing but its own kind;
    - its folder can be made and written.

    `fix` says how to replace an existing output (the command's own way).

    Writes then go to a temporary sibling renamed into place (`atomic_dir`, `atomic_file`).
    Nothing is touched but a missing parent folder, which is made (and the claim's file)."""
    check_where(out, inputs)
    c = claim_output(out, overwrite) if claim else None
    try:
        check_what(out, overwrite, grow, fix, probe=c is None)
    except BaseException:
        if c is not None:
            c.release()
        raise
    return c


def check_where(out: Output, inputs: Iterable[Input] = ()) -> None:
    """The part of `check_output` that does not depend on what is at the path: not a link,
    device, FIFO or socket; not an input, the working directory or a folder above it."""
    path, option, makes = Path(out.path), out.option, out.makes
    try:
        what = special(path)
    except OSError as e:
        raise ConfigError(f"{option} {path}: {os_error_words(e)}") from None
    if what is not None:
        raise ConfigError(f"{option} {path} is {what}, which bagpipe never replaces; give the "
                          "path of a new file or folder")
    if makes != FILE:
        _check_cwd(path, option)
    check_not_input(path, inputs, option)


def check_what(out: Output, overwrite: bool = False, grow: bool = False,
               fix: str = "pass --overwrite to replace it", probe: bool = True) -> None:
    """The part of `check_output` that depends on what is at the path (checked under its
    claim): replaced only with `overwrite`, never a folder of another kind; can be written."""
    path, option, makes = Path(out.path), out.option, out.makes
    if makes == FILE:
        if path.is_dir():
            raise ConfigError(f"{option} {path} is a directory; give a file name")
        if path.exists() and not overwrite:
            raise ConfigError(f"{option} {path} exists; {fix}")
        _check_parent(path, option, probe)
        return
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        kind = folder_kind(path)
        kept = grow or makes == CHECKPOINTS
        if makes is not None and kind != makes and (kind is not None or kept):
            held = f"a {kind} ({FOLDER_MARKS.get(kind, 'ckpt-* folders')})" if kind else "other files"
            raise ConfigError(f"{option} {path} holds {held}; a {makes} is never written over "
                              "or into it: choose another folder")
        if kept:
            _probe(path, path, option)
            return
        if not overwrite:
            raise ConfigError(f"{option} {path} exists and is not empty; {fix}")
    _check_parent(path, option, probe)


def claim_output(out: Output, overwrite: bool = False) -> Claim:
    """Claim `out` for this process (`claims.claim`), its missing folder made first: a path
    another process writes, or one inside or holding another process's output, is refused
    in one line naming that process. Release the claim when the command ends."""
    path = Path(out.path)
    _make_parent(path, out.option)
    try:
        return claims.claim(path, out.option, overwrite, nested=True)
    except OSError as e:
        raise ConfigError(f"{out.option} {path}: cannot write in {_real(path).parent}: "
                          f"{os_error_words(e)}") from None


def check_inputs_free(inputs: Iterable[Input], then: Callable[[Path], str] | None = None) -> None:
    """Refuse an input that another process is writing (a bench folder a bench still fills,
    checkpoints a run still writes), or that lies inside one. `then(path written)`: what
    to do, in words (default: wait, or choose another path)."""
    for inp in inputs:
        for p in (_real(inp.path), *_real(inp.path).parents):
            text = claims.holder(p) if p != p.parent else None
            if text is not None:
                where = "" if p == _real(inp.path) else f" lies inside {p}, which"
                words = {"then": then(p)} if then is not None else {}
                raise ConfigError(claims.busy_words(inp.option, inp.path, text, where, **words))


def _check_cwd(out: Path, option: str) -> None:
    o = _real(out)
    try:
        cwd = _real(Path.cwd())
    except OSError:  # the working directory was removed: it cannot be the output
        return
    if o == cwd or o in cwd.parents:
        what = ("the working directory" if o == cwd
                else f"a folder above the working directory {cwd}")
        raise ConfigError(f"{option} {out} is {what}, which the output would replace: choose a "
                          "new folder for it")


def check_output_dir(out: Path, overwrite: bool, option: str = "--out",
                     inputs: Iterable[Input] = ()) -> None:
    """`check_output` of a folder replaced whole, of any kind."""
    check_output(Output(option, Path(out)), overwrite, inputs)


MAX_NEW_FOLDERS = 64  # missing folders above an output that a command makes (`make_folders`)


def make_folders(folder: Path, option: str = "", out: Path | None = None) -> None:
    """Make `folder` and its missing parents (as `mkdir -p`, without recursion): at most
    MAX_NEW_FOLDERS of them; deeper is refused in one line naming `option` and `out`."""
    folder, missing = Path(folder), []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    if len(missing) > MAX_NEW_FOLDERS:
        shown = str(out if out is not None else missing[0])
        shown = shown if len(shown) <= 120 else f"{shown[:50]}...{shown[-50:]}"
        raise ConfigError(f"{option + ' ' if option else ''}{shown}: {len(missing):,} folders "
                          f"would have to be made below {folder}, more than the "
                          f"{MAX_NEW_FOLDERS} bagpipe makes: make them first (mkdir -p) or "
                          "choose a shallower path")
    for f in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(f)


def _make_parent(out: Path, option: str) -> Path:
    parent = _real(out).parent
    if not parent.exists():
        # Creating missing parents is what a user expects of `--out a/b/c`.
        try:
            make_folders(parent, option, out)
        except OSError as e:
            raise ConfigError(f"{option} {out}: cannot create its folder {parent}: "
                              f"{e.strerror or e}") from None
    if not parent.is_dir():
        raise ConfigError(f"{option} {out}: {parent} is not a directory")
    return parent


def _check_parent(out: Path, option: str, probe: bool = True) -> None:
    parent = _make_parent(out, option)
    if probe:  # (a claim's file made there was the probe)
        _probe(parent, out, option)


def _probe(folder: Path, out: Path, option: str) -> None:
    """Make and remove a folder in `folder`: what the write will do (access() says yes to root
    where the file system still says no, as in /proc or on a read-only mount)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{Path(out).name}.probe-", dir=folder))
    except OSError as e:
        raise ConfigError(f"{option} {out}: cannot write in {folder}: {os_error_words(e)}") from None
