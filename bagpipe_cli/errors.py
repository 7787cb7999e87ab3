"""Errors the library raises for a user to act on (the CLI prints them as one line)."""


class BagpipeError(Exception):
    """A failure the user can act on; `exit_code` 1 (runtime) unless a subclass says otherwise."""

    exit_code = 1


class ConfigError(BagpipeError):
    """A bad option, argument or input value: exit code 2, like a usage error.

    The message should name the option or the file (and line) to change.
    """

    exit_code = 2


class RankFailure(BagpipeError):
    """Another rank of a job died or could not be reached."""


class DataError(BagpipeError):
    """Input data that cannot be read: a corrupt/foreign dataset or a malformed input line."""

    exit_code = 2
