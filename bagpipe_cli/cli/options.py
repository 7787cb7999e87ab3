"""Command-line options generated from a config dataclass: defaults and help live in one place,
and the help shows them grouped by the fields' sections (`engine.config.SECTIONS`)."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click
from click.core import ParameterSource

from bagpipe_cli.cli.common import InputPath, OutputPath, SectionOption
from bagpipe_cli.engine.config import SECTIONS, field_option

_TYPES = {int: int, float: float, str: str}


class SectionedCommand(click.Command):
    """A command whose help lists its options under section headings, in `SECTIONS` order;
    options without a section come last."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str | None, list[tuple[str, str]]] = {}
        for p in self.get_params(ctx):
            record = p.get_help_record(ctx) if isinstance(p, click.Option) else None
            if record is not None:
                groups.setdefault(getattr(p, "section", None), []).append(record)
        # One first column for every section, so the help texts line up across them.
        width = min(30, max((len(name) for rows in groups.values() for name, _ in rows), default=0))
        for section in (*SECTIONS, None):
            if section in groups:
                with formatter.section(section.capitalize() if section else "Other options"):
                    formatter.write_dl([(name.ljust(width), text) for name, text in groups[section]])


def _items(item: type) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A callback parsing "512,256,64" into (512, 256, 64) (items of type `item`)."""

    def parse(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or isinstance(value, tuple):
            return value
        try:
            return tuple(item(x.strip()) for x in str(value).split(",") if x.strip())
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list of {item.__name__}s, "
                                     f"got {value!r}") from None

    return parse


def _unwrap_optional(hint: Any) -> Any:
    """`X | None` -> X."""
    args = typing.get_args(hint)
    return next(a for a in args if a is not type(None)) if type(None) in args else hint


def _click_type(hint: Any, choices: tuple[str, ...] | None, path: str | None = None) -> Any:
    if path is not None:  # a path the command reads or writes (`setting(path=...)`)
        return InputPath(str) if path == "input" else OutputPath(path, str)
    return click.Choice(choices) if choices else _TYPES[_unwrap_optional(hint)]


def config_options(cls: type) -> Callable[[Callable], Callable]:
    """A decorator adding one option per field of `cls` that has command-line metadata
    (`engine.config.setting`); the command receives them as keyword arguments by field name.
    A tuple field is one comma-separated option (or, with `multiple`, one option per value)."""
    hints = typing.get_type_hints(cls)

    def decorate(fn: Callable) -> Callable:
        for f in reversed(fields(cls)):
            if not f.metadata.get("cli", False):
                continue
            default = None if f.default is MISSING else f.default
            common = dict(cls=SectionOption, section=f.metadata["section"], help=f.metadata["help"])
            hint = _unwrap_optional(hints[f.name])
            if hints[f.name] is bool:
                option = click.option(field_option(f), f.name, is_flag=True, default=default, **common)
            elif typing.get_origin(hint) is tuple and f.metadata.get("multiple"):
                option = click.option(field_option(f), f.name, multiple=True,
                                      type=_click_type(typing.get_args(hint)[0], None,
                                                       f.metadata.get("path")), **common)
            elif typing.get_origin(hint) is tuple:
                shown = None if default is None else ",".join(map(str, default))
                option = click.option(field_option(f), f.name, default=shown,
                                      show_default=shown is not None,
                                      callback=_items(typing.get_args(hint)[0]), **common)
            else:
                option = click.option(field_option(f), f.name,
                                      type=_click_type(hints[f.name], f.metadata["choices"],
                                                       f.metadata.get("path")),
                                      default=default, show_default=default not in (None, ""), **common)
            fn = option(fn)
        return fn

    return decorate


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options that the command line gave (not left at their defaults)."""
    ctx = click.get_current_context()
    return {k: v for k, v in options.items()
            if ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}
