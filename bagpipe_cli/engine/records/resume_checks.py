"""What `--resume` checks in a checkpoint before it uses it, beyond its checksums (which say
only that the files are as some writer left them): state.json's keys and types (the
reader's, `records.KINDS["checkpoint state"]`), metrics.json's records, what tables.pt and
dense.pt hold, and the tables' shapes against this run's dataset and config.

Each check returns the problem in words (None: there is none); `engine/records/checkpoint.py` names
the file and the checkpoint to resume from instead. Nothing here imports the checkpoint
module, which imports this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import torch

from bagpipe_cli.engine.config import TrainConfig
from bagpipe_cli.engine.trainer.optim import RowOptimizer
from bagpipe_cli.files.records import check_fields, load_record, read_record, shown
from bagpipe_cli.models import MODELS, ModelConfig, row_dim

_NUMBERS = (int, float, type(None))  # a record's values (NaN is a float; a bool is not one)


def read_json(path: Path, kind: str, fields: bool = True) -> tuple[Any, str | None]:
    """(the JSON file, None), read with its kind's limits (`records.KINDS`: size, depth) and,
    with `fields`, its keys' types checked; or (None, the problem in words)."""
    try:
        return (read_record if fields else load_record)(path, kind, error=ValueError), None
    except ValueError as e:
        return None, str(e).removeprefix(f"{path}: ")


def state_problem(state: dict[str, Any]) -> str | None:
    """state.json's keys and types (`records.KINDS["checkpoint state"]`): an iteration >= 0,
    the config and the dataset as mappings."""
    try:
        check_fields(state, "checkpoint state", "state.json", ValueError)
    except ValueError as e:
        return str(e).removeprefix("state.json: ")
    return None if state["iteration"] >= 0 else f"iteration is {state['iteration']}, below zero"


def metrics_problem(metrics: list[Any]) -> str | None:
    """metrics.json: a list per trainer process (at least one) of records, each a mapping of
    column to number (or null)."""
    if not metrics:
        return "no metrics stream (a list of records per trainer process)"
    for s, stream in enumerate(metrics):
        if not isinstance(stream, list):
            return f"metrics stream {s} is {shown(stream)}, not a list of records"
        if all(type(rec) is dict and all(type(v) in _NUMBERS for v in rec.values())
               for rec in stream):
            continue
        for i, rec in enumerate(stream):  # the first bad one, named
            if not isinstance(rec, dict):
                return f"record {i} of metrics stream {s} is {shown(rec)}, not a JSON object"
            for key, v in rec.items():
                if type(v) not in _NUMBERS:
                    return f"record {i} of metrics stream {s}: {key} is {shown(v)}, not a number"
    return None


def dense_problem(dense: Any) -> str | None:
    """dense.pt: the dense model's state_dict, its optimizer's and the RNG state."""
    if not isinstance(dense, dict):
        return f"holds a {type(dense).__name__}, not the dense model, its optimizer and the RNG"
    model, opt, rng = dense.get("model"), dense.get("optimizer"), dense.get("rng")
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        return "model is not a state_dict (a mapping of names to tensors)"
    if not isinstance(opt, dict) or not {"state", "param_groups"} <= set(opt):
        return "optimizer is not an optimizer's state_dict (state, param_groups)"
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8:
        return "rng is not torch's RNG state (a uint8 tensor)"
    return None


def tables_problem(tables: Any, shape: dict[str, tuple[int, int]] | None = None) -> str | None:
    """tables.pt: `weight` and `state`, float32 tensors [rows, floats a row] with the same
    rows; of `shape[key]` where given (`expected_shapes`)."""
    if not isinstance(tables, dict):
        return f"holds a {type(tables).__name__}, not the tables' weight and state"
    for key in ("weight", "state"):
        t = tables.get(key)
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.float32:
            what = f"a {t.dtype} tensor of {t.dim()} dimensions" if isinstance(t, torch.Tensor) \
                else shown(t)
            return f"{key} is {what}, not a float32 table [rows, floats a row]"
        if shape is not None and tuple(t.shape) != shape[key]:
            rows, dim = shape[key]
            return (f"{key} is a [{t.shape[0]:,}, {t.shape[1]}] table, but this run's is "
                    f"[{rows:,}, {dim}] (the dataset's rows in all its tables, and "
                    f"{_floats(key)} a row)")
    if tables["weight"].shape[0] != tables["state"].shape[0]:
        return (f"weight has {tables['weight'].shape[0]:,} rows but state "
                f"{tables['state'].shape[0]:,}")
    return None


def _floats(key: str) -> str:
    first_order = ", ".join(sorted(n for n, cls in MODELS.items() if getattr(cls, "first_order", False)))
    return (f"--emb-dim floats, one more for a first-order weight ({first_order})"
            if key == "weight" else "the --optimizer's state floats (adagrad: 1, sgd: 0)")


def expected_shapes(cfg: TrainConfig, dataset: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The [rows, floats a row] of this run's tables and their optimizer state."""
    cards = [int(c) for c in dataset["cardinalities"]]
    mcfg = ModelConfig(cfg.model, int(dataset["dense_features"]), len(cards), cfg.emb_dim,
                       bottom_mlp=cfg.bottom_mlp, top_mlp=cfg.top_mlp)
    rows = sum(cards)
    return {"weight": (rows, row_dim(mcfg)),
            "state": (rows, RowOptimizer(cfg.optimizer, cfg.lr).state_dim)}


def consistency_problem(iteration: int, metrics: list[list[dict[str, Any]]], dense: dict[str, Any]
                        ) -> tuple[str, str] | None:
    """(the file, the problem) where the checkpoint's parts disagree on its iteration b, so
    that an edited state.json (its checksum recomputed) is not resumed: every metrics stream
    holds the records of iterations 0..b-1, the dense optimizer's step counts (Adam's) are b,
    and dense.pt's own record of b (checkpoints made since it was written) is b."""
    said = f"state.json says iteration {iteration}"
    for s, stream in enumerate(metrics):
        its = [rec.get("iteration") for rec in stream]
        if its != list(range(len(its))) or len(its) != iteration:
            held = f"iterations {its[0]} to {its[-1]}" if its else "none"
            return "metrics.json", (f"{said}, but metrics stream {s} holds {len(its)} records "
                                    f"({held}), not those of iterations 0 to {iteration - 1}")
    steps = {int(st["step"]) for st in dense["optimizer"]["state"].values()
             if isinstance(st, dict) and isinstance(st.get("step"), torch.Tensor | int | float)}
    if steps and steps != {iteration}:
        return "dense.pt", (f"{said}, but the dense optimizer's state has taken "
                            f"{', '.join(map(str, sorted(steps)))} steps")
    mark = dense.get("iteration")
    if isinstance(mark, torch.Tensor) and mark.numel() == 1 and int(mark) != iteration:
        return "dense.pt", f"{said}, but dense.pt was written at iteration {int(mark)}"
    return None


# Settings of where and how a run computes that a resume may change where a trainer's torch
# threads stay the same (docs/architecture.md, "Which runs give the same bits"): the two
# runtimes make the same sums in the same order, but a kernel's rounding depends on the
# threads it computes with.
RUNTIME_SETTINGS = ("threads", "placement", "transport", "procs")
_DEFAULTS = {"placement": "auto", "transport": "inproc"}  # (a checkpoint older than a setting)


def threads_problem(mine: dict[str, Any], theirs: dict[str, Any]) -> tuple[str, str] | None:
    """(the setting, the problem) where this run's trainers may compute on other torch
    threads than the checkpoint's, so other bits: with --threads given to both, another
    value; with it unset (--placement and the runtime choose them), another of
    RUNTIME_SETTINGS. None: the same threads, whatever runtime and placement."""
    given = mine["threads"] is not None and theirs.get("threads") is not None
    if given and mine["threads"] == theirs["threads"]:
        return None
    for key in ("threads",) if given else RUNTIME_SETTINGS:
        was, now = theirs.get(key, _DEFAULTS.get(key)), mine[key]
        if was != now:
            how = ("resume with the same --threads (then --procs and --placement may change)"
                   if given else "resume with the same settings, or give both runs the same "
                   "--threads (then --procs and --placement may change)")
            return key, (f"the checkpoint was made with {{opt}} {_word(was)}, this run has {{opt}} "
                         f"{_word(now)}; {'' if given else 'with --threads unset '}its trainers "
                         f"may compute on other torch threads, which change the bits of their "
                         f"products: {how}")
    return None


def _word(v: Any) -> str:
    return "unset" if v is None else str(v)


def streams(metrics: list[list[dict[str, Any]]], trainers: int) -> list[list[dict[str, Any]]]:
    """A checkpoint's metrics streams as a runtime of `trainers` streams continues them:
    in-process one (a --procs run's merged, as its metrics.csv has them), over --procs one a
    trainer (an in-process run's record as trainer 0's, its totals left to it alone)."""
    if len(metrics) == trainers:
        return [list(m) for m in metrics]
    from bagpipe_cli.engine.records.metrics import COLUMNS, merge_records

    if trainers == 1:
        frames = [pd.DataFrame(m) for m in metrics]
        return [[{k: getattr(v, "item", lambda v=v: v)() for k, v in rec.items()}
                 for rec in merge_records(frames).to_dict("records")]]
    sums = {c.name for c in COLUMNS if c.merge == "sum"}
    rest = [{k: (0 if k in sums else v) for k, v in rec.items()} for rec in metrics[0]]
    return [list(metrics[0]), *([list(rest) for _ in range(trainers - 1)])]
