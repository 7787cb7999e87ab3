"""`bagpipe systems`: every system `train`, `bench` and `simulate` know, from the registry."""

from __future__ import annotations

import json

import click
from rich.table import Table

from bagpipe_cli.cli.common import console, translate_errors

FORMATS = ("table", "markdown", "json")
COLUMNS = ("system", "role", "what it models", "same parameters as sync", "settings it reads",
           "cache on the trainers", "simulate models it", "profile simulates")


@click.command(epilog="\b\nExamples:\n  bagpipe systems\n  bagpipe systems --format json")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="A table, a Markdown table, or JSON (one object per system, every field).")
@translate_errors
def systems(fmt: str) -> None:
    """List every system (--system, a bench file's systems): what each models and is."""
    from bagpipe_cli.engine.registry import system_facts

    facts = system_facts()
    if fmt == "json":
        click.echo(json.dumps(facts, indent=2))
        return
    rows = [[f["name"], f["role"], f["summary"], f["fidelity"], ", ".join(f["reads"]) or "-",
             f["cache"], f["simulated"] or "no", f["profiled"] or "no"] for f in facts]
    if fmt == "markdown":
        click.echo("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
        for r in rows:
            click.echo("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
        return
    t = Table(title=f"{len(rows)} systems (bagpipe_cli/engine/registry.py)", show_lines=True)
    for c in COLUMNS:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    console.print(t)
