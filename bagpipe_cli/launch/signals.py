"""SIGTERM and SIGHUP end a run the way Ctrl-C does: as an exception, so that every writer's
cleanup (`io.atomic_dir`'s `finally`, a profile's spilled trace, a launcher's child
processes) runs before the process exits.

The command line installs the handlers first thing (`install`); a signal raises
`Terminated` (a `KeyboardInterrupt`, so code that cleans up on Ctrl-C cleans up on it too)
in the main thread. The process then exits with one `Error:` line and the shell's
convention for a death by signal, 128 + N: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129
for SIGHUP (`exit_code`). A second SIGTERM or SIGHUP while the first is being cleaned up is
ignored, so the cleanup finishes; SIGKILL still ends the process at once (its temporaries
are then removed by a later run: `io.stale_temporaries`). A signal the parent ignores
(`nohup`) stays ignored.

Python runs a signal's handler in whatever code the main thread is running, and an exception
raised in a weakref callback or a `__del__` (the import system's module-lock callbacks, at
start-up) is printed as "Exception ignored" and dropped. The interrupt would be lost and the
run go on to exit 0; `install` hooks `sys.unraisablehook` so that such a dropped interrupt is
sent to the main thread again (`_redeliver`), where it raises at the next ordinary line.

What is guaranteed, and from when: `bagpipe` (`bagpipe_cli.__main__.main`, the console
script's and `python -m bagpipe_cli`'s entry) calls `install` first, before click, the
command line or torch load; this module imports only `signal`, `threading` and what the
interpreter has loaded at start-up (tests/test_interrupts.py holds both). From the moment
`install` has set SIGTERM's handler (visible from outside as the SIGTERM bit of `SigCgt`
in /proc/PID/status; SIGHUP's follows on the next line), a SIGTERM or SIGHUP ends the
process with one `Error:` line and 143 or 129 (a second one while the first is being
cleaned up is ignored). One that arrives earlier, while the interpreter itself starts
(and, for the `bagpipe` script, imports `re` and `bagpipe_cli/__init__.py`), meets the
default action: the process dies by the signal (a Popen returncode of -15 or -1; a shell's
$? is 143 or 129 either way) without a line, before any command has read its options or
created anything, so nothing is left behind. A Ctrl-C that early is Python's own
KeyboardInterrupt and traceback (once the interpreter has installed its SIGINT handler) or
a death by SIGINT (before).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms at start-up)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGHUP)
EXIT_CODES = (130, 143, 129)  # what `exit_code` gives: SIGINT, SIGTERM, SIGHUP
_received: list[int] = []


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by `signum` (SIGTERM or SIGHUP)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    if _received:  # the first one is being cleaned up: let that finish
        return
    _received.append(signum)
    raise Terminated(signum)


def install() -> None:
    """Turn SIGTERM and SIGHUP into `Terminated` in this (main) thread. A signal the parent
    ignores stays ignored (`nohup bagpipe ...` keeps running when its terminal closes).
    The hook for dropped interrupts goes in first, so that it is there for the first signal."""
    if sys.unraisablehook is not _unraisable:
        _unraisable.inner = sys.unraisablehook  # type: ignore[attr-defined]
        sys.unraisablehook = _unraisable
    for s in HANDLED:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _raise)


REDELIVER_AFTER_S = 0.02  # the main thread has left the callback that dropped the interrupt


def _unraisable(u) -> None:
    """An interrupt raised where Python can only drop it is delivered again; anything else
    goes to the hook that was there before."""
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        signum = getattr(u.exc_value, "signum", signal.SIGINT)
        threading.Thread(target=_redeliver, args=(signum,), daemon=True).start()
        return
    _unraisable.inner(u)  # type: ignore[attr-defined]


def _redeliver(signum: int) -> None:
    """Send `signum` to the main thread again, from outside the callback that dropped it."""
    import time

    time.sleep(REDELIVER_AFTER_S)
    if signum in _received:
        _received.remove(signum)  # `_raise` takes it as a first signal again
    signal.pthread_kill(threading.main_thread().ident, signum)


def exit_code(e: BaseException) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)


def describe(e: BaseException) -> str:
    """'interrupted' (Ctrl-C) or 'terminated by SIGTERM'."""
    if isinstance(e, Terminated):
        return f"terminated by {signal.Signals(e.signum).name}"
    return "interrupted"


HEAVY = ("torch", "pandas", "pyarrow", "matplotlib", "numpy", "scipy")  # C extensions


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for a block; they arrive when it ends. An interrupt
    inside a C extension's import (torch's) can abort the process instead of raising."""
    mask = {signal.SIGINT, *HANDLED}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _DeferredLoader:
    """A heavy module's loader, run with the signals held. (A loader as importlib reads one:
    `create_module` and `exec_module`; not derived from `importlib.abc.Loader`, whose import
    costs more than the rest of this module, before the handlers are in place.)"""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        with deferred():
            self.inner.exec_module(module)

    def __getattr__(self, name: str):  # resource readers, get_data, ...: the inner loader's
        return getattr(self.inner, name)


class _DeferredImports:
    """A meta path finder: imports of the HEAVY packages (their top modules, where their C
    parts load) run with the signals held: Ctrl-C while torch loads is one line, not an
    abort."""

    def find_spec(self, name, path, target=None):
        if name not in HEAVY:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _DeferredLoader(spec.loader)
                return spec
        return None


def defer_heavy_imports() -> None:
    """Install the import hook (once, for the command line's process)."""
    if not any(isinstance(f, _DeferredImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredImports())
