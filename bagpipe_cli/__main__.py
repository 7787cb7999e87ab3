"""`python -m bagpipe_cli` (and the `bagpipe` script): the command line, with an interrupt
during start-up (before the command line has loaded) one line too."""

import sys


def main() -> None:
    from bagpipe_cli import signals

    signals.install()
    try:
        from bagpipe_cli.cli import main as cli_main
    except KeyboardInterrupt as e:
        sys.stderr.write(f"Error: {signals.describe(e)}\n")
        sys.exit(signals.exit_code(e))
    cli_main()


if __name__ == "__main__":
    main()
