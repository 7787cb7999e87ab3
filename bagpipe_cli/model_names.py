"""The dense models' names, found without importing them (they import torch).

A model is a module of `bagpipe_cli/models/` whose class is decorated `@register("name")`:
this module reads those decorators from the files, so `bagpipe --help`, `TrainConfig`'s
`--model` choices and every list of models have a new model's name as soon as its module
exists. `register` refuses a name this scan does not find (one not written as a literal).
"""

from __future__ import annotations

import re
from pathlib import Path

_REGISTER = re.compile(r"""^@register\(\s*["']([A-Za-z0-9_.-]+)["']\s*\)""", re.MULTILINE)


def _scan(folder: Path) -> dict[str, str]:
    """Model name -> the name of the module of `folder` that registers it."""
    return {name: path.stem for path in sorted(folder.glob("*.py"))
            for name in _REGISTER.findall(path.read_text(encoding="utf-8"))}


MODEL_MODULES: dict[str, str] = _scan(Path(__file__).resolve().parent / "models")
"""Model name (as given to --model) -> its module in `bagpipe_cli.models`."""
MODEL_NAMES: tuple[str, ...] = tuple(sorted(MODEL_MODULES))
