"""Command-line options generated from a config dataclass: defaults and help live in one place."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from bagpipe_cli.engine.config import field_option

_TYPES = {int: int, float: float, str: str}


def _sizes(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """"512,256,64" -> (512, 256, 64)."""
    if isinstance(value, tuple):
        return value
    try:
        return tuple(int(x) for x in str(value).split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated layer sizes, got {value!r}") from None


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
            if hints[f.name] is bool:
                fn = click.option(field_option(f), f.name, is_flag=True, default=default,
                                  help=f.metadata["help"])(fn)
                continue
            if typing.get_origin(hints[f.name]) is tuple:
                fn = click.option(field_option(f), f.name, default=",".join(map(str, default)),
                                  show_default=True, callback=_sizes, help=f.metadata["help"])(fn)
                continue
            fn = click.option(field_option(f), f.name, type=_click_type(hints[f.name], f.metadata["choices"]),
                              default=default, show_default=default is not None,
                              help=f.metadata["help"])(fn)
        return fn

    return decorate
