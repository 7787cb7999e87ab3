"""The `bagpipe` command line: a thin layer that parses options and calls the library."""

from __future__ import annotations

import click

from bagpipe_cli import __version__
from bagpipe_cli.cli.bench import bench
from bagpipe_cli.cli.preprocess import preprocess
from bagpipe_cli.cli.profile import profile
from bagpipe_cli.cli.report import report
from bagpipe_cli.cli.simulate import simulate
from bagpipe_cli.cli.synth import synth
from bagpipe_cli.cli.train import train


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bagpipe")
def cli() -> None:
    """Benchmark and profile Bagpipe-style lookahead embedding caching for DLRM training.

    \b
    Example:
      bagpipe synth --out data/demo --preset criteo-kaggle --scale 0.01 --rows 200000
    """


cli.add_command(synth)
cli.add_command(preprocess)
cli.add_command(profile)
cli.add_command(train)
cli.add_command(bench)
cli.add_command(report)
cli.add_command(simulate)


def main() -> None:
    cli(prog_name="bagpipe")
