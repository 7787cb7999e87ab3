"""Checkpoints of a training run at an iteration boundary, and finding one to resume from.

Every system except `het` with staleness > 0 trains the same parameters whatever is cached,
so a checkpoint holds only the *true* parameters: the full tables (the servers' shards with
every row resident in a trainer cache laid over them, since the cache holds the newer
value), the dense model and its optimizer, the next iteration `b`, the torch RNG state and
the metrics rows so far. A resumed run starts at `b` with a fresh oracle over batches b..
and an empty cache (the oracle is deterministic; batch b's data is the same), or, for a
fixed-capacity cache, with the rows the run never stopped held at `b`, fetched back first
(`engine/planning/builders.py`), so its parameters and loss curve are bitwise those of that run
(hotline's too, though it splits each batch by what is cached).

Layout (one directory per checkpoint, written with `io.atomic_dir`: temp + rename):

    DIR/ckpt-00000040/
        tables.pt      {"weight": [rows, dim], "state": [rows, state_dim]} in global key order
        dense.pt       {"model", "optimizer": state_dicts, "rng": torch RNG state, "iteration"}
        metrics.json   per-iteration records so far (a list per metrics stream)
        state.json     format, version, iteration, config, dataset, created, versions
        checksums.json sha256 of each file above

`find_checkpoint` takes the newest checkpoint whose checksums verify and says which newer
ones it skipped and why; the last `keep` good checkpoints are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bagpipe_cli import __version__
from bagpipe_cli.engine.comm.shards import gather_shards
from bagpipe_cli.engine.config import TrainConfig, option_name
from bagpipe_cli.engine.records.lineage import checkpoint_lineage
from bagpipe_cli.engine.records.resume_checks import (
    RUNTIME_SETTINGS,
    consistency_problem,
    dense_problem,
    expected_shapes,
    metrics_problem,
    read_json,
    state_problem,
    tables_problem,
    threads_problem,
)
from bagpipe_cli.errors import BagpipeError, ConfigError
from bagpipe_cli.files import claims
from bagpipe_cli.files.atomic import atomic_dir, json_default, stale_temporaries, torch_save
from bagpipe_cli.files.outputs import os_error_words

FORMAT = "bagpipe-checkpoint"
VERSION = 1
FILES = ("tables.pt", "dense.pt", "metrics.json", "state.json")
CHECKSUMS = "checksums.json"
NAME = re.compile(r"^ckpt-(\d{8})$")

# TrainConfig fields that do not change parameters or metrics, or are checked otherwise:
# a resumed run may change them (`iterations` may grow: batch b is the same for any length).
# `backend` only moves exact copies (all-gathers; the sums are taken alike on every backend).
FREE_FIELDS = {"data", "iterations", "timeout_s", "net_gbps", "net_latency_us", "warmup",
               "checkpoint_every", "checkpoint_dir", "checkpoint_keep", "resume", "backend",
               "master", "node_rank", "trace", "eval_every", "target_auc",
               "planners",  # the same plan whatever the number of planning workers
               *RUNTIME_SETTINGS}  # checked by threads_problem


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used (missing, corrupt, foreign or from another config)."""


class CheckpointWriteError(BagpipeError):
    """A checkpoint that could not be written (the earlier ones are intact): exit code 2, as
    every failed write."""

    exit_code = 2


@dataclass
class Checkpoint:
    """A verified checkpoint, loaded."""

    path: Path
    iteration: int  # the next iteration to run
    config: dict[str, Any]
    dataset: dict[str, Any]
    weight: torch.Tensor  # [total rows, dim], global key order
    state: torch.Tensor  # [total rows, state_dim]
    dense: dict[str, torch.Tensor]
    dense_optimizer: dict[str, Any]
    rng: torch.Tensor
    metrics: list[list[dict[str, Any]]]  # records per stream (one in-process, one per trainer)
    skipped: list[str] = field(default_factory=list)  # newer checkpoints that did not verify


def checkpoint_name(iteration: int) -> str:
    return f"ckpt-{iteration:08d}"


def dataset_identity(ds) -> dict[str, Any]:
    """What a checkpoint records of its dataset (compared on resume; the path may move)."""
    return {"name": ds.meta.name, "rows": int(ds.rows),
            "cardinalities": [int(c) for c in ds.meta.cardinalities],
            "dense_features": int(ds.meta.num_dense),
            "checksums": dict(ds.meta.checksums)}  # of its arrays: another dataset of one shape


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(root: Path, iteration: int, config: dict[str, Any], dataset: dict[str, Any],
                    weight: torch.Tensor, state: torch.Tensor, dense: dict[str, torch.Tensor],
                    dense_optimizer: dict[str, Any], rng: torch.Tensor,
                    metrics: list[list[dict[str, Any]]], keep: int = 2,
                    lineage: str | None = None) -> Path:
    """Write `root/ckpt-<iteration>` atomically, then drop all but the newest `keep` ones (and
    never the one just written). `lineage`: the run lineage's id (`engine/records/lineage.py`)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = root / checkpoint_name(iteration)
    with atomic_dir(out, overwrite=True) as tmp:
        torch_save({"weight": weight, "state": state}, tmp / "tables.pt")
        torch_save({"model": dense, "optimizer": dense_optimizer, "rng": rng,
                    "iteration": torch.tensor(int(iteration))}, tmp / "dense.pt")
        # JSON floats round-trip exactly, so the resumed run's metrics are the straight run's.
        (tmp / "metrics.json").write_text(json.dumps(metrics, default=json_default))
        (tmp / "state.json").write_text(json.dumps({
            "format": FORMAT, "version": VERSION, "iteration": int(iteration),
            "config": config, "dataset": dataset, "lineage": lineage,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": {"bagpipe": __version__, "torch": torch.__version__}},
            indent=2, default=json_default))
        sums = {}
        for name in FILES:
            _fsync(tmp / name)  # on disk before the rename makes the checkpoint visible
            sums[name] = _sha256(tmp / name)
        (tmp / CHECKSUMS).write_text(json.dumps({"sha256": sums}, indent=2))
        _fsync(tmp / CHECKSUMS)
    prune(root, keep, out)
    return out


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under `root`, newest first (temporary ones are not listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if NAME.match(p.name) and p.is_dir()]
    return sorted(found, key=lambda p: p.name, reverse=True)


def prune(root: Path, keep: int, protect: Path | None = None) -> None:
    """Keep the newest `keep` checkpoints, and `protect` (the one just written, which a run
    resumed from an older one writes below newer ones); remove older ones and leftovers of
    killed writes."""
    for p in list_checkpoints(root)[max(1, keep):]:
        if protect is None or p.name != Path(protect).name:
            shutil.rmtree(p, ignore_errors=True)
    clean_partial(root)


def clean_partial(root: Path) -> None:
    """Remove the temporaries of checkpoint writes that were killed midway: those their
    claims list (`io.stale_temporaries`), never a folder by its name alone."""
    root = Path(root)
    if root.is_dir():
        for c in root.glob(f".ckpt-*{claims.SUFFIX}"):
            stale_temporaries(root / c.name[1:-len(claims.SUFFIX)])


def verify(path: Path) -> dict[str, Any]:
    """state.json of a checkpoint directory whose files all match checksums.json, or raise."""
    path = Path(path)
    if not (path / CHECKSUMS).is_file():
        raise CheckpointError(f"{path}: no {CHECKSUMS} (incomplete or not a checkpoint)")
    record, problem = read_json(path / CHECKSUMS, "checkpoint checksums")
    if problem is not None:
        raise CheckpointError(f"{path / CHECKSUMS}: {problem}")
    sums = record["sha256"]
    for name in FILES:
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if sums.get(name) != _sha256(f):
            raise CheckpointError(f"{path}: checksum mismatch in {name} (corrupt or partial)")
    state, problem = read_json(path / "state.json", "checkpoint state", fields=False)
    if problem is None and state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a bagpipe checkpoint")
    if problem is None and state.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {state.get('version')!r} is not supported "
                              f"(expects {VERSION})")
    if (problem := problem or state_problem(state)) is not None:  # limits, then keys and types
        raise _damaged(path, "state.json", problem)
    return state


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose checksums match but that cannot be used: --resume stops at it."""


def _damaged(path: Path, name: str, problem: str, option: str = "") -> DamagedCheckpoint:
    """The one line for file `name` of checkpoint `path`: the problem, what to resume from."""
    older = [p for p in list_checkpoints(path.parent) if NAME.match(path.name) and p < path]
    then = (f"resume from the previous one: --resume {older[0]}" if older else
            "no earlier checkpoint is kept: train from the start, without --resume")
    return DamagedCheckpoint(f"{option} {path / name}: {problem}; the checkpoint cannot be "
                             f"resumed; {then}".lstrip())


def load_checkpoint(path: Path) -> Checkpoint:
    """Verify and load one checkpoint directory."""
    path = Path(path)
    state = verify(path)
    try:
        tables = torch.load(path / "tables.pt", weights_only=True)
        dense = torch.load(path / "dense.pt", weights_only=True)
    except Exception as e:  # noqa: BLE001 - checksums matched, so this is a foreign writer
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    metrics, unread = read_json(path / "metrics.json", "checkpoint metrics")
    for name, problem in (("metrics.json", unread or metrics_problem(metrics)),
                          ("tables.pt", tables_problem(tables)), ("dense.pt", dense_problem(dense))):
        if problem:
            raise _damaged(path, name, problem)
    if (mismatch := consistency_problem(int(state["iteration"]), metrics, dense)) is not None:
        raise _damaged(path, *mismatch)  # its parts disagree on where it stands
    return Checkpoint(path, int(state["iteration"]), state["config"], state["dataset"],
                      tables["weight"], tables["state"], dense["model"], dense["optimizer"],
                      dense["rng"], metrics)


def find_checkpoint(path: Path, option: str = "--resume") -> Checkpoint:
    """The checkpoint to resume from: `path` itself, or the newest good one under it.

    A newer checkpoint that fails verification is skipped (named in `Checkpoint.skipped`);
    if none verifies, the error names every one and why.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{option} {path}: no such directory")
    if not path.is_dir():
        raise CheckpointError(f"{option} {path}: not a directory")
    if (path / "state.json").exists() or (path / CHECKSUMS).exists():
        try:
            return load_checkpoint(path)
        except CheckpointError as e:
            raise CheckpointError(f"{option}: {e}") from None
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"{option} {path}: no checkpoints (ckpt-NNNNNNNN folders) in it")
    skipped = []
    for p in found:
        try:
            ck = load_checkpoint(p)
        except DamagedCheckpoint as e:  # verified, yet unusable: not passed over
            raise DamagedCheckpoint(f"{option} {e}") from None
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        ck.skipped = skipped
        return ck
    raise CheckpointError(f"{option} {path}: no checkpoint verifies: " + "; ".join(skipped))


def check_compatible(cfg: TrainConfig, ck: Checkpoint, dataset: dict[str, Any], option: str = "--resume") -> None:
    """Refuse to resume `ck` under a config or dataset that would train different parameters."""
    for f in fields(cfg):
        if f.name in FREE_FIELDS:
            continue
        # A field newer than the checkpoint had its default's behaviour then.
        mine, theirs = getattr(cfg, f.name), ck.config.get(f.name, f.default)
        if isinstance(theirs, list):  # a tuple setting, as JSON stores it
            theirs = tuple(theirs)
        if mine != theirs:
            opt = option_name(f.name)
            raise CheckpointError(f"{option} {ck.path}: the checkpoint was made with {opt} {theirs}, "
                                  f"this run has {opt} {mine}; resume with the same setting")
    if (changed := threads_problem(asdict(cfg), ck.config)) is not None:
        opt = option_name(changed[0])
        raise CheckpointError(f"{option} {ck.path}: {changed[1].format(opt=opt)}")
    for key in ("rows", "cardinalities", "dense_features"):
        if dataset.get(key) != ck.dataset.get(key):
            raise CheckpointError(f"{option} {ck.path}: the checkpoint is of another dataset "
                                  f"({key} {ck.dataset.get(key)} != {dataset.get(key)})")
    theirs = ck.dataset.get("checksums")  # (a checkpoint older than this has none)
    if theirs and dataset.get("checksums") and theirs != dataset["checksums"]:
        differ = sorted(k for k in set(theirs) | set(dataset["checksums"])
                        if theirs.get(k) != dataset["checksums"].get(k))
        raise CheckpointError(f"{option} {ck.path}: the checkpoint is of another dataset of the "
                              f"same shape (the checksums of {', '.join(differ[:3])}"
                              f"{' ...' if len(differ) > 3 else ''} differ from {cfg.data}'s); "
                              "resume with the dataset it was made with")
    problem = tables_problem({"weight": ck.weight, "state": ck.state}, expected_shapes(cfg, dataset))
    if problem:
        raise _damaged(ck.path, "tables.pt", problem, option)
    if ck.iteration >= cfg.iterations:
        raise CheckpointError(f"{option} {ck.path}: the checkpoint is at iteration {ck.iteration}, "
                              f"not below --iterations {cfg.iterations}; nothing left to train")


def full_tables(servers: list, resident: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The true tables in global key order: the shards, with resident cache rows laid over them."""
    weight, state = gather_shards(servers)
    for keys, rows, st in resident:
        if len(keys):
            idx = torch.from_numpy(np.asarray(keys, dtype=np.int64))
            weight.index_copy_(0, idx, rows)
            if state.shape[1]:
                state.index_copy_(0, idx, st)
    return weight, state


def checkpoint_due(cfg: TrainConfig, b: int, start: int) -> bool:
    """A checkpoint is taken at the boundary before iteration b, every --checkpoint-every
    iterations (not at the run's start, nor after its last iteration)."""
    every = cfg.checkpoint_every
    return every > 0 and start < b < cfg.iterations and b % every == 0


class Checkpointer:
    """Writes a run's checkpoints every `every` iterations and times them."""

    def __init__(self, cfg: TrainConfig, dataset: dict[str, Any], start: int = 0):
        self.every, self.keep, self.start = cfg.checkpoint_every, cfg.checkpoint_keep, start
        self._tmp = None
        if cfg.checkpoint_dir is None:  # library/bench use: measure, then discard
            self._tmp = tempfile.mkdtemp(prefix="bagpipe-ckpt-")
            self.root = Path(self._tmp)
        else:
            self.root = Path(cfg.checkpoint_dir)
        # One run lineage's checkpoints per folder: another run's are refused, never pruned.
        self.lineage = checkpoint_lineage(self.root, cfg.resume) if self._tmp is None else None
        self._made_root = not self.root.exists()  # removed again if it stays empty
        self.config = asdict(cfg)
        self.dataset = dataset
        self.ms: list[float] = []
        self.last: Path | None = None
        clean_partial(self.root)

    def save(self, b: int, weight, state, dense, dense_optimizer, rng, metrics, t0: float) -> None:
        """Write the checkpoint before iteration b; a failed write (a full disk...) leaves the
        earlier ones as they were and raises CheckpointWriteError saying which to resume from."""
        try:
            self.last = save_checkpoint(self.root, b, self.config, self.dataset, weight, state,
                                        dense, dense_optimizer, rng, metrics, self.keep,
                                        self.lineage)
        except OSError as e:
            if self._made_root and not any(self.root.iterdir()):
                self.root.rmdir()
            where = f"{e.filename}: " if e.filename else ""
            use = (f"the previous one, {self.last}, is intact: --resume {self.last} continues "
                   "from it" if self.last is not None else
                   "this run wrote no checkpoint before it")
            raise CheckpointWriteError(f"--checkpoint-dir {self.root}: the checkpoint before "
                                       f"iteration {b} could not be written ({where}"
                                       f"{os_error_words(e)}); {use}") from None
        self.ms.append(1e3 * (time.perf_counter() - t0))

    def summary(self, median_iter_ms: float) -> dict[str, Any]:
        med = float(np.median(self.ms)) if self.ms else float("nan")
        return {"checkpoints": len(self.ms), "checkpoint_every": self.every,
                "checkpoint_ms": self.ms, "checkpoint_ms_median": med,
                # the share of training time spent checkpointing at this frequency
                "checkpoint_overhead_pct": 100 * med / (self.every * median_iter_ms)
                if self.ms and median_iter_ms > 0 else float("nan"),
                "checkpoint_dir": None if self._tmp else str(self.root),
                "last_checkpoint": None if self._tmp or self.last is None
                or not self.last.is_dir() else str(self.last)}

    def close(self) -> None:
        if self._tmp:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._tmp)

