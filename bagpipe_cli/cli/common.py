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

from bagpipe_cli.errors import BagpipeError, ConfigError
from bagpipe_cli.files.atomic import stale_temporaries
from bagpipe_cli.files.claims import claim_file
from bagpipe_cli.files.outputs import (
    CAUSES,
    FILE,
    Input,
    Output,
    _real,
    check_inputs_free,
    check_what,
    check_where,
    claim_output,
    os_error_words,
)
from bagpipe_cli.files.temporaries import UNMARKED
from bagpipe_cli.launch import signals


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
            raise OneLineError(_os_error(e), 2 if e.errno in CAUSES else 1) from None
        except MemoryError:
            raise OneLineError("out of memory; use a smaller --batch-size or dataset", 1) from None
        except KeyboardInterrupt as e:
            raise OneLineError(f"{signals.describe(e)}; {interrupted_words()}",
                               signals.exit_code(e)) from None

    return wrapper


def interrupted_words() -> str:
    """What an interrupted command leaves: no output; checkpoints are named only by a run
    that writes them (`--checkpoint-every N`), not by one that has none (simulate, profile,
    a train without it...)."""
    ctx = click.get_current_context(silent=True)
    ckpt = ctx is not None and bool(ctx.params.get("checkpoint_every"))
    return "no output was written" + (" (checkpoints already written are kept)" if ckpt else "")


def _os_error(e: OSError) -> str:
    """A failed read or write in one line: the option whose path it was (an output of the
    command's), the path and the cause."""
    name = str(e.filename) if e.filename else ""
    option = ""
    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None and name else ():
        value = ctx.params.get(param.name)
        if isinstance(param.type, OutputPath) and value is not None:
            root = os.path.abspath(value)
            if os.path.abspath(name) == root or os.path.abspath(name).startswith(root + os.sep):
                option = f"{param.opts[0]} "
                break
    return f"{option}{name + ': ' if name else ''}{os_error_words(e)}"


class SectionOption(click.Option):
    """An option shown under its `section`'s heading in a sectioned command's help
    (`cli.options.SectionedCommand`); other commands show it as any option."""

    def __init__(self, *args: Any, section: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.section = section


class OutputPath(click.Path):
    """The type of every option or argument naming a path a command writes: what it makes
    (`outputs.Output.makes`: FILE, a kind of folder, CHECKPOINTS). `check_outputs` applies the one
    rule (`outputs.check_output`) to every parameter of this type."""

    def __init__(self, makes: str, path_type: type = Path):
        super().__init__(path_type=path_type)
        self.makes = makes


class InputPath(click.Path):
    """The type of every option or argument naming a path a command reads."""

    def __init__(self, path_type: type = Path) -> None:
        super().__init__(path_type=path_type)


def check_outputs(inputs: list[Input] | tuple[Input, ...] = (), grow: bool = False,
                  skip: tuple[str, ...] = (), claim: bool = True, **derived: Path | None) -> None:
    """Before any work: every path the current command writes, by the one rule
    (`outputs.check_output`): its OutputPath parameters as given (a default the command derives
    is passed as `derived`, by parameter name), with its --overwrite, against `inputs`
    (and each output against the others: a file is never another output, nor inside a
    folder the command writes); `skip`: parameters this run does not write. Each output is
    claimed for the command's life (`claim`: this process writes them; no other process can
    until the command ends), and an input another process is writing is refused. Names the
    temporaries earlier killed runs left next to them, removing those that are safe to."""
    ctx = click.get_current_context()
    overwrite = bool(ctx.params.get("overwrite"))
    names = {p.name for p in ctx.command.params}
    fix = ("pass --overwrite to replace it" if "overwrite" in names
           else "pass --resume to continue it, or choose a new folder" if "resume" in names
           else "choose a new path")
    outs = []
    for param in ctx.command.params:
        if isinstance(param.type, OutputPath) and param.name not in skip:
            value = derived.get(param.name) or ctx.params.get(param.name)
            if value is not None:
                outs.append(Output(param.opts[0] if param.opts[0].startswith("-") else param.name.upper(),
                                   Path(value), param.type.makes))
    _check_files_apart(outs)
    for out in outs:
        others = [Input(o.option, o.path) for o in outs if o is not out and o.makes != FILE]
        check_where(out, [*inputs, *others])
    if claim:  # in one order (by path): of two commands on the same outputs, one wins
        for out in sorted(outs, key=lambda o: str(_real(o.path))):
            ctx.call_on_close(claim_output(out, overwrite).release)
    check_inputs_free(inputs)  # (first: an output there from before is not the problem)
    for out in outs:
        check_what(out, overwrite, grow=grow, fix=fix, probe=not claim)
        warn_stale(out.path)


def check_found_output(out: Output, inputs: list[Input] | tuple[Input, ...] = (),
                       grow: bool = False) -> None:
    """An output a command finds in an input rather than among its options (a bench file's
    checkpoint_dir), by the one rule and claimed for the command's life, as `check_outputs`
    does."""
    check_where(out, inputs)
    click.get_current_context().call_on_close(claim_output(out).release)
    check_what(out, grow=grow, fix="choose another folder", probe=False)
    warn_stale(out.path)


def _check_files_apart(outs: list[Output]) -> None:
    """A file output that is another output, or lies inside a folder the command writes (a
    --save-model inside the run's --out, which the run replaces whole), in one line."""
    for f in (o for o in outs if o.makes == FILE):
        for o in outs:
            if o is f:
                continue
            a, b = _real(f.path), _real(o.path)
            if a == b:
                raise ConfigError(f"{f.option} {f.path} and {o.option} {o.path} are one path; "
                                  "give each its own")
            if o.makes != FILE and b in a.parents:
                raise ConfigError(f"{f.option} {f.path} lies inside {o.option} {o.path}, which "
                                  "the command writes whole; write it outside that folder")


def warn_stale(out: Path) -> None:
    """One warning line per temporary an earlier killed run left next to `out`, and per path
    a claim lists as one that lacks bagpipe's mark (left: it is not bagpipe's to remove)."""
    for t in stale_temporaries(out):
        if t.removed:
            click.echo(f"Warning: removed {t.path}, a temporary that an earlier run left when it "
                       "was killed", err=True)
        elif t.why == UNMARKED:
            click.echo(f"Warning: {t.path} was left alone: {claim_file(out)} lists it as a "
                       "temporary of an earlier run, but it lacks the mark bagpipe puts in its "
                       "own, so it is not bagpipe's to remove; if it is yours, keep it, else "
                       "remove it yourself", err=True)
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


def out_option(makes: str, required: bool = True,
               help: str = "Output directory (written atomically).") -> Callable:
    """--out: the folder a command makes (`makes`: its kind, outputs.FOLDER_MARKS)."""
    return click.option("--out", "out", type=OutputPath(makes), required=required, help=help,
                        cls=SectionOption, section="output")


overwrite_option = click.option(
    "--overwrite", is_flag=True, help="Replace existing outputs (a non-empty --out folder, an "
    "existing output file); links, devices and bagpipe folders of another kind never are.",
    cls=SectionOption, section="output",
)

data_argument = click.argument("data", type=InputPath())


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


class StageBars:
    """One rich bar per stage, made on its first report, silent when stderr is not a TTY; a
    context manager whose call is a report (stage, n, total): `n` done so far (`absolute`,
    as advise's steps report) or done since the stage's last report (profile's passes)."""

    def __init__(self, absolute: bool = False, width: int = 22):
        self.absolute = absolute
        self.progress = Progress(
            TextColumn(f"[bold]{{task.description:<{width}}}"), BarColumn(), TaskProgressColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
            disable=not err_console.is_terminal,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> StageBars:
        self.progress.__enter__()
        return self

    def __call__(self, stage: str, n: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        if self.absolute:
            self.progress.update(self.tasks[stage], completed=n, total=total)
        else:
            self.progress.advance(self.tasks[stage], n)

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)


def format_si(x: float) -> str:
    """12345678 -> '12.3M'."""
    for div, suffix in [(1e9, "G"), (1e6, "M"), (1e3, "k")]:
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"
