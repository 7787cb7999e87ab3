"""Running a benchmark matrix into a bench folder.

The bench folder (bench.json, environment.json, index.json and index.csv, rewritten after
each run, runs/<run-id>/ and profiles/<dataset>/) is written and read by
`bagpipe_cli.results` (its layout: `bagpipe_cli.results.bench_folder`).

Repeats are interleaved (every configuration once, then every configuration again, ...)
so that slow drifts of the machine spread over all systems alike. A run folder appears only
when its run is complete, so an interrupted bench keeps every finished run, and `resume`
skips them.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.bench.config import BENCH_KEYS
from bagpipe_cli.bench.matrix import BenchConfig
from bagpipe_cli.bench.plan import PlannedRun, plan_runs
from bagpipe_cli.data.format import open_dataset
from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine import run
from bagpipe_cli.engine.records.checkpoint import dataset_identity
from bagpipe_cli.engine.registry import spec
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.launch.environment import environment
from bagpipe_cli.profile import ProfileConfig, run_profile
from bagpipe_cli.profile.report import write_profile
from bagpipe_cli.results import (
    INDEX_COLUMNS,
    is_bench,
    is_run,
    open_run,
    read_bench_file,
    write_bench,
    write_environment,
    write_index,
    write_run,
)
from bagpipe_cli.results.bench_folder import now
from bagpipe_cli.results.schema import read_json


@dataclass
class BenchEvent:
    """What the bench is doing, for a progress display.

    kind: "dataset" (generating or checking one), "profile", "start" (a run starts),
    "iteration" (one training iteration done), "done" (a run finished: `row` is its index
    row), "skipped" (already complete: `row`).
    """

    kind: str
    message: str = ""
    run: PlannedRun | None = None
    repeat: int = 0
    done: int = 0  # runs finished or skipped so far (including this one for done/skipped)
    total: int = 0  # runs in the bench
    iteration: int = 0
    record: dict[str, Any] | None = None  # the iteration's metrics
    row: dict[str, Any] | None = None  # the run's index row


@dataclass
class BenchResult:
    """A finished bench: its folder and one index row per run."""

    out: Path
    index: pd.DataFrame
    ran: int = 0
    skipped: int = 0
    datasets_generated: list[str] = field(default_factory=list)


ProgressFn = Callable[[BenchEvent], None]


def default_out(cfg: BenchConfig) -> Path:
    return Path("results") / f"bench-{cfg.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_bench(cfg: BenchConfig, out: Path, resume: bool = False,
              progress: ProgressFn | None = None) -> BenchResult:
    """Run every planned run `cfg.repeat` times into the bench folder `out`."""
    emit = progress or (lambda e: None)
    out = Path(out)
    plan = plan_runs(cfg)
    _prepare(out, resume, cfg)
    total = len(plan) * cfg.repeat
    result = BenchResult(out, pd.DataFrame(columns=INDEX_COLUMNS))
    resumed = resume and is_bench(out)
    result.datasets_generated = _datasets(cfg, out, emit)
    identities = {ds.name: dataset_identity(open_dataset(ds.path)) for ds in cfg.datasets}
    if resumed:
        _check_same_sources(out, cfg, identities)
    write_bench(out, {**cfg.to_json(), IDENTITIES: identities},
                [p.run_id(r) for r in range(1, cfg.repeat + 1) for p in plan])
    write_environment(out, keep=resume)
    if cfg.profile is not None:
        for ds in cfg.datasets:
            _profile(cfg, plan, ds, out / "profiles" / ds.name, emit)

    rows: list[dict[str, Any]] = []
    done = 0
    for r in range(1, cfg.repeat + 1):
        for p in plan:
            rid = p.run_id(r)
            folder = out / "runs" / rid
            if is_run(folder):
                done += 1
                # Every file of a kept run is checked: a damaged one stops the bench here,
                # and so does one of another config than the plan's.
                kept = open_run(_own_files(folder))
                _check_kept(folder, kept.config, p, rid)
                row = _index_row(p, r, folder, kept.summary, "kept")
                rows.append(row)
                result.skipped += 1
                write_index(out, cfg.name, cfg.source, rows, total)
                emit(BenchEvent("skipped", run=p, repeat=r, done=done, total=total, row=row))
                continue
            emit(BenchEvent("start", run=p, repeat=r, done=done, total=total))

            def on_iter(b: int, rec: dict, p: PlannedRun = p, r: int = r, done: int = done) -> None:
                emit(BenchEvent("iteration", run=p, repeat=r, done=done, total=total,
                                iteration=b, record=rec))

            res = run(_own_checkpoints(p.config, rid), progress=on_iter)
            write_run(folder, res.config, res.metrics, res.summary,
                      trainer_metrics=res.trainer_metrics, evals=res.evals, trace=res.trace,
                      bench={"name": cfg.name, "run_id": rid, "repeat": r, "dataset": p.dataset,
                             "setting": p.setting, "variant": p.variant, "key": p.key})
            done += 1
            row = _index_row(p, r, folder, res.summary, "done")
            rows.append(row)
            result.ran += 1
            write_index(out, cfg.name, cfg.source, rows, total)
            emit(BenchEvent("done", run=p, repeat=r, done=done, total=total, row=row))
    result.index = pd.DataFrame(rows, columns=INDEX_COLUMNS)
    return result


def _own_files(folder: Path) -> Path:
    """A kept run's folder, none of whose files is a link (to another run's, say)."""
    links = [f for f in (folder, *sorted(folder.iterdir())) if f.is_symlink()]
    if links:
        raise ConfigError(f"--resume: {links[0]} is a symbolic link; a kept run's files are "
                          f"its own: remove {folder} to run it again")
    return folder


def _check_kept(folder: Path, stored: dict[str, Any], p: PlannedRun, rid: str) -> None:
    """A kept run is the planned one: its config.json's run id and every setting but its own
    checkpoint folder are the plan's (else it is another run's, copied or edited in)."""
    train, bench = stored.get("train"), stored.get("bench")
    where = f"--resume: {folder / 'config.json'}"
    if not isinstance(train, dict) or not isinstance(bench, dict) or bench.get("run_id") != rid:
        got = bench.get("run_id") if isinstance(bench, dict) else None
        raise ConfigError(f"{where} is the config of run {got}, not of {rid}; remove {folder} "
                          "to run it again")
    plan = json.loads(json.dumps(asdict(p.config), default=str))
    for k, want in plan.items():
        if k != "checkpoint_dir" and train.get(k, _UNSET) != want:
            raise ConfigError(f"{where}: {k} is {_show(train.get(k, _UNSET))}, but the bench "
                              f"plans {rid} with {_show(want)}; remove {folder} to run it again")


def _own_checkpoints(c: Any, rid: str) -> Any:
    """A run's checkpoints go to <checkpoint_dir>/<run-id>: one run's per folder
    (engine/records/lineage.py). An unfinished earlier attempt's there (a bench killed mid-run, now
    resumed: the run starts over) is removed first."""
    if not (c.checkpoint_every and c.checkpoint_dir):
        return c
    d = Path(c.checkpoint_dir) / rid
    if d.is_dir() and all(p.name.startswith(("ckpt-", ".ckpt-")) for p in d.iterdir()):
        shutil.rmtree(d)
    return replace(c, checkpoint_dir=str(d))


def _prepare(out: Path, resume: bool, cfg: BenchConfig) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not resume:
            raise ConfigError(f"--out {out} exists and is not empty; pass --resume to continue "
                              "that bench, or choose another --out")
        if not is_bench(out):
            raise ConfigError(f"--resume: {out} is not a bench folder (no bench.json)")
        _check_same_config(out, cfg)


# Keys of a stored bench config that do not change its runs: a resume may differ in them.
RESUME_FREE_KEYS = ("schema_version", "source", "description", "repeat")
SHOWN_DIFFERENCES = 3
_UNSET = object()


def _check_same_config(out: Path, cfg: BenchConfig) -> None:
    """A resumed bench adds runs of the config it was started with only: another config
    (another system, setting, dataset...) is refused, naming the differing keys."""
    stored = read_bench_file(out).get("config")
    if not isinstance(stored, dict):
        return  # read_bench_config names this when the config is needed
    given = json.loads(json.dumps(cfg.to_json(), default=str))
    diffs = [d for k in stored if k in given and k not in RESUME_FREE_KEYS
             for d in config_differences(stored[k], given[k], k)]
    if diffs:
        shown = "; ".join(f"{key}: {a} in {out / 'bench.json'}, {b} in {cfg.source}"
                          for key, a, b in diffs[:SHOWN_DIFFERENCES])
        more = len(diffs) - SHOWN_DIFFERENCES
        raise ConfigError(f"--resume: {out} holds a bench of another config ({shown}"
                          f"{f'; and {more} more' if more > 0 else ''}); resume it with its own "
                          f"config (bagpipe bench --resume --out {out}) or choose another --out")


def config_differences(a: Any, b: Any, key: str) -> list[tuple[str, str, str]]:
    """(key, a, b) for each leaf where two JSON values differ; mappings and lists of
    mappings are compared entry by entry, a list of names as a whole."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in dict.fromkeys([*a, *b])
                for d in config_differences(a.get(k, _UNSET), b.get(k, _UNSET), f"{key}.{k}")]
    if (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
            and any(isinstance(x, dict) for x in a + b)):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in config_differences(x, y, f"{key}[{i}]")]
    return [] if a == b else [(key, _show(a), _show(b))]


def _show(v: Any) -> str:
    """`[sync, bagpipe]` for a list of names, JSON otherwise; `unset` for a missing key."""
    if v is _UNSET:
        return "unset"
    if isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
        return f"[{', '.join(map(str, v))}]"
    return v if isinstance(v, str) else json.dumps(v)


# bench.json's record (beside the config) of each dataset's identity when the bench started:
# `engine.records.checkpoint.dataset_identity` (its shape and its arrays' checksums).
IDENTITIES = "dataset_identities"


def _check_same_sources(out: Path, cfg: BenchConfig, identities: dict[str, Any]) -> None:
    """A resumed bench adds runs of the datasets and the code it was started with only: a
    dataset that changed since (its shape or its arrays' checksums), or another bagpipe
    version or git revision, is refused, naming what changed (a bench whose bench.json
    predates these records is not compared)."""
    stored = read_bench_file(out).get("config")
    before = stored.get(IDENTITIES) if isinstance(stored, dict) else None
    for ds in cfg.datasets:
        was, now = (before if isinstance(before, dict) else {}).get(ds.name), identities[ds.name]
        changed = [_change(k, was.get(k), now.get(k)) for k in ("rows", "cardinalities",
                   "dense_features", "checksums") if isinstance(was, dict) and was.get(k) != now.get(k)]
        if changed:
            raise ConfigError(f"--resume: dataset {ds.name} ({ds.path}) changed since {out} was "
                              f"started: {'; '.join(changed)}; its runs would mix two datasets in "
                              "one table: restore the dataset, or start the bench afresh in "
                              "another --out")
    env_path = out / "environment.json"
    if not env_path.is_file():
        return
    was_env, now_env = read_json(env_path, None), environment()
    for key, what in (("bagpipe_version", "bagpipe version"), ("git_revision", "git revision")):
        a, b = was_env.get(key), now_env.get(key)
        if a and b and a != b:
            raise ConfigError(f"--resume: {out} was started by {what} {a} ({env_path}), this is "
                              f"{b}; its runs would mix two versions of the code in one table: "
                              "resume with that code, or start the bench afresh in another --out")


def _change(key: str, was: Any, now: Any) -> str:
    """What changed in a dataset's identity, in words."""
    if key == "checksums" and isinstance(was, dict) and isinstance(now, dict):
        differ = sorted(f for f in {*was, *now} if was.get(f) != now.get(f))
        return (f"the checksums of {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''} "
                "differ (re-created, or another dataset)")
    if key == "cardinalities" and isinstance(was, list) and isinstance(now, list):
        return f"its tables' rows were {_show(was)}, now {_show(now)}"
    return f"{key} was {_show(was)}, now {_show(now)}"


def _datasets(cfg: BenchConfig, out: Path, emit: ProgressFn) -> list[str]:
    """Check (or generate) every dataset, then make the bench folder: a bench whose dataset
    is missing or wrong leaves no folder behind (the corrected rerun with the same --out
    would be refused as not empty). Returns the datasets generated."""
    fresh = not out.exists()
    try:
        made = [ds.name for ds in cfg.datasets if prepare_dataset(ds, emit)]
    except BaseException:
        if fresh:
            shutil.rmtree(out, ignore_errors=True)
        raise
    (out / "runs").mkdir(parents=True, exist_ok=True)
    return made


def read_bench_config(out: Path) -> dict[str, Any]:
    """The bench config stored in a bench folder (for `--resume` without a CONFIG)."""
    if not is_bench(out):
        raise ConfigError(f"--resume: {out} is not a bench folder (no bench.json)")
    config = read_bench_file(out).get("config")
    if not isinstance(config, dict):
        raise ConfigError(f"--resume: {Path(out) / 'bench.json'} holds no bench config; give "
                          "the CONFIG file")
    return {k: v for k, v in config.items() if k in BENCH_KEYS}


def _index_row(p: PlannedRun, r: int, folder: Path, s: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "run_id": p.run_id(r), "repeat": r, "system": p.config.system, "model": p.config.model,
        "dataset": p.dataset, "setting": p.setting_label, "variant": p.variant_label,
        "status": status, "path": f"runs/{folder.name}",
        **{k: s.get(k) for k in ("samples_per_s", "mean_iter_ms", "median_iter_ms", "p10_iter_ms", "p90_iter_ms",
                                 "final_loss", "eval_auc", "network_emulated", "wall_s")},
        "finished": now() if status == "done" else None,
    }


def prepare_dataset(ds, emit: ProgressFn) -> bool:
    """Generate a missing synthetic dataset; check an existing one. True if generated."""
    if not ds.path.exists():
        if ds.synth is None:
            raise ConfigError(
                f"dataset {ds.name}: {ds.path} does not exist; make it first, e.g. "
                f"`bagpipe preprocess criteo train.txt --out {ds.path}` (paths are relative to "
                "the current directory)")
        sc = SynthConfig(**ds.synth)
        emit(BenchEvent("dataset", message=f"generating {ds.name} into {ds.path}"))
        t0 = time.perf_counter()
        generate(sc, ds.path)
        emit(BenchEvent("dataset", message=f"generated {ds.name} in {time.perf_counter() - t0:.1f} s"))
        return True
    meta = open_dataset(ds.path).meta
    if ds.synth is not None:
        want = asdict(SynthConfig(**ds.synth))
        want["rows"] = SynthConfig(**ds.synth).num_rows
        have = getattr(meta, "options", None) or {}
        diff = sorted(k for k in want if k in have and have[k] != want[k])
        if diff:
            raise ConfigError(f"dataset {ds.name}: {ds.path} exists but was generated with other "
                              f"options ({', '.join(f'{k}={have[k]!r}' for k in diff)}); delete it "
                              "or change the dataset's path")
    return False


def _profile(cfg: BenchConfig, plan: list[PlannedRun], ds, out: Path, emit: ProgressFn) -> None:
    if (out / "profile.json").is_file():
        return
    runs = [p.config for p in plan if p.dataset == ds.name]
    prof = cfg.profile
    lookaheads = prof.lookaheads or tuple(sorted({c.lookahead for c in runs if spec(c.system).rounds})
                                          or {runs[0].lookahead})
    pc = ProfileConfig(data=ds.path, batch_size=prof.batch_size or runs[0].batch_size,
                       lookaheads=lookaheads, policies=prof.policies, dim=prof.dim or runs[0].emb_dim)
    emit(BenchEvent("profile", message=f"profiling {ds.name} (batch {pc.batch_size}, "
                                       f"L={','.join(map(str, lookaheads))})"))
    write_profile(run_profile(pc), out, overwrite=True)
