"""Command-line options generated from a config dataclass: defaults and help live in one place."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from bagpipe_cli.engine.config import field_option

_TYPES = {int: int, float: float, str: str}


def _click_type(hint: Any, choices: tuple[str, ...] | None) -> Any:
    if choices:
        return click.Choice(choices)
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return _TYPES[args[0]]


def config_options(cls: type) -> Callable[[Callable], Callable]:
    """A decorator adding one option per field of `cls` that has command-line metadata
    (`engine.config.setting`); the command receives them as keyword arguments by field name."""
    hints = typing.get_type_hints(cls)

    def decorate(fn: Callable) -> Callable:
        for f in reversed(fields(cls)):
            if not f.metadata.get("cli", False):
                continue
            default = None if f.default is MISSING else f.default
            fn = click.option(field_option(f), f.name, type=_click_type(hints[f.name], f.metadata["choices"]),
                              default=default, show_default=default is not None,
                              help=f.metadata["help"])(fn)
        return fn

    return decorate
