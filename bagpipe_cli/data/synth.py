"""Synthetic click logs with Zipf-skewed categorical ids (the embedded default dataset).

Ids are drawn per table from a bounded power law: id k in 1..n-1 (n = cardinality, id 0
stays reserved for missing values) with probability roughly proportional to k^-alpha, so
id order is popularity order, as after `bagpipe preprocess`. Sampling uses the inverse CDF
of the continuous power law on [1, n), which is vectorised and needs no per-table tables.

Labels depend on the features (a hidden logistic model over a per-id effect of every table
and the dense features), so a model can learn something (AUC clearly above 0.5). Dense
features are log(1 + count) of log-normal counts, the transform preprocessing applies.

Generation is chunked with an RNG seeded by (seed, chunk, stream), so the same arguments
give byte-identical arrays and memory is bounded by the chunk size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bagpipe_cli.data.format import DatasetMeta, TableSpec
from bagpipe_cli.data.writer import DatasetWriter
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import atomic_dir
from bagpipe_cli.limits import check_disk, check_int, check_table_rows

CHUNK_ROWS = 1 << 18  # part of the output's definition: changing it changes the bytes
MAX_COLUMNS = 4096  # tables or dense features: a chunk of CHUNK_ROWS rows of each is 8 GiB

# Criteo Kaggle (Display Advertising Challenge) per-feature cardinalities, C1..C26.
CRITEO_KAGGLE_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip

# Avazu (40M rows) approximate per-column cardinalities, in column order after id, click.
AVAZU_COLUMNS = [
    "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
    "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
    "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21",
]  # fmt: skip
AVAZU_CARDINALITIES = [
    241, 8, 8, 4738, 7746, 27, 8553, 560, 37, 2686409, 6729487, 8252, 6, 5, 2627, 9, 10,
    436, 5, 69, 173, 61,
]  # fmt: skip


@dataclass(frozen=True)
class Preset:
    """A named table layout."""

    cardinalities: list[int]
    dense: int
    rows: int  # default row count
    table_names: list[str] | None = None
    description: str = ""


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        [1000, 50, 5000, 20, 800, 10, 3000, 200], dense=4, rows=20_000,
        description="8 small tables, 4 dense features: for tests and quick looks",
    ),
    "criteo-kaggle": Preset(
        CRITEO_KAGGLE_CARDINALITIES, dense=13, rows=1_000_000,
        description="the 26 Criteo Kaggle table sizes (33.8M rows in all), 13 dense features",
    ),
    "avazu": Preset(
        AVAZU_CARDINALITIES, dense=0, rows=1_000_000, table_names=AVAZU_COLUMNS,
        description="the 22 Avazu categorical columns (approximate sizes), no dense features",
    ),
}  # fmt: skip


@dataclass(frozen=True)
class SynthConfig:
    """What `bagpipe synth` generates."""

    preset: str = "criteo-kaggle"  # table layout (see PRESETS)
    rows: int | None = None  # number of samples; None = the preset's default
    tables: int | None = None  # number of tables; None = the preset's (cycled if larger)
    max_rows_per_table: int | None = None  # cap on every table's cardinality
    scale: float = 1.0  # multiply every preset cardinality (min 2)
    alpha: float = 1.1  # Zipf exponent of the id distribution (> 0)
    dense: int | None = None  # number of dense features; None = the preset's
    seed: int = 0  # RNG seed
    name: str = ""  # dataset name in meta.json (default: synth-<preset>)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(f"--preset {self.preset!r}: unknown; choose one of {', '.join(PRESETS)}")
        check_int("--rows", self.rows, 1)
        check_int("--max-rows-per-table", self.max_rows_per_table, 1)
        check_int("--tables", self.tables, 1, MAX_COLUMNS)
        check_int("--dense", self.dense, 0, MAX_COLUMNS)
        check_int("--seed", self.seed, 0)
        if self.max_rows_per_table is not None and self.max_rows_per_table < 2:
            raise ConfigError("--max-rows-per-table must be >= 2 (id 0 is reserved for missing)")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"--scale must be > 0 (got {self.scale})")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise ConfigError(f"--alpha must be > 0 (got {self.alpha})")
        specs = self.table_specs()
        widest = max(s.cardinality for s in specs)
        asked = (f"--max-rows-per-table {self.max_rows_per_table}"
                 if widest == self.max_rows_per_table else f"--scale {self.scale:g}")
        check_table_rows(asked, len(specs), widest, sum(s.cardinality for s in specs))

    @property
    def num_rows(self) -> int:
        return self.rows if self.rows is not None else PRESETS[self.preset].rows

    def table_specs(self) -> list[TableSpec]:
        p = PRESETS[self.preset]
        t = self.tables or len(p.cardinalities)
        specs = []
        for i in range(t):
            card = max(2, round(p.cardinalities[i % len(p.cardinalities)] * self.scale))
            if self.max_rows_per_table is not None:
                card = min(card, self.max_rows_per_table)
            name = p.table_names[i] if p.table_names and i < len(p.table_names) else f"C{i + 1}"
            specs.append(TableSpec(name, card))
        return specs

    def dense_names(self) -> list[str]:
        d = PRESETS[self.preset].dense if self.dense is None else self.dense
        return [f"I{j + 1}" for j in range(d)]


@dataclass
class _HiddenModel:
    """The logistic model that turns features into labels."""

    table_weight: np.ndarray  # [T]
    table_salt: np.ndarray  # [T] uint64
    dense_mu: np.ndarray  # [D] log-normal parameters of the raw counts
    dense_sigma: np.ndarray
    dense_weight: np.ndarray  # [D]
    bias: float = field(default=-1.3)


def _hidden_model(cfg: SynthConfig, t: int, d: int) -> _HiddenModel:
    rng = np.random.default_rng([cfg.seed, 0xB46])
    return _HiddenModel(
        table_weight=rng.uniform(0.3, 1.0, t) * 3.0 / math.sqrt(max(t, 1)),
        table_salt=rng.integers(1, 2**63, t, dtype=np.uint64),
        dense_mu=rng.uniform(0.0, 3.0, d),
        dense_sigma=rng.uniform(0.5, 1.5, d),
        dense_weight=rng.normal(0.0, 0.6 / math.sqrt(max(d, 1)), d),
    )


def zipf_ids(u: np.ndarray, cardinality: int, alpha: float) -> np.ndarray:
    """Map uniforms u in [0, 1) to ids in [1, cardinality) by the power-law inverse CDF."""
    n = cardinality - 1  # ids 1..n
    if n <= 1:
        return np.ones(u.shape, dtype=np.int64)
    if abs(alpha - 1.0) < 1e-9:
        x = np.exp(u * math.log(n + 1))
    else:
        e = 1.0 - alpha
        x = (1.0 + u * ((n + 1.0) ** e - 1.0)) ** (1.0 / e)
    return np.minimum(x.astype(np.int64), n)


def _id_effect(ids: np.ndarray, salt: np.uint64) -> np.ndarray:
    """A fixed pseudo-random effect in [-1, 1) per id (a splitmix64-style hash)."""
    z = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + salt
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    return (z >> np.uint64(11)).astype(np.float64) * (2.0 / 2**53) - 1.0


def _chunk(cfg: SynthConfig, specs: list[TableSpec], d: int, model: _HiddenModel,
           c: int, n: int, pool: ThreadPoolExecutor):
    def table(t: int) -> np.ndarray:
        u = np.random.default_rng([cfg.seed, c, 1, t]).random(n)
        return zipf_ids(u, specs[t].cardinality, cfg.alpha)

    sparse = list(pool.map(table, range(len(specs))))
    rng = np.random.default_rng([cfg.seed, c, 2])
    raw = np.floor(np.exp(rng.normal(model.dense_mu, model.dense_sigma, (n, d))))
    dense = np.log1p(raw).astype(np.float32)
    logit = np.full(n, model.bias)
    for t, ids in enumerate(sparse):
        logit += model.table_weight[t] * _id_effect(ids, model.table_salt[t])
    if d:
        logit += (dense - model.dense_mu) @ model.dense_weight
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(n) < p).astype(np.float32)
    return dense, [s.astype(specs[t].dtype) for t, s in enumerate(sparse)], labels


def generate(cfg: SynthConfig, out: Path, overwrite: bool = False,
             progress: Callable[[int], None] | None = None) -> DatasetMeta:
    """Generate the dataset described by `cfg` into `out` (atomically); returns its meta.

    `progress(n)` is called after every chunk with the number of rows written.
    """
    specs = cfg.table_specs()
    dense_names = cfg.dense_names()
    model = _hidden_model(cfg, len(specs), len(dense_names))
    rows = cfg.num_rows
    row_bytes = sum(s.dtype.itemsize for s in specs) + 4 * len(dense_names) + 4
    check_disk(rows * row_bytes, Path(out).absolute().parent,
               f"--rows {rows}: samples of {row_bytes} bytes each", "ask for fewer --rows")
    with atomic_dir(out, overwrite) as tmp, ThreadPoolExecutor(2) as pool:
        w = DatasetWriter(tmp, specs, dense_names, label="label")
        try:
            for c, lo in enumerate(range(0, rows, CHUNK_ROWS)):
                n = min(CHUNK_ROWS, rows - lo)
                w.write(*_chunk(cfg, specs, len(dense_names), model, c, n, pool))
                if progress:
                    progress(n)
        except BaseException:
            w.abort()
            raise
        cfg_dict = asdict(cfg)
        cfg_dict["rows"] = rows
        return w.finish(
            name=cfg.name or f"synth-{cfg.preset}",
            source={"kind": "synth", "generator": "bagpipe_cli.data.synth", "chunk_rows": CHUNK_ROWS},
            options=cfg_dict,
        )
