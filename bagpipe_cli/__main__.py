"""`python -m bagpipe_cli` (and the `bagpipe` script, setup.cfg's console_scripts entry
`bagpipe_cli.__main__:main`): the command line, with an interrupt during start-up (before
the command line has loaded) one line too.

The signal handlers are the first thing `main` sets up, inside the `try` (a signal during
`install` itself is one line too): this module imports only `sys`, and `signals` only light
standard modules, so the handlers are in place before click, the command modules or torch
load. What a signal before that does is in `bagpipe_cli/launch/signals.py`'s docstring."""

import sys


def main() -> None:
    try:
        from bagpipe_cli.launch import signals  # the standard library's light modules only

        signals.install()
        signals.defer_heavy_imports()
        from bagpipe_cli.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt as e:  # while the command line loads (install's own lines too)
        from bagpipe_cli.launch import signals

        sys.stderr.write(f"Error: {signals.describe(e)}\n")
        _exit(signals.exit_code(e))
    except SystemExit as e:
        if e.code in signals.EXIT_CODES:
            _exit(e.code)
        raise


def _exit(code: int) -> None:
    """Exit with `code` after an interrupt. CPython, having seen a KeyboardInterrupt, may end
    the process with SIGINT at shutdown whatever the exit status: the atexit work is done
    here, then the process exits with the status the shell convention gives (130, 143, 129)."""
    import atexit
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    main()
