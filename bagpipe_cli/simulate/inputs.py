"""What the performance model (`simulate/model.py`) reads: the cluster, one system's volumes
per iteration, the workload and the compute times. A module of its own, below both the model
and rank 0's plans (`simulate/plans.py`), which read it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from bagpipe_cli.engine.comm.network import NetworkModel
from bagpipe_cli.engine.config import COLLECTIVE_KINDS as KINDS
from bagpipe_cli.errors import ConfigError

COLLECTIVES = KINDS  # how trainers sum: exact (the default), allgather, allreduce
BACKWARD_SHARE = 2 / 3  # of forward + backward, when a run did not measure the backward apart


@dataclass(frozen=True)
class ComputeTimes:
    """Per-iteration compute on one trainer, in milliseconds, split as the engine's timers are."""

    data_ms: float = 0.0  # loading a round's batches (at each round's start)
    fwd_bwd_ms: float = 0.0  # forward + backward (all of one trainer's samples)
    backward_ms: float | None = None  # of which the backward, which the dense sums overlap
    #   (None: BACKWARD_SHARE of fwd_bwd_ms)
    optimizer_ms: float = 0.0  # dense + row optimizer, cache updates; write-backs are queued at its end
    other_ms: float = 0.0  # untimed work, most of it when rows are read (het assembles them)
    fetch_cpu_ms: float = 0.0  # CPU of receiving a fetch (gather, cache insert), at each wait for rows
    sync_ms: float = 0.0  # measured collectives, for a cluster whose collectives are not modelled
    server_ms: float = 0.0  # a server's CPU per iteration (serving, applying pushes), which
    #   holds its link like a transfer (calibrated from a torch.distributed run's servers)
    cpu_bound_ms: float = 0.0  # no iteration is shorter: the CPU every process of the run needs
    #   per iteration over the cores they share (a --procs run on one machine)

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if v is None and k == "backward_ms":
                continue
            if not (v >= 0 and math.isfinite(v)):
                raise ConfigError(f"compute time {k} must be a finite number >= 0 (got {v})")

    @property
    def total_ms(self) -> float:
        return self.data_ms + self.fwd_bwd_ms + self.optimizer_ms + self.other_ms + self.fetch_cpu_ms

    @classmethod
    def from_total(cls, ms: float) -> ComputeTimes:
        """A total split like a typical run (data in the rest, the optimizer a tenth)."""
        if not (ms >= 0 and math.isfinite(ms)):
            raise ConfigError(f"--compute-ms must be a finite number >= 0 (got {ms})")
        return cls(data_ms=0.0, fwd_bwd_ms=0.9 * ms, optimizer_ms=0.1 * ms, other_ms=0.0)

    def scaled(self, factor: float) -> ComputeTimes:
        return ComputeTimes(**{k: None if v is None else factor * v for k, v in asdict(self).items()})

    @property
    def bwd_ms(self) -> float:
        """The backward's part of fwd_bwd_ms."""
        return self.backward_ms if self.backward_ms is not None else BACKWARD_SHARE * self.fwd_bwd_ms


@dataclass(frozen=True)
class Cluster:
    """The machines: trainers, embedding servers and the network between them."""

    trainers: int = 1  # N data-parallel trainers
    servers: int = 1  # K embedding-server shards, one link each
    net_gbps: float | None = None  # bandwidth of every server's link (None: infinite)
    net_latency_us: float = 0.0  # per-message latency
    trainer_gbps: float | None = None  # the trainers' links, for their collectives (None: net_gbps)
    collectives_on_network: bool = True  # False: the trainers' collectives take ComputeTimes.sync_ms
    #   (a --procs run with the sleep emulation: its collectives cross loopback, not the model)
    collective: str = "exact"  # how the trainers sum (engine/comm/collective.py): exact, allgather, allreduce
    plans_on_network: bool = True  # False: rank 0's plans cross loopback (a --procs run): planning alone

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ConfigError(f"collective {self.collective!r}: choose one of {', '.join(COLLECTIVES)}")
        if self.trainers < 1:
            raise ConfigError(f"trainers must be >= 1 (got {self.trainers})")
        if self.servers < 1:
            raise ConfigError(f"servers must be >= 1 (got {self.servers})")
        NetworkModel(self.net_gbps, self.net_latency_us)  # validates
        NetworkModel(self.trainer_gbps, self.net_latency_us)

    @property
    def network(self) -> NetworkModel:
        return NetworkModel(self.net_gbps, self.net_latency_us)

    @property
    def trainer_network(self) -> NetworkModel:
        gbps = self.trainer_gbps if self.trainer_gbps is not None else self.net_gbps
        return NetworkModel(gbps, self.net_latency_us)


@dataclass
class Exchanges:
    """Bagpipe's partitioned cache (engine/planning/partition.py): the rows each trainer moves among
    the trainers per iteration, [I, 3, N] arrays of `flows`' counts by kind (`KINDS`), sent
    and received: `delivered`, rows (with their optimizer state) the homes send to the
    writers of b before b reads; `now`, `later`, partial gradients the writers send to the
    rows' homes, of the sync_now rows on the critical path, of the sync_later ones in the
    background."""

    KINDS = ("delivered", "now", "later")
    sent: np.ndarray
    received: np.ndarray

    @classmethod
    def zeros(cls, iterations: int, trainers: int) -> Exchanges:
        return cls(*(np.zeros((iterations, len(cls.KINDS), trainers), np.int32) for _ in range(2)))

    @property
    def trainers(self) -> int:
        return self.sent.shape[2]

    def record(self, b: int, f) -> None:
        """Iteration b's `engine.planning.partition.Flows`."""
        for k, kind in enumerate(self.KINDS):
            self.sent[b, k], self.received[b, k] = getattr(f, f"{kind}_sent"), getattr(f, f"{kind}_received")

    def busiest(self, kind: str) -> np.ndarray:
        """[I] rows of the busiest trainer's `kind` exchange, sent or received: an all-to-all
        lasts as long as the trainer that moves the most."""
        k = self.KINDS.index(kind)
        return np.maximum(self.sent[:, k].max(axis=1, initial=0), self.received[:, k].max(axis=1, initial=0))

    def bytes_sent(self, row_bytes: int, grad_bytes: int) -> np.ndarray:
        """[I, N] bytes each trainer sends: its deliveries (rows and state) and partials."""
        s = self.sent.astype(np.int64)
        return row_bytes * s[:, 0] + grad_bytes * (s[:, 1] + s[:, 2])


@dataclass
class Volumes:
    """One system's communication per iteration (rows; [iterations, K] arrays split by shard).

    `round_fetch[b]` is the fetch of the round that *starts* at iteration b (zeros
    elsewhere); with `prefetch_ahead` it is sent when the previous round starts.
    """

    system: str
    iterations: int
    servers: int
    round_start: np.ndarray  # bool [I]: iteration b starts a round
    round_fetch: np.ndarray  # [I, K] rows fetched for the round starting at b
    pre_evict: np.ndarray  # [I, K] rows written back at that round's start, before its fetch
    read_fetch: np.ndarray  # [I, M, K] fetches made when iteration b reads (sync: 1, het: N)
    write_back: np.ndarray  # [I, K] rows written back (or gradients pushed: sync, het) after b
    sync_now: np.ndarray  # [I] rows all-reduced on the critical path (N > 1)
    sync_later: np.ndarray  # [I] rows all-reduced asynchronously (N > 1)
    unique_rows: np.ndarray  # [I] |U_b|
    prefetch_ahead: bool = False  # bagpipe: round r+1 is fetched when round r starts
    push_gradients: bool = False  # sync, het: write_back carries gradients (no optimizer state)
    empty_fetch_message: bool = False  # sync with K = 1: a fetch is sent even for 0 rows
    messages: int = 1  # latencies per transfer on a link (distributed: one per trainer)
    # hotline: [I] the share of forward+backward computed while the round's rows are fetched
    # (its popular samples); None: the rows land before the iteration computes
    popular: np.ndarray | None = None
    # Rank 0 (simulate/plans.py): plan bytes of the round starting at b, after the last, ms a batch
    plan_bytes: np.ndarray | None = None
    plan_end_bytes: int = 0
    # where rank 0 sends each trainer its own plan (bagpipe, N > 1): the bytes of the largest
    # trainer's plan of the round starting at b; None: one plan down the relay tree
    plan_trainer_bytes: np.ndarray | None = None
    plan_ms: float = 0.0  # the planning stage: the oracle thread's part + its busiest worker's
    planners: int = 1  # the oracle's workers (simulate/volumes.py's `planned`)
    plan_worker_ms: float = 0.0  # the busiest planning worker's CPU ms a batch
    plan_serial_ms: float = 0.0  # the oracle thread's own CPU ms a batch (the slices laid together)
    plan_make_ms: float = 0.0  # making and encoding each trainer's own plan, CPU ms a batch (in plan_ms)
    # Rows the servers send before the first iteration, untimed (local copies every table
    # to each trainer); counted in a run's traffic, so in the model's bytes, not its times.
    setup_rows: int = 0
    # bagpipe with N > 1: the partitioned cache's exchanges among the trainers (sync_now and
    # sync_later then count the rows' LRPP classes; what moves is here). None: every trainer
    # holds every row of U_b and sums its sync_now and sync_later rows with all the others.
    exchanges: Exchanges | None = None
    # the sharded tables (simulate/sharded.py): [I, 2, N] cold rows each trainer asks of the
    # others' shards (0) and serves them (1); None: the servers hold the tables
    shards: np.ndarray | None = None

    def totals(self) -> dict[str, int]:
        asked = int(self.shards[:, 0].sum()) if self.shards is not None else 0  # of the owners
        return {
            "rows_fetched": int(self.round_fetch.sum() + self.read_fetch.sum()) + asked,
            "rows_written_back": int(self.pre_evict.sum() + self.write_back.sum()) + asked,
            "sync_now": int(self.sync_now.sum()),
            "sync_later": int(self.sync_later.sum()),
            "unique_rows": int(self.unique_rows.sum()),
        }


@dataclass(frozen=True)
class Workload:
    """What is trained: bytes per row and per dense model, and which iterations count."""

    row_dim: int  # floats of a row (E, +1 for wdl/deepfm)
    state_dim: int  # floats of optimizer state per row (adagrad 1, sgd 0)
    dense_bytes: int  # bytes of the dense parameters (all-reduced every iteration, N > 1)
    warmup: int = 0  # first iterations excluded from the medians and means

    @property
    def row_bytes(self) -> int:
        """Bytes of a fetched or written-back row (the optimizer state moves with it)."""
        return (self.row_dim + self.state_dim) * 4

    @property
    def grad_bytes(self) -> int:
        """Bytes of one row's gradient (all-reduces, sync's and het's pushes)."""
        return self.row_dim * 4
