"""Starting a local job's ranks without importing torch again for each: a fork server.

A rank process spends about 2 CPU-seconds importing torch and the engine before it does
anything; a job of 5 ranks on a 2-core machine, 5 seconds. A fork server imports them once
and forks each rank from itself: the rank starts with everything imported. It serves any
number of clients (every `bagpipe` process whose environment names its socket in
`BAGPIPE_FORKSERVER`), so a test session starts one and every `--procs` job in it, in
process or in a `bagpipe` subprocess, forks from it.

    client (launch/processes.py)        server (`serve`, one process)
    spawn(argv, env, stdout, stderr) -> fork; the child takes the two descriptors as its
                                        stdout and stderr, the environment, the working
                                        directory and argv, and runs the `-c` program
    ForkedProcess.poll/wait/kill     <- the child's exit status, sent when it is reaped

The server never runs a torch operation (it only imports), so no thread pool exists to be
broken by fork, and it never touches CUDA (a child may). A client that goes away has its
ranks killed. Ranks in network namespaces (`--net-shape`) are started as processes.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

ENV = "BAGPIPE_FORKSERVER"  # the socket of a running server: local jobs fork their ranks there
PRELOAD = ("torch", "bagpipe_cli.engine.distributed.runtime")
_MAX = 1 << 16  # bytes of a request or reply


def _send(sock: socket.socket, obj: Any, fds: list[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(obj).encode()], list(fds))


# ---------------------------------------------------------------------------- the server


_OPEN: list[socket.socket] = []  # the server's sockets, which a forked rank closes


def serve(path: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Import `preload`, listen on `path`, fork ranks for clients until SIGTERM."""
    # What a rank's environment sets for torch's C++ side is read when torch loads: here.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # c10d's socket errors: ours say what failed
    for m in preload:
        importlib.import_module(m)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    clients: list[socket.socket] = []
    _OPEN.append(listener)
    owner: dict[int, socket.socket] = {}  # child pid -> the client that asked for it
    try:
        while True:
            ready, _, _ = select.select([listener, *clients], [], [], 0.02)
            for s in ready:
                if s is listener:
                    clients.append(listener.accept()[0])
                    _OPEN.append(clients[-1])
                elif not _serve_request(s, owner):
                    clients.remove(s)
                    _OPEN.remove(s)
                    _drop(s, owner)
            _reap(owner)
    finally:
        for pid in owner:
            _kill(pid)
        os.unlink(path)


def _serve_request(client: socket.socket, owner: dict[int, socket.socket]) -> bool:
    """Fork the rank a client asks for; False when the client has gone."""
    try:
        msg, fds, _, _ = socket.recv_fds(client, _MAX, 2)
    except OSError:
        return False
    if not msg:
        return False
    req = json.loads(msg)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(req, fds)  # never returns
    for fd in fds:
        os.close(fd)
    owner[pid] = client
    _send(client, {"pid": pid})
    return True


def _child(req: dict, fds: list[int]) -> None:
    code = 1
    try:
        for sock in _OPEN:
            sock.close()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        tempfile.tempdir = None  # the caller's TMPDIR, not the server's
        os.chdir(req["cwd"])
        sys.argv = req["argv"]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        exec(compile(req["program"], "<rank>", "exec"), {"__name__": "__main__"})
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught error ends a process
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(owner: dict[int, socket.socket]) -> None:
    while owner:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        client = owner.pop(pid, None)
        if client is not None:
            try:
                _send(client, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass


def _drop(client: socket.socket, owner: dict[int, socket.socket]) -> None:
    """A client that went away: its ranks go too."""
    for pid, c in list(owner.items()):
        if c is client:
            _kill(pid)
    client.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def start(path: str, timeout_s: float = 120.0) -> subprocess.Popen:
    """A server listening on `path` (a new process); stop it with `.terminate()`."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from bagpipe_cli.launch.forkserver "
                             "import serve; serve(sys.argv[1])", path])
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise OSError(f"the fork server at {path} did not start")
        time.sleep(0.05)
    return proc


# ---------------------------------------------------------------------------- clients


class ForkServer:
    """A client's connection to the server at `path` (one per process, `connect()`)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.connect(path)
        self._cond = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="forkserver", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(_MAX)
            except OSError:
                msg = b""
            with self._cond:
                if not msg:  # the server is gone: what it ran is lost
                    for pid in self._pids:
                        self._exits.setdefault(pid, -signal.SIGKILL)
                    self._cond.notify_all()
                    return
                obj = json.loads(msg)
                if "pid" in obj:
                    self._pids.append(obj["pid"])
                else:
                    self._exits[obj["exit"]] = obj["code"]
                self._cond.notify_all()

    def spawn(self, program: str, argv: list[str], env: dict[str, str], stdout: int,
              stderr: int) -> int:
        """Fork a rank running `program` (python -c) with these descriptors; its pid."""
        with self._cond:
            known = len(self._pids)
            _send(self.sock, {"program": program, "argv": argv, "env": env, "cwd": os.getcwd()},
                  [stdout, stderr])
            self._cond.wait_for(lambda: len(self._pids) > known, timeout=30)
            if len(self._pids) == known:
                raise OSError("the fork server did not answer")
            return self._pids[known]

    def returncode(self, pid: int, timeout: float | None = 0.0) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout=timeout)
            return self._exits.get(pid)


_CLIENT: ForkServer | None = None


def connect() -> ForkServer | None:
    """This process's connection to the server its environment names (None: none)."""
    global _CLIENT
    path = os.environ.get(ENV)
    if not path:
        return None
    if _CLIENT is None:
        try:
            _CLIENT = ForkServer(path)
        except OSError:
            return None
    return _CLIENT


class ForkedProcess:
    """A rank forked by the server, with the part of `subprocess.Popen`'s interface a job
    uses: poll, wait, kill, returncode and the pipes it reads (stdout, stderr)."""

    def __init__(self, server: ForkServer, program: str, argv: list[str], env: dict[str, str],
                 stdout: Any, text: bool = True):
        err_r, err_w = os.pipe()
        out_r = out_w = None
        if stdout is subprocess.PIPE:
            out_r, out_w = os.pipe()
        elif stdout is subprocess.DEVNULL:
            out_w = os.open(os.devnull, os.O_WRONLY)
        try:
            self.pid = server.spawn(program, argv, env, out_w if out_w is not None else 1, err_w)
        finally:
            os.close(err_w)
            if out_w is not None:
                os.close(out_w)
        self.server = server
        self.stderr = os.fdopen(err_r, "r" if text else "rb")
        self.stdout = os.fdopen(out_r, "r" if text else "rb") if out_r is not None else None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(["rank"], timeout)
        return self.returncode

    def kill(self) -> None:
        _kill(self.pid)

    def terminate(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
