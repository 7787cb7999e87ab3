"""The configuration of one training run: every option, its default and its help, in one place.

`bagpipe train`'s options are generated from these fields (`cli/options.py`), a bench file's
`base`/`matrix` keys are these fields, and the whole config is stored with every result.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from bagpipe_cli.engine.network import NetworkModel
from bagpipe_cli.engine.optim import EMB_OPTIMIZERS, RowOptimizer
from bagpipe_cli.engine.registry import ALL_SYSTEMS, SYSTEMS, spec
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.launch.placement import PLACEMENTS
from bagpipe_cli.models import MODELS

DENSE_OPTIMIZERS = ("sgd", "adam")
TRANSPORTS = ("inproc", "torch")
BACKENDS = ("gloo", "nccl")


def setting(default: Any, help: str, *, option: str | None = None,
            choices: tuple[str, ...] | None = None, cli: bool = True) -> Any:
    """A config field with its command-line help; `option` overrides `--field-name`."""
    return field(default=default, metadata={"help": help, "option": option, "choices": choices,
                                            "cli": cli})


def field_option(f: Field) -> str:
    """The command-line option of a config field (`timeout_s` -> `--timeout`)."""
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


def option_name(name: str) -> str:
    """The command-line option of TrainConfig field `name`."""
    return field_option(next(f for f in fields(TrainConfig) if f.name == name))


@dataclass(frozen=True)
class TrainConfig:
    """One training run (`bagpipe train`, one run of `bagpipe bench`)."""

    data: str = setting(MISSING, "Dataset directory.", cli=False)
    system: str = setting("bagpipe", "; ".join(f"{s.name}: {s.summary}" for s in SYSTEMS.values()) + ".",
                          choices=ALL_SYSTEMS)
    model: str = setting("dlrm", "Dense model.", choices=tuple(sorted(MODELS)))
    batch_size: int = setting(1024, "Global batch size (split evenly over the trainers).")
    iterations: int = setting(100, "Training iterations (the data wraps around if needed).")
    lookahead: int = setting(16, "L: batches the oracle looks ahead.")
    round: int | None = setting(None, "C: iterations per prefetch/evict round [default: L/4].")
    cache_rows: int | None = setting(None, "Cache rows of bagpipe/lru/lfu/fae [default: "
                                           "bagpipe's peak at --lookahead].")
    staleness: int = setting(0, "het: versions a cached row may lag behind the servers.")
    hot_sample: float = setting(1.0, "fae: fraction of the run's batches profiled to pick the "
                                     "--cache-rows hot rows.")
    emb_dim: int = setting(16, "E: embedding dimension.")
    bottom_mlp: tuple[int, ...] = setting((64, 32), "DLRM's bottom MLP hidden sizes, e.g. 512,256,64 "
                                                    "(an output layer of E follows).")
    top_mlp: tuple[int, ...] = setting((64, 32), "Top (DLRM) / deep (WDL, DeepFM, DCN) MLP hidden "
                                                 "sizes, e.g. 1024,1024,1024,256,128.")
    optimizer: str = setting("sgd", "Embedding optimizer (adagrad: row-wise).", choices=EMB_OPTIMIZERS)
    lr: float = setting(0.1, "Embedding learning rate.")
    dense_optimizer: str = setting("sgd", "Dense optimizer.", choices=DENSE_OPTIMIZERS)
    dense_lr: float | None = setting(None, "Dense learning rate [default: --lr].")
    seed: int = setting(0, "Seed of the dense weights and the initial tables.")
    trainers: int = setting(1, "N data-parallel trainers (in one process, or one process each "
                               "with --procs/--transport torch).")
    servers: int = setting(1, "K embedding server shards (rows sharded by key % K).")
    net_gbps: float | None = setting(None, "Emulate a network of this bandwidth (Gbit/s) between "
                                           "trainers and servers, and among trainers.")
    net_latency_us: float = setting(0.0, "Emulated latency per message (microseconds).")
    net_shape: bool = setting(False, "With --procs: run every rank in a network namespace of its "
                                     "own whose link the kernel rate-limits to --net-gbps (tc "
                                     "token bucket; needs root) instead of sleeping per transfer.")
    eval_rows: int | None = setting(None, "Held-out tail rows for AUC [default: 10%, at most 50,000].")
    warmup: int = setting(5, "Iterations excluded from the speed figures.")
    transport: str = setting("inproc", "inproc: one process; torch: torch.distributed ranks "
                                       "(launched by torchrun, or by --procs).", choices=TRANSPORTS)
    procs: int | None = setting(None, "Start the ranks here as local processes: 1 oracle + "
                                      "--servers + --trainers (implies --transport torch).")
    timeout_s: float = setting(120.0, "torch transport: seconds a rank waits for a peer.",
                               option="--timeout")
    device: str = setting("cpu", "torch transport: where trainers compute: cpu, cuda (a machine's "
                                 "GPUs in turn) or cuda:K; servers and the oracle stay on the CPU.")
    backend: str = setting("gloo", "torch transport: the trainers' collectives (nccl needs "
                                   "--device cuda and a GPU per trainer).", choices=BACKENDS)
    threads: int | None = setting(None, "torch compute threads [default: from --placement].")
    placement: str = setting("auto", "auto: keep cores for the oracle/loader and the servers, give "
                                     "the trainers' torch threads the rest, pinned where the OS "
                                     "allows; off: leave it to the OS and torch's default.",
                             choices=PLACEMENTS)
    checkpoint_every: int = setting(0, "Checkpoint every N iterations (0: never).")
    checkpoint_dir: str | None = setting(None, "Where checkpoints go [default: <--out>.ckpt].")
    checkpoint_keep: int = setting(2, "Newest good checkpoints kept.")
    resume: str | None = setting(None, "Resume from a checkpoint folder, or the newest good one "
                                       "in a --checkpoint-dir.")

    def __post_init__(self) -> None:
        s = spec(self.system)
        for name in ("bottom_mlp", "top_mlp"):  # lists (YAML, JSON) become tuples: hashable
            sizes = tuple(getattr(self, name))
            if not sizes or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                    for x in sizes):
                raise ConfigError(f"{option_name(name)}: layer sizes must be positive integers "
                                  f"(got {getattr(self, name)!r})")
            object.__setattr__(self, name, sizes)
        _choice(self, "model", tuple(MODELS))
        for name in ("batch_size", "iterations", "emb_dim", "trainers", "servers", "lookahead",
                     "checkpoint_keep"):
            _at_least(self, name, 1)
        for name in ("staleness", "warmup", "checkpoint_every"):
            _at_least(self, name, 0)
        for name in ("cache_rows", "threads", "procs"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        if self.batch_size % self.trainers:
            raise ConfigError(f"--batch-size {self.batch_size} is not divisible by --trainers "
                              f"{self.trainers}")
        for name, choices in (("dense_optimizer", DENSE_OPTIMIZERS), ("transport", TRANSPORTS),
                              ("backend", BACKENDS), ("placement", PLACEMENTS)):
            _choice(self, name, choices)
        if not 0 < self.hot_sample <= 1:
            raise ConfigError(f"--hot-sample must be in (0, 1] (got {self.hot_sample})")
        if not self.timeout_s > 0:
            raise ConfigError(f"--timeout must be > 0 (got {self.timeout_s})")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"--device {self.device!r}: choose cpu, cuda or cuda:K")
        self._check_launch(s)
        if not s.is_exact(self) and (self.checkpoint_every or self.resume):
            # Its trainers read stale copies that a checkpoint of the true parameters does
            # not hold, so a resumed run would not be the run that was stopped.
            key, value = s.exact_only_if or (None, None)
            fix = f"use {option_name(key)} {value} or another system" if key else "use another system"
            raise ConfigError(f"--checkpoint-every/--resume: {self.system} with {s.inexact_when} "
                              f"cannot be resumed exactly; {fix}")
        RowOptimizer(self.optimizer, self.lr)  # validates --optimizer and --lr
        NetworkModel(self.net_gbps, self.net_latency_us)  # validates the network options

    def _check_launch(self, s) -> None:
        if s.external and (self.transport != "inproc" or self.procs is not None):
            raise ConfigError(f"--system {self.system} starts its own --trainers processes; "
                              "drop --procs/--transport torch")
        if self.procs is not None:
            if self.transport != "torch":
                raise ConfigError("--procs starts torch.distributed ranks: use it with "
                                  "--transport torch")
            if self.procs != self.world_size:
                raise ConfigError(f"--procs {self.procs}: a run with --servers {self.servers} and "
                                  f"--trainers {self.trainers} needs 1 + {self.servers} + "
                                  f"{self.trainers} = {self.world_size} processes")
        if self.net_shape and (self.procs is None or self.net_gbps is None):
            raise ConfigError("--net-shape shapes the links of the local processes of a --procs "
                              "run to --net-gbps: add --procs and --net-gbps")
        if self.device != "cpu" and (self.transport != "torch" or s.external):
            raise ConfigError(f"--device {self.device}: trainers run on a GPU in torch.distributed "
                              "runs of the engine's systems; use --procs or --transport torch")
        if self.backend == "nccl" and self.device == "cpu":
            raise ConfigError("--backend nccl: NCCL connects GPUs; add --device cuda, or use "
                              "--backend gloo")

    @property
    def world_size(self) -> int:
        """Ranks of a torch.distributed run: 1 oracle/loader + K servers + N trainers."""
        return 1 + self.servers + self.trainers

    @property
    def dense_learning_rate(self) -> float:
        return self.dense_lr if self.dense_lr is not None else self.lr


def _at_least(cfg: TrainConfig, name: str, low: int) -> None:
    v = getattr(cfg, name)
    if v < low:
        raise ConfigError(f"{option_name(name)} must be >= {low} (got {v})")


def _choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    v = getattr(cfg, name)
    if v not in choices:
        raise ConfigError(f"{option_name(name)} {v!r}: choose one of {', '.join(sorted(choices))}")
