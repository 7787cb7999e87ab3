"""Shared CLI plumbing: error translation, option decorators, progress bars, output."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bagpipe_cli import signals
from bagpipe_cli.errors import BagpipeError
from bagpipe_cli.io import Input, check_output_dir, stale_temporaries


def _console(stderr: bool = False) -> Console:
    """A console; written to a file or pipe (a log, CI) without COLUMNS set, 120 columns wide
    rather than rich's 80, so that result tables keep one line a row."""
    c = Console(stderr=stderr)
    return c if c.is_terminal or os.environ.get("COLUMNS") else Console(stderr=stderr, width=120)


console = _console()
err_console = _console(stderr=True)


class OneLineError(click.ClickException):
    """A user-facing error: printed as one `Error: ...` line on stderr, with an exit code."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def translate_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors, OS errors and interrupts (Ctrl-C, SIGTERM, SIGHUP: `signals`) into
    one clear line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BagpipeError as e:
            raise OneLineError(str(e), e.exit_code) from None
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            raise OneLineError(f"{where}{e.strerror or e}", 1) from None
        except MemoryError:
            raise OneLineError("out of memory; use a smaller --batch-size or dataset", 1) from None
        except KeyboardInterrupt as e:
            raise OneLineError(f"{signals.describe(e)}; no output was written (checkpoints already "
                               "written are kept)", signals.exit_code(e)) from None

    return wrapper


class SectionOption(click.Option):
    """An option shown under its `section`'s heading in a sectioned command's help
    (`cli.options.SectionedCommand`); other commands show it as any option."""

    def __init__(self, *args: Any, section: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.section = section


def check_out(out: Path, overwrite: bool, inputs: list[Input] | tuple[Input, ...] = (),
              option: str = "--out") -> None:
    """Before any work: refuse an output that would replace or alter an input, the working
    directory, or an existing output without --overwrite (`io.check_output_dir`); name the
    temporaries that earlier killed runs left next to it, removing those that are safe to."""
    check_output_dir(out, overwrite, option, inputs)
    warn_stale(out)


def warn_stale(out: Path) -> None:
    """One warning line per temporary an earlier killed run left next to `out`."""
    for t in stale_temporaries(out):
        if t.removed:
            click.echo(f"Warning: removed {t.path}, a temporary that an earlier run left when it "
                       "was killed", err=True)
        else:
            click.echo(f"Warning: {t.path} is a temporary of another run; left alone ({t.why})",
                       err=True)


def list_option(value: str | None, cast: Callable[[str], Any], option: str) -> list[Any] | None:
    """Parse a comma-separated option value ("1,2,3") with a clear error."""
    if value is None:
        return None
    try:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected a comma-separated list, got {value!r}",
                                 param_hint=option) from None


def out_option(required: bool = True, help: str = "Output directory (written atomically).") -> Callable:
    return click.option("--out", "out", type=click.Path(path_type=Path), required=required, help=help,
                        cls=SectionOption, section="output")


overwrite_option = click.option(
    "--overwrite", is_flag=True, help="Replace an existing non-empty output directory.",
    cls=SectionOption, section="output",
)

data_argument = click.argument("data", type=click.Path(path_type=Path))


@contextlib.contextmanager
def progress_bar(description: str, total: int | None, unit: str = "rows") -> Iterator[Callable[[int], None]]:
    """A rich progress bar with a rate; yields `advance(n)`. Silent when stderr is not a TTY."""
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        MofNCompleteColumn(),
        TextColumn("[cyan]{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=False,
        disable=not err_console.is_terminal,
    )
    with progress:
        task = progress.add_task(description, total=total, rate="")

        def advance(n: int) -> None:
            progress.advance(task, n)
            speed = progress.tasks[task].speed
            if speed:
                progress.update(task, rate=f"{format_si(speed)} {unit}/s")

        yield advance


def format_si(x: float) -> str:
    """12345678 -> '12.3M'."""
    for div, suffix in [(1e9, "G"), (1e6, "M"), (1e3, "k")]:
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"
