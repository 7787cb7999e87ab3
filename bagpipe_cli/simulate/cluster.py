"""What `bagpipe simulate` predicts (`SimulateConfig`), and the cluster files that load into it.

`bagpipe simulate`'s options are generated from `SimulateConfig`'s fields, and a cluster file
(`--cluster FILE`, YAML) sets the same fields by name; options on the command line override
the file. Besides the fields, a file may have a `description` and a `synth:` mapping (the
`bagpipe synth` settings that generate `data` if it is missing):

    name: my-cluster
    description: 8 GPUs over 25 Gbit/s
    data: results/datasets/synth-criteo      # dataset directory (relative to the current dir)
    synth: {preset: criteo-kaggle, rows: 4000000, seed: 0}   # generated if `data` is missing
    trainers: 8
    servers: 4
    net_gbps: 25                     # every embedding server's link
    net_latency_us: 10
    trainer_gbps: 10                 # every trainer's link (collectives) [default: net_gbps]
    runtime: distributed             # a process per trainer (default); or inproc
    collective: exact                # exact (the default), allgather or allreduce (engine/comm/collective.py)
    compute_ms: 5.0                  # per iteration on one trainer; or `calibrate: RESULTS`
    batch_size: 16384                # global batch
    iterations: 488                  # [default: train's 100, wrapping around the data]
    lookahead: 200
    emb_dim: 48
    optimizer: adagrad
    bottom_mlp: [512, 256, 64]
    top_mlp: [1024, 1024, 1024, 256, 128]
    systems: simulated               # [default: every system simulate models] or a list: [sync, bagpipe]
    sweep_trainers: [1, 2, 4, 8, 16]  # or: sweep: {trainers: [...], net_gbps: [...]}
    sweep_gbps: [1, 10, 25, 100]
    sweep_scaling: strong             # the trainers sweep keeps the global batch; weak: the
                                      # samples per trainer (batch_size / trainers)
    reported: {speedup_max: 5.6, source: "BagPipe, SOSP 2023"}   # shown next to the prediction

Every key is optional; the dataset (`data`) and one of `compute_ms` / `calibrate` may come
from the command line instead. An unknown key, or a value of the wrong type, is an error
that names the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from bagpipe_cli.data.synth import SynthConfig, generate
from bagpipe_cli.engine.config import check_settings, setting, settings_from, shared
from bagpipe_cli.engine.registry import ALL_SYSTEMS, group
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.records import read_record
from bagpipe_cli.simulate.inputs import Cluster, ComputeTimes
from bagpipe_cli.simulate.model import SYSTEMS

# simulate/volumes.py's runtimes (a test holds them equal): that module traces with the
# engine (torch), and `bagpipe simulate --help` reads only this one.
RUNTIMES = ("inproc", "distributed")

DEFAULT_SWEEP_TRAINERS = (1, 2, 4, 8, 16, 32)
DEFAULT_SWEEP_GBPS = (1.0, 2.5, 5.0, 10.0, 25.0, 40.0, 100.0)
SCALINGS = ("strong", "weak")  # what the trainers sweep keeps: the global batch, or a trainer's
FILE_KEYS = ("description", "synth", "sweep")  # a cluster file's keys that are not settings
SWEEP_KEYS = {"trainers": "sweep_trainers", "net_gbps": "sweep_gbps"}  # `sweep:` -> settings


@dataclass(frozen=True)
class SimulateConfig:
    """What `bagpipe simulate` predicts: a `bagpipe train` run's settings, on a cluster.

    A field that means what TrainConfig's field of that name means is `shared` (its default,
    help and checks are train's), so simulating with no options predicts what `bagpipe
    train` runs with none.
    """

    data: str = shared("data")
    systems: tuple[str, ...] = setting(SYSTEMS, "Systems to predict, comma-separated, or a group: simulated (every system simulate models), each-model (one of each traffic model).",
                                       section="system")
    model: str = shared("model")
    batch_size: int = shared("batch_size")
    iterations: int = shared("iterations")
    eval_rows: int | None = shared("eval_rows")
    lookahead: int = shared("lookahead")
    round: int | None = shared("round")
    planners: int | None = shared("planners")
    cache_rows: int | None = shared("cache_rows")
    staleness: int = shared("staleness")
    hot_sample: float = shared("hot_sample")
    emb_dim: int = shared("emb_dim")
    bottom_mlp: tuple[int, ...] = shared("bottom_mlp")
    top_mlp: tuple[int, ...] = shared("top_mlp")
    optimizer: str = shared("optimizer")
    trainers: int = shared("trainers")
    servers: int = shared("servers")
    net_gbps: float | None = shared("net_gbps")
    net_latency_us: float = shared("net_latency_us")
    trainer_gbps: float | None = setting(None, "Bandwidth (Gbit/s) of the trainers' links, for "
                                               "their collectives [default: --net-gbps].",
                                         section="cluster and network")
    compute_ms: float | None = setting(None, "Compute per iteration on one trainer (forward, "
                                             "backward, optimizer), in ms.",
                                       section="cluster and network")
    calibrate: tuple[str, ...] = setting((), "Instead of --compute-ms: the compute from "
                                             "measured runs under RESULTS (no-network runs "
                                             "preferred): forward+backward once, the median "
                                             "over every system's runs; the other phases each "
                                             "system's own; scaled to the samples per trainer "
                                             "(repeatable).", multiple=True,
                                         section="cluster and network", path="input")
    runtime: str = setting("distributed", "distributed: a process per trainer, each fetching and "
                                          "pushing its own rows; inproc: one process for every "
                                          "trainer.", choices=RUNTIMES, section="runtime")
    collective: str = shared("collective")
    warmup: int = shared("warmup")
    sweep_trainers: tuple[int, ...] | None = setting(
        None, "Trainer counts of the sweep, comma-separated [default: those of "
              f"{','.join(map(str, DEFAULT_SWEEP_TRAINERS))} that divide --batch-size; "
              "all of them with --sweep-scaling weak].",
        at_least=1, section="output")
    sweep_gbps: tuple[float, ...] = setting(DEFAULT_SWEEP_GBPS, "Bandwidths of the sweep "
                                                                "(Gbit/s), comma-separated.",
                                            section="output")
    sweep_scaling: str = setting("strong", "What the trainers sweep keeps: strong, the global "
                                           "--batch-size (a trainer computes batch / N samples); "
                                           "weak, the samples per trainer (batch / --trainers; "
                                           "the global batch grows with N).",
                                 choices=SCALINGS, section="output")
    name: str = setting("", "The scenario's name in the output [default: the dataset's].",
                        section="output")
    reported: dict[str, Any] = setting(None, "Published figures shown next to the predictions "
                                             "of the systems the publication compared (the "
                                             "registry's `published`).",
                                       cli=False, factory=dict, section="output")
    source: str = setting("", "What the input was (dataset, profile, cluster file).", cli=False,
                          section="data")

    def __post_init__(self) -> None:
        if not self.systems:
            raise ConfigError("--systems: give at least one system")
        # A group (registry.GROUPS: all, simulated, each-model) stands for its systems.
        object.__setattr__(self, "systems", tuple(m for s in self.systems for m in (group(s) or (s,))))
        for i, s in enumerate(self.systems):
            if s not in SYSTEMS:
                why = (f"{s} has no performance model yet" if s in ALL_SYSTEMS
                       else f"unknown system {s!r}")
                raise ConfigError(f"--systems: {why}; choose from {', '.join(SYSTEMS)}")
            if s in self.systems[:i]:
                raise ConfigError(f"--systems lists {s} twice")
        check_settings(self)
        if self.compute_ms is None and not self.calibrate:
            raise ConfigError("give the compute time: --compute-ms C (per iteration on one trainer) "
                              "or --calibrate RESULTS (measured runs)")
        if self.compute_ms is not None and self.calibrate:
            raise ConfigError("give either --compute-ms or --calibrate, not both")
        if self.compute_ms is not None:
            ComputeTimes.from_total(self.compute_ms)  # validates
        if self.warmup >= self.iterations:
            raise ConfigError(f"--warmup {self.warmup} leaves none of the {self.iterations} "
                              "iterations; lower --warmup or raise --iterations")
        if self.trainer_gbps is not None and not self.trainer_gbps > 0:
            raise ConfigError(f"--trainer-gbps must be > 0 (got {self.trainer_gbps})")
        if not self.sweep_gbps:  # (it would draw an empty plot)
            raise ConfigError("--sweep-gbps: give at least one bandwidth")
        if not all(g > 0 for g in self.sweep_gbps):
            raise ConfigError(f"--sweep-gbps: bandwidths must be > 0 (got {self.sweep_gbps})")
        for n in self.sweep_trainers or ():
            if self.sweep_scaling == "strong" and self.batch_size % n:
                raise ConfigError(f"--sweep-trainers {n}: --batch-size {self.batch_size} is not "
                                  f"divisible by {n}")

    @property
    def cluster(self) -> Cluster:
        """The machines: trainers, servers and their links."""
        return Cluster(self.trainers, self.servers, self.net_gbps, self.net_latency_us,
                       trainer_gbps=self.trainer_gbps, collective=self.collective)

    @property
    def trainer_counts(self) -> tuple[int, ...]:
        """The sweep's trainer counts."""
        if self.sweep_trainers is not None:
            return self.sweep_trainers
        if self.sweep_scaling == "weak":
            return DEFAULT_SWEEP_TRAINERS
        return tuple(n for n in DEFAULT_SWEEP_TRAINERS if self.batch_size % n == 0)

    def sweep_batch(self, n: int) -> int:
        """The global batch of the trainers sweep at n trainers."""
        return self.batch_size if self.sweep_scaling == "strong" else self.batch_size // self.trainers * n

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"cluster": asdict(self.cluster)}


# The settings a cluster file may give: every field but what the command fills in itself.
SETTINGS = tuple(f.name for f in fields(SimulateConfig) if f.name != "source")


@dataclass(frozen=True)
class ClusterFile:
    """A cluster file: its settings (SimulateConfig fields, checked) and the file-only keys."""

    source: str  # the file it was read from
    settings: dict[str, Any]
    description: str = ""
    synth: SynthConfig | None = None  # generates `data` if it is missing


def load_cluster(path: Path) -> ClusterFile:
    """Read and check a cluster file; every error is one line naming the file (and key)."""
    where = f"--cluster {path}"
    raw = read_record(Path(path), "cluster file", name=where)  # YAML, size and depth limited
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of settings at the top level")
    file_only = {k: raw.pop(k) for k in FILE_KEYS if k in raw}
    raw.update(_sweep(file_only.get("sweep"), raw, where))
    settings = settings_from(SimulateConfig, raw, where, SETTINGS + FILE_KEYS)
    description = file_only.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string (got {description!r})")
    synth = file_only.get("synth")
    if synth is not None:
        if not isinstance(synth, dict):
            raise ConfigError(f"{where}: synth must be a mapping of `bagpipe synth` settings")
        keys = tuple(f.name for f in fields(SynthConfig))
        try:
            synth = SynthConfig(**settings_from(SynthConfig, synth, f"{where}: synth", keys))
        except ConfigError as e:
            raise ConfigError(str(e) if str(e).startswith(where) else f"{where}: synth: {e}") from None
    return ClusterFile(str(path), settings, description, synth)


def _sweep(sweep: Any, raw: dict[str, Any], where: str) -> dict[str, Any]:
    """`sweep: {trainers: [...], net_gbps: [...]}`, the settings sweep_trainers and sweep_gbps."""
    if sweep is None:
        return {}
    if not isinstance(sweep, dict) or set(sweep) - set(SWEEP_KEYS):
        raise ConfigError(f"{where}: sweep must be a mapping with keys from {', '.join(SWEEP_KEYS)}")
    out = {SWEEP_KEYS[k]: v for k, v in sweep.items()}
    for key in sorted(set(out) & set(raw)):
        raise ConfigError(f"{where}: {key} is given twice (also in sweep:)")
    return out


def ensure_dataset(cf: ClusterFile, progress: Callable[[str], None] | None = None) -> Path | None:
    """The cluster file's dataset (None: it names none), generated from `synth:` if missing."""
    if "data" not in cf.settings:
        return None
    path = Path(cf.settings["data"])
    if (path / "meta.json").is_file() or cf.synth is None:
        return path
    if progress:
        progress(f"generating {path} ({cf.synth.num_rows:,} rows of {cf.synth.preset})")
    generate(cf.synth, path)
    return path
