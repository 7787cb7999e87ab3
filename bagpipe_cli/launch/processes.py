"""Starting a job's ranks as local processes, and reporting one cause when a rank fails.

Used by `--procs` (the engine's ranks) and by the TorchRec runner (its trainers): each rank
is `command` with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set, as
torchrun would set them, on loopback.

The launcher owns Ctrl-C: a terminal sends SIGINT to every process of its foreground group,
the ranks too, and a rank still importing torch would print its traceback. A rank's `-c`
program therefore starts by ignoring SIGINT (`IGNORE_SIGINT`); the launcher, interrupted,
stops its ranks (SIGTERM, which they handle as Ctrl-C: `signals`) and passes on no more of
their output, so the one line is the launcher's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from bagpipe_cli.errors import BagpipeError, RankFailure
from bagpipe_cli.launch import forkserver
from bagpipe_cli.launch.forkserver import ForkedProcess
from bagpipe_cli.launch.netshape import ShapedNetwork

STOP_GRACE_S = 3.0  # a rank asked to stop (SIGTERM) has this long before SIGKILL
RANKS_PREFIX = "bagpipe-ranks-"  # a job's folder in the temporary directory (`rank_folder`)
OWNER = "owner"  # in it: its launcher's pid, locked (flock) by the launcher while it lives
IGNORE_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # a rank's first line


class RankError(BagpipeError):
    """A rank of a local job failed: its own error (exit code 2 for bad options or input)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code if exit_code in (1, 2, 130) else 1


def free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


@dataclass(frozen=True)
class Machine:
    """This machine's part of a job on several (--master, --node-rank, --procs): ranks
    first..first+procs-1, meeting at addr:port."""

    addr: str
    port: int
    first: int
    procs: int


def rank_env(rank: int, world: int, m: Machine) -> dict[str, str]:
    """The environment of rank `rank` of a job whose ranks `m` runs here: what torchrun sets."""
    return {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank - m.first), "LOCAL_WORLD_SIZE": str(m.procs),
            "MASTER_ADDR": m.addr, "MASTER_PORT": str(m.port),
            # c10d's own socket errors (with C++ stacks); our one-line errors say what failed
            "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "FATAL")}


class _Job:
    """The processes of one job and the one-line errors ("Error: ...") they printed."""

    def __init__(self, command: list[str], world: int, on_line: Callable[[str], None] | None,
                 shaped: ShapedNetwork | None = None, machine: Machine | None = None):
        m = machine or Machine("127.0.0.1", free_port(), 0, world)
        self.errors: list[tuple[int, str]] = []  # (rank, message) in the order they came
        self.stopped: set[int] = set()  # ranks this job ended (SIGTERM, then SIGKILL)
        self.procs: dict[int, subprocess.Popen | ForkedProcess] = {}  # by rank: this machine's
        self.readers: list[threading.Thread] = []
        self.interrupted = False  # the launcher was: the ranks' output is no longer passed on
        if command[1:2] == ["-c"]:
            command = [command[0], "-c", IGNORE_SIGINT + command[2], *command[3:]]
        try:
            self._start(command, world, on_line, shaped, m)
        except BaseException:  # (Ctrl-C as they start: those started are stopped)
            self.interrupted = True
            self._stop()
            raise

    def _start(self, command: list[str], world: int, on_line: Callable[[str], None] | None,
               shaped: ShapedNetwork | None, m: Machine) -> None:
        for rank in range(m.first, m.first + m.procs):
            out = subprocess.DEVNULL if rank else subprocess.PIPE if on_line else None
            cmd, env = command, rank_env(rank, world, m)
            if shaped is not None:  # the rank in its namespace, rank 0 at its address there
                cmd, env = shaped.command(rank, command), {**env, **shaped.env(rank)}
            server = forkserver.connect() if shaped is None and cmd[1:2] == ["-c"] else None
            if server is not None:  # forked with torch and the engine imported already
                p = ForkedProcess(server, cmd[2], ["-c", *cmd[3:]], env, out)
            else:
                p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE, text=True)
            self.procs[rank] = p
            self.readers.append(threading.Thread(target=self._relay, args=(rank, p.stderr), daemon=True))
        if on_line is not None and m.first == 0:
            self.readers.append(threading.Thread(
                target=lambda: [on_line(x) for x in self.procs[0].stdout], daemon=True))
        for t in self.readers:
            t.start()

    def _relay(self, rank: int, stream) -> None:
        for line in stream:
            if line.startswith("Error: "):
                self.errors.append((rank, line[len("Error: "):].rstrip("\n")))
            elif not self.interrupted:
                sys.stderr.write(line)

    def wait(self, grace_s: float, run_timeout_s: float | None = None) -> tuple[int, int] | None:
        """Wait for every process; after the first failure the others get `grace_s` to notice
        before they are killed. Returns (rank, exit code) of the first failure, or None.
        Past `run_timeout_s` every process is killed and RankFailure raised."""
        failed: tuple[int, int] | None = None
        deadline = None
        end = None if run_timeout_s is None else time.monotonic() + run_timeout_s
        try:
            while any(p.poll() is None for p in self.procs.values()):
                for rank, p in self.procs.items():
                    if p.poll() not in (None, 0) and failed is None:
                        failed = (rank, p.returncode)
                        deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    break
                if end is not None and time.monotonic() > end:
                    raise RankFailure(f"the job ran past {run_timeout_s:g} s; its processes were killed")
                time.sleep(0.05)
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        finally:
            self._stop()
            for t in self.readers:
                t.join(timeout=5)
        if failed is None:
            failed = next(((r, p.returncode) for r, p in self.procs.items() if p.returncode), None)
        return failed

    def _stop(self) -> None:
        """End the processes still running: SIGTERM first, so that each removes its
        temporaries and exits, then SIGKILL for any still there after STOP_GRACE_S."""
        running = [p for p in self.procs.values() if p.poll() is None]
        self.stopped = {r for r, p in self.procs.items() if p in running}
        for p in running:
            p.terminate()
        end = time.monotonic() + STOP_GRACE_S
        while any(p.poll() is None for p in running) and time.monotonic() < end:
            time.sleep(0.02)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()

    def cause(self, failed: tuple[int, int], name_of: Callable[[int], str]) -> BagpipeError:
        """One error for the failed job: which rank died without an error of its own (killed,
        crashed) and what another rank saw; else the first error a rank gave of its own (not
        "lost contact with ...")."""
        said = {r for r, _ in self.errors}
        silent = [r for r, p in self.procs.items()
                  if p.returncode and r not in said and r not in self.stopped]
        if silent:
            rank = failed[0] if failed[0] in silent else silent[0]
            seen = next(((r, m) for r, m in self.errors if r != rank), None)
            return RankFailure(f"{name_of(rank)} exited with code {self.procs[rank].returncode}"
                               + (f"; {name_of(seen[0])}: {seen[1]}" if seen else ""))
        rank, message = next(((r, m) for r, m in self.errors if not m.startswith("lost contact with")),
                             self.errors[0])
        return RankError(message, self.procs[rank].returncode)


def spawn_local(command: list[str], world: int, name_of: Callable[[int], str], timeout_s: float,
                on_line: Callable[[str], None] | None = None, run_timeout_s: float | None = None,
                shaped: ShapedNetwork | None = None, machine: Machine | None = None) -> None:
    """Run `command` as `world` local processes, one per rank, over loopback (or this
    `machine`'s part of them, meeting the other machines' at its address). Rank 0's stdout
    lines go to `on_line` (the others' stdout is dropped); the ranks' stderr is passed through,
    except their one-line errors ("Error: ..."), which are collected.

    If a rank fails, the others get `timeout_s` plus a grace period to notice (they exit with
    an error naming the lost role) before they are killed; then one error is raised
    (`_Job.cause`). `name_of(rank)` names a rank in it. `run_timeout_s` bounds the whole job;
    with `shaped` every rank runs in its namespace of that shaped network.
    """
    job = _Job(command, world, on_line, shaped, machine)
    failed = job.wait(timeout_s + 10, run_timeout_s)
    if failed is not None:
        raise job.cause(failed, name_of)


@contextlib.contextmanager
def rank_folder(where: str | Path | None = None) -> Iterator[Path]:
    """A job's folder in the temporary directory (`bagpipe-ranks-*`: what the ranks read, rank
    0's result), removed when the job ends; marked as this launcher's by an `owner` file naming
    its pid, which it locks while it lives. The folders of launchers killed outright (SIGKILL)
    are removed first (`remove_dead_rank_folders`)."""
    remove_dead_rank_folders(where)
    folder = Path(tempfile.mkdtemp(prefix=RANKS_PREFIX, dir=where))
    fd = os.open(folder / OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield folder
    finally:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)


def remove_dead_rank_folders(where: str | Path | None = None) -> list[Path]:
    """Remove the job folders (`rank_folder`) whose launcher is dead: marked by an owner file
    that no process locks, naming a pid that no longer runs. A folder without the mark is
    never touched. Returns those removed."""
    removed = []
    for folder in Path(where or tempfile.gettempdir()).glob(f"{RANKS_PREFIX}*"):
        if folder.is_symlink() or not (folder / OWNER).is_file():
            continue
        try:
            fd = os.open(folder / OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if pid.isdigit() and not _running(int(pid)):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
        except BlockingIOError:  # its launcher holds it: alive
            pass
        finally:
            os.close(fd)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
