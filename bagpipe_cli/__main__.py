"""`python -m bagpipe_cli` (and the `bagpipe` script): the command line, with an interrupt
during start-up (before the command line has loaded) one line too."""

import sys


def main() -> None:
    from bagpipe_cli import signals

    signals.install()
    signals.defer_heavy_imports()
    try:
        from bagpipe_cli.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt as e:  # while the command line loads
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
