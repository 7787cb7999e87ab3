"""The configuration of one training run: every option, its default, help and section, in one place.

`bagpipe train`'s options are generated from these fields (`cli/options.py`) and shown grouped by
section, a bench file's `base`/`matrix` keys are these fields, and the whole config is stored with
every result. Another command's config (`bagpipe simulate`'s) takes a field that means the same
thing from here with `shared`, so it has one default and help.

It imports without torch (the command line builds its options from it first): the systems come
from the registry (`engine/registry.py`, which imports builders only when called), the other
choices from light constants, held equal to the heavy modules' by tests/test_startup.py.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.registry import ALL_SYSTEMS, OURS, SYSTEMS, listed, names_where, spec
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.launch.placement import PLACEMENTS
from bagpipe_cli.limits import INT32_MAX
from bagpipe_cli.model_names import MODEL_NAMES

# Why a distributed job needs the dataset on every machine (its errors say it).
SHARED_DATA = ("every rank of a distributed job reads the dataset itself (the trainers their own samples), "
               "so it must be at the same path on every machine: a shared file system, or a copy of "
               "the dataset folder on each")

EMB_OPTIMIZERS = ("sgd", "adagrad")  # engine/trainer/optim.py's RowOptimizer
DENSE_OPTIMIZERS = ("sgd", "adam")
COLLECTIVE_KINDS = ("exact", "allgather", "allreduce")  # engine/comm/collective.py KINDS
DEVICE_FORM = re.compile(r"auto|cpu|cuda(:\d+)?")  # --device
TRANSPORTS = ("inproc", "torch")
BACKENDS = ("gloo", "nccl")
# The sections of a command's help, in this order (a field's `section`).
SECTIONS = ("data", "model", "system", "cluster and network", "runtime", "checkpoints", "output")
# Upper bounds, with why (a field's `at_most`); every other integer is at most INT32_MAX.
MAX_ITERATIONS = (10**9, "at 1 ms an iteration, 10^9 iterations take 11.6 days")
MAX_PEERS = (4096, "a thread or process each")
MAX_THREADS = (1024, "more threads than any machine has cores")
MAX_SEED = 2**63 - 1
MAX_LR = (10**6, "rates that large only overflow the float32 weights")


def setting(default: Any, help: str, *, section: str, option: str | None = None,
            choices: tuple[str, ...] | None = None, at_least: int | None = None,
            cli: bool = True, multiple: bool = False, factory: Any = None,
            at_most: tuple[int, str] | None = None, path: str | None = None) -> Any:
    """A config field with its command-line help and the section of the help it is shown in.

    `option` overrides `--field-name`; `choices`, `at_least` and `at_most` (bounds of every
    element of a tuple; `at_most` is (bound, why)) are checked by `check_settings`;
    `multiple`: a tuple option given once per value (`--calibrate A --calibrate B`) instead
    of comma-separated; `factory` makes a mutable default (dict); `path`: the option names a
    path the command reads ("input") or writes (what it makes: `outputs.Output.makes`), which the
    command line checks by the one output rule (`cli.common.check_outputs`).
    """
    if section not in SECTIONS:
        raise ValueError(f"section {section!r}: choose one of {SECTIONS}")
    meta = {"help": help, "option": option, "choices": choices, "cli": cli, "section": section,
            "at_least": at_least, "multiple": multiple, "at_most": at_most, "path": path}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def field_option(f: Field) -> str:
    """The command-line option of a config field (`timeout_s` -> `--timeout`)."""
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


def option_name(name: str) -> str:
    """The command-line option of TrainConfig field `name`."""
    return field_option(_train_field(name))


def _train_field(name: str) -> Field:
    return next(f for f in fields(TrainConfig) if f.name == name)


def shared(name: str) -> Any:
    """A field of another command's config that means what TrainConfig's field `name` means:
    the same default, help, option, choices, checks and section, declared once (here)."""
    f = _train_field(name)
    return field(default=f.default, metadata=f.metadata)


@dataclass(frozen=True)
class TrainConfig:
    """One training run (`bagpipe train`, one run of `bagpipe bench`)."""

    data: str = setting(MISSING, "Dataset directory.", cli=False, section="data")
    system: str = setting("bagpipe", "; ".join(f"{s.name}: {s.summary}" for s in SYSTEMS.values()) + ".",
                          choices=ALL_SYSTEMS, section="system")
    model: str = setting("dlrm", "Dense model.", choices=MODEL_NAMES, section="model")
    batch_size: int = setting(1024, "Global batch size (split evenly over the trainers).",
                              at_least=1, section="data")
    iterations: int = setting(100, "Training iterations: batch b is full batch b mod M of the M in the training rows, so the data wraps around "
                                   "and a last partial batch (training rows mod --batch-size) is never trained on.", at_least=1, section="data", at_most=MAX_ITERATIONS)
    lookahead: int = setting(16, "L: batches the oracle looks ahead.", at_least=1, section="system")
    round: int | None = setting(None, "C: iterations per prefetch/evict round [default: L/4].",
                                section="system")
    cache_rows: int | None = setting(None, f"Cache rows of {listed(names_where(lambda s: 'cache_rows' in s.reads))} "
                                           f"[default: {OURS}'s peak at --lookahead].", at_least=1, section="system")
    staleness: int = setting(0, "het: versions a cached row may lag behind the servers.", at_least=0, section="system")
    hot_sample: float = setting(1.0, "fae: fraction of the run's batches profiled to pick the "
                                     "--cache-rows hot rows.", section="system")
    snapshot_every: int = setting(50, "slipstream: iterations K between snapshots of the hot rows "
                                      "(little change over K: stale).", at_least=1, section="system")
    drop_target: float = setting(0.0, "slipstream: the share of samples to skip (D, 0-1), which sets "
                                      "the staleness threshold (0: none, fae's run).", section="system")
    stale_share: float = setting(0.5, "slipstream: skip a sample when this share of its rows is "
                                      "stale (alpha, in (0, 1]).", section="system")
    emb_dim: int = setting(16, "E: embedding dimension.", at_least=1, section="model")
    bottom_mlp: tuple[int, ...] = setting((64, 32), "DLRM's bottom MLP hidden sizes, e.g. 512,256,64 "
                                                    "(an output layer of E follows).", section="model")
    top_mlp: tuple[int, ...] = setting((64, 32), "Top (DLRM) / deep (WDL, DeepFM, DCN) MLP hidden "
                                                 "sizes, e.g. 1024,1024,1024,256,128.", section="model")
    optimizer: str = setting("sgd", "Embedding optimizer (adagrad: row-wise).",
                             choices=EMB_OPTIMIZERS, section="model")
    lr: float = setting(0.1, "Embedding learning rate.", section="model", at_most=MAX_LR)
    dense_optimizer: str = setting("sgd", "Dense optimizer.", choices=DENSE_OPTIMIZERS, section="model")
    dense_lr: float | None = setting(None, "Dense learning rate [default: --lr].", section="model",
                                     at_most=MAX_LR)
    seed: int = setting(0, "Seed of the dense weights and the initial tables.", section="model")
    trainers: int = setting(1, "N data-parallel trainers.", at_least=1, section="cluster and network",
                            at_most=MAX_PEERS)
    servers: int = setting(1, "K embedding server shards (rows sharded by key % K).", at_least=1,
                           section="cluster and network", at_most=MAX_PEERS)
    net_gbps: float | None = setting(None, "Network bandwidth (Gbit/s) between trainers and servers, "
                                           "and among trainers (train emulates it) [default: "
                                           "unlimited].", section="cluster and network")
    net_latency_us: float = setting(0.0, "Network latency per message (microseconds).",
                                    section="cluster and network")
    collective: str = setting("exact", "How trainers sum gradients: exact (bitwise the "
                                       "in-process sums at a ring all-reduce's bytes), allgather "
                                       "(bitwise, N times the bytes) or allreduce (the "
                                       "library's own order: within float rounding).",
                              choices=COLLECTIVE_KINDS, section="cluster and network")
    net_shape: bool = setting(False, "With --procs: run every rank in a network namespace of its "
                                     "own whose link the kernel rate-limits to --net-gbps (tc "
                                     "token bucket; needs root) instead of sleeping per transfer.",
                              section="cluster and network")
    eval_rows: int | None = setting(None, "Held-out tail rows (for AUC), left out of training "
                                          "[default: 10%, at most 50,000].", section="data")
    warmup: int = setting(5, "Iterations excluded from the speed figures.", at_least=0,
                          section="output")
    trace: str | None = setting(None, "Write the run's timeline here: every role's events as "
                                      "Chrome trace-event JSON (open it in ui.perfetto.dev or "
                                      "chrome://tracing).", section="output", path="file")
    eval_every: int = setting(0, "Evaluate the held-out rows every N iterations, timed apart, "
                                 "into metrics_eval.csv (0: only at the end).", at_least=0,
                              section="output")
    target_auc: float | None = setting(None, "The held-out AUC whose time to reach the summary "
                                             "and the report give (needs --eval-every).",
                                       section="output")
    transport: str = setting("inproc", "inproc: one process; torch: torch.distributed ranks "
                                       "(launched by torchrun, or by --procs).", choices=TRANSPORTS,
                             section="runtime")
    procs: int | None = setting(None, "Start the ranks here as local processes: 1 planner + "
                                      "--servers + --trainers (implies --transport torch).",
                                at_least=1, section="runtime")
    master: str | None = setting(None, "With --procs on several machines: HOST:PORT of the first "
                                       "machine's rank 0, where every rank meets; each machine "
                                       "starts --procs of the ranks.", section="runtime")
    node_rank: int = setting(0, "With --master: this machine's place among them (0: the one "
                                "with rank 0, whose HOST --master names).", at_least=0,
                             section="runtime")
    timeout_s: float = setting(120.0, "torch transport: seconds a rank waits for a peer.",
                               option="--timeout", section="runtime",
                               at_most=(365 * 86400, "a year"))
    device: str = setting("auto", "Where trainers compute: cpu, cuda (a machine's GPUs in turn), "
                                  "cuda:K, or auto (a GPU where there is one); servers and the "
                                  "oracle stay on the CPU.", section="runtime")
    nondeterministic: bool = setting(False, "On a GPU, let torch use its faster nondeterministic "
                                            "kernels (atomic adds): results then differ from run "
                                            "to run, and from sync's, in the last bits.",
                                     section="runtime")
    loader_workers: int | None = setting(None, "The planner's reader threads: they read batches and "
                                               "find their unique rows ahead of its planning "
                                               "[default: the cores --placement keeps for it].", at_least=1,
                                         section="runtime", at_most=MAX_THREADS)
    planners: int | None = setting(None, "The planner's workers, each planning a slice of the rows [default: "
                                         "one per 262,144 accesses of a batch, at most the planner's cores].",
                                   at_least=1, section="runtime", at_most=MAX_THREADS)
    backend: str = setting("gloo", "torch transport: the trainers' collectives (nccl needs "
                                   "--device cuda and a GPU per trainer).", choices=BACKENDS,
                           section="runtime")
    threads: int | None = setting(None, "torch compute threads [default: from --placement].",
                                  at_least=1, section="runtime", at_most=MAX_THREADS)
    placement: str = setting("auto", "auto: keep cores for the planner and the servers, give "
                                     "the trainers' torch threads the rest, pinned where the OS "
                                     "allows; off: leave it to the OS and torch's default.",
                             choices=PLACEMENTS, section="runtime")
    checkpoint_every: int = setting(0, "Checkpoint every N iterations (0: never).", at_least=0,
                                    section="checkpoints")
    checkpoint_dir: str | None = setting(None, "Where checkpoints go [default: <--out>.ckpt].",
                                         section="checkpoints", path="checkpoints")
    checkpoint_keep: int = setting(2, "Newest good checkpoints kept.", at_least=1,
                                   section="checkpoints")
    resume: str | None = setting(None, "Resume from a checkpoint folder, or the newest good one "
                                       "in a --checkpoint-dir.", section="checkpoints",
                         path="input")

    def __post_init__(self) -> None:
        s = spec(self.system)
        check_settings(self)
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be > 0 (got {self.timeout_s})")
        if not DEVICE_FORM.fullmatch(self.device):
            raise ConfigError(f"--device {self.device!r}: choose auto, cpu, cuda or cuda:K")
        self._check_launch(s)
        if not (s.is_exact(self) or s.resumable) and (self.checkpoint_every or self.resume):
            # Its trainers read stale copies that a checkpoint of the true parameters does
            # not hold, so a resumed run would not be the run that was stopped.
            key, value = s.exact_only_if or (None, None)
            fix = f"use {option_name(key)} {value} or another system" if key else "use another system"
            raise ConfigError(f"--checkpoint-every/--resume: {self.system} with {s.inexact_when} "
                              f"cannot be resumed exactly; {fix}")
        if not self.lr > 0:  # what RowOptimizer checks, without importing it (torch)
            raise ConfigError(f"--lr must be > 0 (got {self.lr})")
        self._check_measured()
        self._check_output()

    def _check_measured(self) -> None:
        """A dense learning rate torch accepts, and a warm-up that leaves iterations to measure
        (the default warm-up of a run at most that long measures every iteration)."""
        if self.dense_lr is not None and not self.dense_lr > 0:
            raise ConfigError(f"--dense-lr must be > 0 (got {self.dense_lr})")
        default = type(self).__dataclass_fields__["warmup"].default
        if self.warmup >= self.iterations and self.warmup != default:
            raise ConfigError(f"--warmup {self.warmup} leaves none of the {self.iterations} "
                              "iterations measured; lower --warmup or raise --iterations")

    def _check_launch(self, s) -> None:
        if s.external and (self.transport != "inproc" or self.procs is not None):
            raise ConfigError(f"--system {self.system} starts its own --trainers processes; drop --procs/--transport torch")
        if self.procs is not None:
            if self.transport != "torch":
                raise ConfigError("--procs starts torch.distributed ranks: use it with --transport torch")
            if self.master is None and self.procs != self.world_size:
                raise ConfigError(f"--procs {self.procs}: a run with --servers {self.servers} and "
                                  f"--trainers {self.trainers} needs 1 + {self.servers} + "
                                  f"{self.trainers} = {self.world_size} processes")
        self._check_nodes()
        if self.net_shape and (self.procs is None or self.net_gbps is None):
            raise ConfigError("--net-shape shapes the links of the local processes of a --procs run "
                              "to --net-gbps: add --procs and --net-gbps")
        if s.external and self.device not in ("auto", "cpu"):
            raise ConfigError(f"--device {self.device}: --system {self.system} runs on the CPU here; use --device cpu")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("--backend nccl: NCCL connects GPUs; add --device cuda, or use "
                              "--backend gloo")

    def _check_nodes(self) -> None:
        """--master and --node-rank: one machine of a job that --procs starts on several."""
        if self.master is None and self.node_rank:
            raise ConfigError("--node-rank: a job on several machines needs --master HOST:PORT")
        if self.master is None:
            return
        if self.procs is None or self.net_shape:
            raise ConfigError("--master: each machine starts its ranks with --procs P (torchrun jobs "
                              "take MASTER_ADDR/MASTER_PORT from torchrun), without --net-shape")
        if self.master_address is None:
            raise ConfigError(f"--master {self.master!r}: give HOST:PORT, e.g. 10.0.0.1:29500")
        nodes, rest = divmod(self.world_size, self.procs)
        if rest:
            raise ConfigError(f"--procs {self.procs}: the job's 1 + {self.servers} + {self.trainers} "
                              f"= {self.world_size} ranks do not split into machines of {self.procs}")
        if self.node_rank >= nodes:
            raise ConfigError(f"--node-rank {self.node_rank}: {self.world_size} ranks at --procs "
                              f"{self.procs} make {nodes} machines, 0..{nodes - 1}")

    @property
    def master_address(self) -> tuple[str, int] | None:
        """--master as (host, port) ("[::1]:29500" -> ("::1", 29500)); None if not HOST:PORT."""
        host, _, port = (self.master or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return None
        return host.strip("[]"), int(port)

    def _check_output(self) -> None:
        if self.target_auc is not None:
            if not 0 < self.target_auc <= 1:
                raise ConfigError(f"--target-auc must be in (0, 1] (got {self.target_auc})")
            if not self.eval_every:
                raise ConfigError("--target-auc is read from the evaluations during training: "
                                  "add --eval-every N")

    @property
    def world_size(self) -> int:
        """Ranks of a torch.distributed run: 1 planner + K servers + N trainers."""
        return 1 + self.servers + self.trainers

    @property
    def dense_learning_rate(self) -> float:
        return self.dense_lr if self.dense_lr is not None else self.lr


def check_settings(cfg: Any) -> None:
    """The checks a config's fields declare (layer sizes, choices, lower bounds), and those
    between TrainConfig's fields, for whichever of them `cfg` has. Lists (YAML, JSON) become
    tuples: hashable."""
    names = {f.name for f in fields(cfg)}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, list):
            value = tuple(value)
            object.__setattr__(cfg, f.name, value)
        if f.name in ("bottom_mlp", "top_mlp") and (
                not value or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                     for x in value)):
            raise ConfigError(f"{field_option(f)}: layer sizes must be positive integers "
                              f"(got {value!r})")
        choices, low = f.metadata.get("choices"), f.metadata.get("at_least")
        for v in value if isinstance(value, tuple) else (value,):
            if v is None:
                continue
            if choices and v not in choices:
                raise ConfigError(f"{field_option(f)} {v!r}: choose one of "
                                  f"{', '.join(sorted(choices))}")
            if low is not None and v < low:
                raise ConfigError(f"{field_option(f)} must be >= {low} (got {v})")
            _check_number(f, v)
    if {"batch_size", "trainers"} <= names and cfg.batch_size % cfg.trainers:
        raise ConfigError(f"--batch-size {cfg.batch_size} is not divisible by --trainers {cfg.trainers}")
    for name, low in (("hot_sample", "("), ("drop_target", "["), ("stale_share", "(")):  # shares
        v = getattr(cfg, name) if name in names else 0.5
        if not (0 < v if low == "(" else 0 <= v) or v > 1:
            raise ConfigError(f"{option_name(name)} must be in {low}0, 1] (got {v})")
    n = cfg.batch_size // cfg.trainers if {"drop_target", "batch_size", "trainers"} <= names else 0
    if n and math.ceil(cfg.drop_target * n) >= n:  # slipstream skips ceil(D n) of a share's n
        raise ConfigError(f"--drop-target {cfg.drop_target:g} skips all {n} samples of a trainer's "
                          f"share: nothing would train; use at most {math.floor((n - 1) / n * 1000) / 1000:g}")
    if {"net_gbps", "net_latency_us"} <= names:
        NetworkModel(cfg.net_gbps, cfg.net_latency_us)  # validates the network options


def _check_number(f: Field, v: Any) -> None:
    """A number the engine can hold: finite, within the field's `at_most` (an integer without
    one: within int32, the arrays' type; the seed: 0 to int64's most, as numpy takes it)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{field_option(f)} must be a finite number (got {v})")
    high, why = f.metadata.get("at_most") or (MAX_SEED if f.name == "seed" else INT32_MAX, "")
    if abs(v) > high and (isinstance(v, int) or f.metadata.get("at_most")) or f.name == "seed" and v < 0:
        raise ConfigError(f"{field_option(f)} {v}: " + ("a seed is 0 to " if f.name == "seed" else "at most ")
                          + f"{high:,}" + (f" ({why})" if why else ""))


_KINDS = {bool: ("true or false", lambda v: isinstance(v, bool)),
          int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
          float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
          str: ("a string", lambda v: isinstance(v, str))}


def settings_from(cls: type, raw: dict[str, Any], where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A file's settings of config `cls`, checked: every key one of `keys` (fields of `cls`),
    every value of its field's type (a list for a tuple, as YAML writes it). Errors are one
    line that names `where` (the file) and the key."""
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in raw.items():
        if key not in keys:
            close = difflib.get_close_matches(str(key), keys, 1)
            known = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(keys))}"
            raise ConfigError(f"{where}: unknown key {key!r}; {known}")
        out[key] = _typed(hints[key], value, f"{where}: {key}")
    return out


def _typed(hint: Any, v: Any, what: str) -> Any:
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        if v is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if v is None:
        raise ConfigError(f"{what} cannot be null")
    if typing.get_origin(hint) is dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{what} must be a mapping (got {v!r})")
        return dict(v)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        kind, ok = _KINDS[item]
        items = v if isinstance(v, list) else [v]
        if not all(ok(x) for x in items):
            raise ConfigError(f"{what} must be a list, each item {kind} (got {v!r})")
        return tuple(float(x) if item is float else x for x in items)
    kind, ok = _KINDS[hint]
    if not ok(v):
        raise ConfigError(f"{what} must be {kind} (got {v!r})")
    return float(v) if hint is float else v
