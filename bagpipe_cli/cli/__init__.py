"""The `bagpipe` command line: a thin layer that parses options and calls the library.

The group loads a command's module only when that command runs or shows its help, and the
command modules import the heavy libraries (torch, pandas, matplotlib) inside their
functions, so `bagpipe --help` and `bagpipe CMD --help` start at once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import click

from bagpipe_cli import __version__
from bagpipe_cli.launch import signals

# name -> (module:command, the command's one-line summary for `bagpipe --help`; a test holds
# each equal to the command's own first sentence). Listed in this order.
COMMANDS = {
    "synth": ("bagpipe_cli.cli.synth:synth",
              "Generate a Zipf-skewed synthetic click log (the embedded default dataset)."),
    "preprocess": ("bagpipe_cli.cli.preprocess:preprocess",
                   "Turn raw click logs (Criteo, Avazu, any CSV/Parquet) into a dataset "
                   "directory."),
    "profile": ("bagpipe_cli.cli.profile:profile",
                "Profile DATA: access skew and every cache policy simulated on the exact batch "
                "trace."),
    "train": ("bagpipe_cli.cli.train:train",
              "Train one system on DATA and write config.json, metrics.csv and summary.json to "
              "--out."),
    "bench": ("bagpipe_cli.cli.bench:bench",
              "Run a benchmark matrix (systems x models x datasets x settings) from a YAML/TOML "
              "CONFIG."),
    "report": ("bagpipe_cli.cli.report:report",
               "Draw the figures and write a report page from stored RESULTS (bench folders, run "
               "folders or their parents); nothing is re-run."),
    "simulate": ("bagpipe_cli.cli.simulate:simulate",
                 "Predict iteration times and speed-ups of every system on a cluster from "
                 "SOURCE's trace."),
    "advise": ("bagpipe_cli.cli.advise:advise",
               "Answer which system trains fastest on your cluster: measure, model, validate, "
               "verdict."),
    "systems": ("bagpipe_cli.cli.systems:systems",
                "List every system (--system, a bench file's systems): what each models and is."),
}


class _Commands(MutableMapping):
    """`Group.commands` whose entries are imported when first looked up."""

    def __init__(self, table: dict[str, tuple[str, str]]):
        self.table, self.loaded = table, {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            module, _, attr = self.table[name][0].partition(":")
            self.loaded[name] = getattr(importlib.import_module(module), attr)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        self.loaded.pop(name, None)
        self.table.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.table, *self.loaded]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self.table, *self.loaded]))


class LazyGroup(click.Group):
    """A group whose commands are imported when they run or show their help; `bagpipe --help`
    lists them from `COMMANDS` without importing any. An interrupt (Ctrl-C, SIGTERM, SIGHUP)
    anywhere in it, start-up included, is one `Error:` line and the signal's exit code."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.commands = _Commands(lazy)
        self.summaries = {name: summary for name, (_, summary) in lazy.items()}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists commands, from the summaries (a command added later: its own)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, (click.Command(name, help=self.summaries[name]) if name in self.summaries
                        else self.commands[name]).get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """As click's, but a usage error (an option's bad value, a missing argument) is one
        line, `Error: ... (see 'bagpipe CMD --help')`, exit 2, like every other error."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:  # `bagpipe` alone: the help
            click.echo(e.ctx.get_help())
            sys.exit(e.exit_code)
        except click.UsageError as e:
            cmd = e.ctx.command_path if e.ctx is not None else "bagpipe"
            click.echo(f"Error: {e.format_message()} (see '{cmd} --help')", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _interrupts_as_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _interrupts_as_errors():
            return super().invoke(ctx)


class _interrupts_as_errors:
    """An interrupt becomes one `Error:` line with the signal's exit code (130, 143, 129)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, e: BaseException | None, tb: Any) -> bool:
        if isinstance(e, KeyboardInterrupt):
            from bagpipe_cli.cli.common import OneLineError

            raise OneLineError(signals.describe(e), signals.exit_code(e)) from None
        return False


@click.group(cls=LazyGroup, lazy=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bagpipe")
def cli() -> None:
    """Benchmark and profile Bagpipe-style lookahead embedding caching for DLRM training.

    \b
    Example:
      bagpipe synth --out data/demo --preset criteo-kaggle --scale 0.01 --rows 200000
    """


def main() -> None:
    signals.install()
    cli(prog_name="bagpipe")
