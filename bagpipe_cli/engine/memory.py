"""What a training run will hold in memory, estimated before anything is allocated.

`estimate_run(cfg, shape)` counts, for every process of the run (one in-process; with
`--procs` or torchrun the planner (rank 0), each server and each trainer, and `--procs`' launcher):

- tables: the servers' embedding rows and their optimizer state (float32), and what a
  trainer holds of them while it trains (its registry entry's `holds_tables`: all, or a shard);
- planner: the oracle's per-row state (PLANNER_BYTES_PER_ROW), what the system's own planner
  keeps per row (its registry entry's `planner_bytes_per_row`) and, for a fixed-capacity
  cache (`capacity_from_peak`), the run's trace it plans from;
- caches: the trainer's cache, --cache-rows rows, or by default a bound on bagpipe's peak
  (the accesses of L + C batches, at most every row); a hot set replicated on sharded tables,
  at most the rows of its profiled batches;
- dense model: weights, gradients and (adam) its two moments and its step's temporaries;
- inputs: the batches in flight (keys, dense features, labels);
- activations: a training step: the rows its accesses read and their gradients (B x T x R
  floats each), what the model's forward keeps for the backward and its gradient
  (`models.footprint`), and the per-row sums over the batch's unique rows;
- evaluation: the held-out tail's forward, EVAL_BATCH samples at a time;
- processes: an idle process with torch and the engine imported (BASE_PROCESS_BYTES).

A process holds its tables, planner, caches, dense model and inputs throughout, and at one
time the largest of its transients: a training step, an evaluation, the old cache while a
growing one is copied, the final tables gathered, a chunk of rows being initialised. On a
GPU the trainers' caches, model and activations are the GPU's, not counted here.
`check_run_memory` refuses a run whose processes on this machine (in-process, or --procs'
ranks and launcher) need more than its memory (or its cgroup's limit), in one line that
names the largest part and the option that lowers it; `check_hosts` checks a torchrun job's
ranks machine by machine. No torch, and no arrays: sizes are counted, not allocated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bagpipe_cli.engine.registry import SystemSpec, listed, names_where
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.limits import human_bytes, machine_memory, memory_source
from bagpipe_cli.policies.decisions import profiled_batches

FLOAT = 4
# The least memory per embedding row a run keeps whatever its system: the planner's four
# int32 arrays and the key sets' mark and position (bool + int32).
PLANNER_BYTES_PER_ROW = 21
# Bagpipe's partitioned cache (N > 1): the oracle keeps each row's home (int16).
PARTITION_BYTES_PER_ROW = 2
# An idle process that imported torch and the engine: its peak RSS, measured (287 MiB with
# torch 2 on Linux), rounded up.
BASE_PROCESS_BYTES = 300 * 2**20
EVAL_BATCH = 8192  # engine/trainer/evaluation.py's samples at a time
TRACE_BYTES_PER_ACCESS = 12  # a planned trace's key (int64) and count (int32) per unique access
LOADER_AHEAD = 16  # batches read ahead of the planner (2 x MAX_LOADER_WORKERS)
INIT_CHUNK = 1 << 20  # rows engine/comm/shards.py initialises at a time

# What lowers each part: the refusal names the largest's.
FIXES = {
    "tables": "lower --emb-dim, or use a dataset with fewer rows per table "
              "(preprocess --max-rows-per-table)",
    "planner": "use a dataset with fewer rows per table (preprocess --max-rows-per-table), or "
               f"fewer --iterations for {listed(names_where(lambda s: s.capacity_from_peak))}",
    "caches": "lower --lookahead (the cache holds the rows of the batches it looks ahead at), "
              "or give a smaller --cache-rows",
    "dense model": "use smaller --bottom-mlp/--top-mlp layers",
    "inputs": "lower --batch-size or --lookahead",
    "activations": "lower --batch-size or --emb-dim",
    "evaluation": "lower --eval-rows or --emb-dim",
    "processes": "use fewer --servers/--trainers",
}


@dataclass(frozen=True)
class RunShape:
    """What an estimate reads besides the config: the dataset's and the model's sizes."""

    cardinalities: tuple[int, ...]  # rows of each table
    dense: int  # D: dense features
    row_dim: int  # R: floats of a row
    state_dim: int  # optimizer state floats per row
    eval_rows: int  # held-out samples
    dense_params: int  # the dense model's parameters
    kept_per_sample: int  # floats the model's forward keeps for its backward (`footprint`)
    trainers_on_gpu: bool = False  # the trainers' caches, model and steps are on GPUs

    @property
    def tables(self) -> int:
        """T: rows a sample reads, one a table."""
        return len(self.cardinalities)

    @property
    def total_rows(self) -> int:
        return sum(self.cardinalities)

    def unique_rows(self, batch: int) -> int:
        return unique_rows(self.cardinalities, batch)


def unique_rows(cardinalities: tuple[int, ...] | list[int], batch: int) -> int:
    """The most distinct rows a batch of `batch` samples reads: a table gives at most one a
    sample, and at most its rows."""
    return sum(min(n, batch) for n in cardinalities)


@dataclass(frozen=True)
class Process:
    """One process's estimate: what it holds throughout, and its transients (the largest
    counts: they do not overlap)."""

    role: str  # inproc, planner, server, trainer or launcher
    held: dict[str, int]
    transient: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.held.values()) + max(self.transient.values(), default=0)

    def parts(self) -> dict[str, int]:
        """Its bytes by part: the held ones and the largest transient."""
        out = dict(self.held)
        if self.transient:
            name = max(self.transient, key=self.transient.__getitem__)
            out[name] = out.get(name, 0) + self.transient[name]
        return out


@dataclass(frozen=True)
class RunMemory:
    """A run's estimate: its ranks (one in-process) and those on this machine."""

    ranks: list[Process]
    here: list[Process]  # the processes this machine runs (a --procs launcher included; a
    #                      torchrun job: none known yet, `check_hosts` checks every host's)

    @property
    def estimate_bytes(self) -> int:
        """Every rank's estimate, summed (what the measured peaks are compared with)."""
        return sum(p.bytes for p in self.ranks)

    @property
    def here_bytes(self) -> int:
        return sum(p.bytes for p in self.here)

    def parts(self) -> dict[str, int]:
        """Every rank's bytes by part, summed."""
        out: dict[str, int] = {}
        for p in self.ranks:
            for k, v in p.parts().items():
                out[k] = out.get(k, 0) + v
        return out

    def to_json(self) -> dict[str, Any]:
        return {"estimate_bytes": self.estimate_bytes, "processes": len(self.ranks),
                "parts": self.parts()}


def table_bytes(rows: int, row_dim: int, state_dim: int) -> int:
    """Bytes of `rows` embedding rows of `row_dim` floats and `state_dim` floats of optimizer
    state each (float32): the tables part of every estimate (and report/guidance.py's fit)."""
    return FLOAT * int(rows) * (int(row_dim) + int(state_dim))


def estimate_run(cfg: Any, spec: SystemSpec, shape: RunShape) -> RunMemory:
    """The memory of a run of `cfg` (a TrainConfig) over `shape`, process by process."""
    tables = table_bytes(shape.total_rows, shape.row_dim, shape.state_dim)
    # Weights and gradients; adam's two moments and the two temporaries of its step.
    dense = FLOAT * shape.dense_params * (6 if cfg.dense_optimizer == "adam" else 2)
    init = 2 * FLOAT * min(INIT_CHUNK, max(shape.cardinalities)) * shape.row_dim  # chunk, gather
    cache, growth = _cache(cfg, spec, shape)
    gpu = shape.trainers_on_gpu
    evaluation = _evaluation(shape)
    if cfg.transport == "inproc":
        step = 0 if gpu else _step(shape, cfg.batch_size, cfg.trainers, cfg.batch_size)
        final = tables if cfg.servers > 1 else 0  # the shards gathered into one copy
        one = Process("inproc", {"processes": BASE_PROCESS_BYTES, "tables": tables,
                                 "planner": _planner(cfg, spec, shape),
                                 "caches": 0 if gpu else cache, "dense model": 0 if gpu else dense,
                                 "inputs": _inputs(cfg, spec, shape, cfg.batch_size, True)},
                      {"activations": step, "evaluation": evaluation,
                       "caches": 0 if gpu else growth, "tables": max(final, init)})
        return RunMemory([one], [one])
    share = FLOAT * -(-shape.total_rows // cfg.servers) * (shape.row_dim + shape.state_dim)
    per = cfg.batch_size // cfg.trainers
    planner = Process("planner", {"processes": BASE_PROCESS_BYTES, "planner": _planner(cfg, spec, shape),
                                "inputs": _inputs(cfg, spec, shape, cfg.batch_size, False),
                                "tables": tables, "dense model": FLOAT * shape.dense_params},
                     {"evaluation": evaluation})
    server = Process("server", {"processes": BASE_PROCESS_BYTES, "tables": share},
                     {"tables": max(share, init)})
    held = {"all": tables, "shard": -(-tables // cfg.trainers)}.get(spec.holds_tables, 0)
    trainer = Process("trainer", {"processes": BASE_PROCESS_BYTES, "tables": held,
                                  "caches": 0 if gpu else cache,
                                  "dense model": 0 if gpu else dense,
                                  "inputs": _inputs(cfg, spec, shape, per, True)},
                      {"activations": 0 if gpu else _step(shape, per, 1, cfg.batch_size),
                       "caches": 0 if gpu else growth})
    ranks = [planner] + [server] * cfg.servers + [trainer] * cfg.trainers
    if cfg.procs is not None:  # the launcher loads the result: the final tables
        launcher = Process("launcher", {"processes": BASE_PROCESS_BYTES, "tables": tables})
        return RunMemory(ranks, [*ranks, launcher])
    return RunMemory(ranks, [])


def _step(shape: RunShape, samples: int, slices: int, batch: int) -> int:
    """A training step of `samples` samples in `slices` trainer slices: the rows read and
    their gradients, what the forward keeps and its gradient, and per unique row of the
    (global) batch: the rows, each slice's partial sum, and the updated rows."""
    per_sample = 2 * shape.tables * shape.row_dim + 2 * shape.kept_per_sample
    return FLOAT * (samples * per_sample + (slices + 2) * shape.unique_rows(batch) * shape.row_dim)


def _evaluation(shape: RunShape) -> int:
    """The held-out forward of EVAL_BATCH samples: their rows and the forward's tensors."""
    n = min(EVAL_BATCH, shape.eval_rows)
    return FLOAT * n * (shape.tables * shape.row_dim + shape.kept_per_sample)


def _cache(cfg: Any, spec: SystemSpec, shape: RunShape) -> tuple[int, int]:
    """(the trainer cache's bytes, the old copy a growing one holds while it grows; for a
    hot set replicated on sharded tables, the profile's per-row counts while it is chosen)."""
    if spec.holds_tables == "shard" and "hot_sample" in spec.reads:
        return _hot_replica(cfg, shape)
    if "cache_rows" not in spec.reads:
        return 0, 0
    window = (cfg.lookahead + spec.round_length(cfg.lookahead, cfg.round)) * cfg.batch_size
    rows = cfg.cache_rows or shape.unique_rows(window)
    size = FLOAT * rows * (shape.row_dim + shape.state_dim)
    return size, size if cfg.cache_rows is None and spec.rounds else 0


def _hot_replica(cfg: Any, shape: RunShape) -> tuple[int, int]:
    """A hot set on every trainer of sharded tables (sharded-hot's): at most the rows the
    profiled first --hot-sample share of the batches read (none at one trainer), with their
    optimizer state; while it is chosen, three int32 counts per row of the tables."""
    if cfg.trainers < 2:
        return 0, 0
    rows = shape.unique_rows(profiled_batches(cfg.iterations, cfg.hot_sample) * cfg.batch_size)
    return FLOAT * rows * (shape.row_dim + shape.state_dim), 12 * shape.total_rows


def _planner(cfg: Any, spec: SystemSpec, shape: RunShape) -> int:
    """The oracle's per-row state, the system's own planner's, and a fixed-capacity cache's
    trace of the run."""
    trace = 0
    if spec.capacity_from_peak:
        trace = TRACE_BYTES_PER_ACCESS * cfg.iterations * shape.unique_rows(cfg.batch_size)
    per_row = (PLANNER_BYTES_PER_ROW + spec.planner_bytes_per_row
               + (PARTITION_BYTES_PER_ROW if spec.partitioned and cfg.trainers > 1 else 0))
    return per_row * shape.total_rows + trace


def _inputs(cfg: Any, spec: SystemSpec, shape: RunShape, samples: int, with_samples: bool) -> int:
    """The batches in flight: read ahead, and a round's L + C planned ahead; per sample its
    keys and their positions (int64), and its dense features and label (float32)."""
    batches = LOADER_AHEAD + (cfg.lookahead + 2 * spec.round_length(cfg.lookahead, cfg.round)
                              if spec.rounds else 2)
    per_sample = 16 * shape.tables + (FLOAT * (shape.dense + 1) if with_samples else 0)
    return batches * samples * per_sample


def check_run_memory(cfg: Any, shape: RunShape, memory: RunMemory) -> None:
    """Refuse a run whose processes on this machine need more memory than it has, in one
    line: the options of the largest part, the estimate and its largest parts, what there is
    and what to lower."""
    fixes = {**FIXES, "caches": "lower --cache-rows"} if cfg.cache_rows else FIXES
    refuse_over(memory.here, lambda part: _lead(cfg, shape, part), fixes)


def check_hosts(cfg: Any, shape: RunShape, memory: RunMemory, hosts: list[str],
                haves: list[int]) -> None:
    """A torch.distributed job's ranks by machine (`hosts[r]` is rank r's, `haves[r]` its
    memory): each machine's ranks must fit it. Every rank decides from every rank's facts,
    so all refuse alike."""
    fixes = {**FIXES, "caches": "lower --cache-rows"} if cfg.cache_rows else FIXES
    for host in dict.fromkeys(hosts):
        ranks = [r for r, h in enumerate(hosts) if h == host]
        refuse_over([memory.ranks[r] for r in ranks], lambda part: _lead(cfg, shape, part), fixes,
                    (haves[ranks[0]], f"{host}'s"))


def refuse_over(processes: list[Process], lead: Callable[[str], str], fixes: dict[str, str],
                machine: tuple[int, str] | None = None) -> None:
    """Refuse what `processes` would need when it is more than this machine's memory (or its
    cgroup's limit; `machine`: another's, and whose): one line, led by `lead(part)` of the
    largest part, with the estimate, its largest parts and `fixes[part]`."""
    have, whose = machine or (machine_memory(), memory_source())
    need = sum(p.bytes for p in processes)
    if need <= have:
        return
    parts: dict[str, int] = {}
    for p in processes:
        for k, v in p.parts().items():
            parts[k] = parts.get(k, 0) + v
    top = sorted((k for k in parts if parts[k] > 0), key=parts.__getitem__, reverse=True)
    detail = ", ".join(f"{k} {human_bytes(parts[k])}" for k in top[:3])
    where = f" in {len(processes)} processes" if len(processes) > 1 else ""
    raise ConfigError(f"{lead(top[0])} needs about {human_bytes(need)} of memory ({detail}"
                      f"{where}), more than {whose} {human_bytes(have)}; "
                      f"{fixes[top[0]]}")


def _lead(cfg: Any, shape: RunShape, part: str) -> str:
    """The options behind `part`, and what they make."""
    rows, floats = f"{shape.total_rows:,}", f"{shape.tables} rows of {shape.row_dim:,} floats"
    if part == "dense model":
        return (f"--bottom-mlp {_sizes(cfg.bottom_mlp)} --top-mlp {_sizes(cfg.top_mlp)}: "
                "the dense model")
    if part == "activations":
        return (f"--batch-size {cfg.batch_size} --emb-dim {cfg.emb_dim}: a training step "
                f"over {cfg.batch_size:,} samples of {floats}")
    if part == "evaluation":
        return (f"--eval-rows {shape.eval_rows} --emb-dim {cfg.emb_dim}: evaluating "
                f"{min(EVAL_BATCH, shape.eval_rows):,} held-out samples of {floats} at a time")
    if part == "inputs":
        return f"--batch-size {cfg.batch_size} --lookahead {cfg.lookahead}: the batches in flight"
    if part == "processes":
        return (f"--servers {cfg.servers} --trainers {cfg.trainers}: a job of "
                f"{cfg.world_size} processes")
    cached = f" with --cache-rows {cfg.cache_rows:,}" if cfg.cache_rows else ""
    return (f"--emb-dim {cfg.emb_dim}: a run over {rows} embedding rows of "
            f"{shape.row_dim + shape.state_dim:,} floats{cached}")


def _sizes(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers))


# --------------------------------------------------------------- profile and simulate

# An idle `bagpipe profile`: numpy, pandas and matplotlib imported (measured ~100 MiB).
PROFILE_BASE_BYTES = 150 * 2**20
DATASET_FIX = "use a dataset with fewer rows per table (preprocess --max-rows-per-table)"


def estimate_profile(cardinalities: list[int], samples: int, batch_size: int, keeps_trace: bool,
                     spill_entries: int) -> Process:
    """`bagpipe profile`'s process: per row the skew's count (int64), the trace pass's last
    use and first position (int32 each) and, with a fixed-capacity policy, its residency,
    queue key and next use or count; the trace it keeps (a key and a count per unique access,
    once gathered and once joined, up to `spill_entries`: beyond, it is on disk); a batch's
    keys, their unique rows and positions (int64)."""
    batches = -(-samples // batch_size)
    kept = min(spill_entries, batches * unique_rows(cardinalities, batch_size)) if keeps_trace else 0
    return Process("profile", {"processes": PROFILE_BASE_BYTES,
                               "rows": (25 if keeps_trace else 16) * sum(cardinalities),
                               "trace": 2 * TRACE_BYTES_PER_ACCESS * kept,
                               "inputs": 3 * 8 * batch_size * len(cardinalities)})


def estimate_simulate(cardinalities: list[int], iterations: int, cfg: Any,
                      specs: list[SystemSpec]) -> Process:
    """`bagpipe simulate`'s process (torch imported): the planner's per-row state, the
    trace the fixed-capacity caches plan over, every system's volumes (about ten int64 counts per
    iteration and server), and the batches in flight."""
    rounds = any(s.rounds for s in specs)
    trace = (TRACE_BYTES_PER_ACCESS * iterations * unique_rows(cardinalities, cfg.batch_size)
             if any(s.capacity_from_peak for s in specs) else 0)
    per_iteration = 8 * ((4 + cfg.trainers) * cfg.servers + 4) + 1
    ahead = LOADER_AHEAD + (cfg.lookahead + 2 * (cfg.round or max(1, cfg.lookahead // 4))
                            if rounds else 2)
    return Process("simulate", {"processes": BASE_PROCESS_BYTES,
                                "planner": PLANNER_BYTES_PER_ROW * sum(cardinalities),
                                "trace": trace, "volumes": len(specs) * iterations * per_iteration,
                                "inputs": ahead * 16 * cfg.batch_size * len(cardinalities)})
