"""The verdict in words: per setting, which system was fastest, by how much over the best other
system and over sync, whether each gap is outside the noise of the repeats, and which was
fastest to the target AUC; and the flags that say when a setting's figures cannot be
trusted. `report` puts them first on its page and its console output, `bench` after its
closing table.

Definitions (a setting, a variant, a group: `report.analysis`):
- samples/s of a group: the median over its repeats of each run's samples/s, its batch over
  its mean iteration (`results.config_figures`): the one statistic the verdict and `bench`'s
  table rank by (its `mean ms` column is the same median as a time);
- fastest: the group with the highest samples/s in its setting; the best other system: the
  fastest group of another system (`local` included); a gap is the ratio of the two medians;
- a lead within the noise is said in words, without a multiplier in its headline ("`a` and
  `b` are within the noise of each other");
- a gap is outside the noise when the two groups' ranges over repeats (min–max) do not
  overlap, within it when they do, unknown when either has one repeat (`report.noise`);
- fastest to target: the group with the lowest median time to the target AUC over the
  repeats that reached it; its gaps likewise, over those repeats;
- an approximate system (the registry's `fidelity`: it skips work or reads stale rows) is
  labelled so: its speed does not buy sync's parameters, only time to target compares it;
- flag `loaded`: a run whose summary.json says `contention.loaded`;
- flag `compute`: in one setting (one model, batch size, device...), the groups' compute
  (the median over repeats of `median_time_ms` forward + backward) more than COMPUTE_SPREAD
  apart, leaving out the systems whose compute legitimately differs (hotline's split
  batches: `popular_share` set; slipstream's skipped samples: `samples_skipped` > 0);
- a flag's remedy (`launch.contention.remedy`) is never what its runs already did: runs at
  one torch thread (`threads` or `env_torch_threads` 1) are sent to `bagpipe advise`;
- the guidance: `report.fit` (the small-data fact, and `local`'s measurements where they
  disagree with reading it as a verdict).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.registry import role
from bagpipe_cli.launch.contention import remedy
from bagpipe_cli.report.accuracy import fidelity
from bagpipe_cli.report.analysis import BASELINE, ordered_groups
from bagpipe_cli.report.fit import fit_guidance
from bagpipe_cli.report.noise import NOISE_MARK, UNKNOWN_MARK, noise_mark, ratio_range
from bagpipe_cli.results.figures import COMPUTE_SPREAD, percentile

MEASURE = "samples/s: each run's batch / its mean iteration"
NOISE_WORDS = {"outside": "outside the noise of the repeats",
               "within": "within the noise of the repeats: they do not show which is faster",
               "unknown": "from one repeat: the noise is unknown"}


@dataclass(frozen=True)
class Gap:
    """A group's lead over another: `ratio` (its samples/s over theirs, or their time to target
    over its) and whether that is outside the noise ("outside", "within", "unknown")."""

    over: str  # the other group's variant
    ratio: float
    noise: str
    fidelity: str = ""  # the other group's (`Lead.fidelity`)

    @property
    def who(self) -> str:
        return f"`{self.over}`" + (" (approximate)" if self.fidelity == "approximate" else "")


@dataclass(frozen=True)
class Lead:
    """The fastest group of a setting, by samples/s or by time to target."""

    variant: str
    system: str
    fidelity: str  # exact, rounding, approximate ("" for a system the registry does not know)
    value: float  # samples/s, or seconds to target (medians over repeats)
    runs: int  # its repeats with a value (for time to target: those that reached it)
    repeats: int  # all its repeats
    over_other: Gap | None  # over the best group of another system
    over_sync: Gap | None  # over sync (None when it is sync, or sync did not run)


@dataclass(frozen=True)
class SettingVerdict:
    setting: str
    fastest: Lead | None
    to_target: Lead | None  # None: no target AUC in this setting, or none reached it
    target_auc: float
    sentences: tuple[str, ...]


@dataclass(frozen=True)
class Flag:
    """A reason not to trust a setting's figures: `kind` "loaded" or "compute"."""

    setting: str
    kind: str
    runs: tuple[str, ...]  # the runs (loaded) or variants (compute) it names
    text: str


@dataclass
class Verdict:
    settings: list[SettingVerdict] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    bagpipe: str | None = None  # Bagpipe's best speed-up over sync, in one line
    guidance: list[str] = field(default_factory=list)  # small data: `local` can run (report.fit)

    def lines(self) -> list[str]:
        """Every sentence, in reading order: flags, the verdict per setting, Bagpipe's line,
        the guidance."""
        return ([f.text for f in self.flags] + [s for v in self.settings for s in v.sentences]
                + ([self.bagpipe] if self.bagpipe else []) + self.guidance)

    def to_json(self) -> dict[str, Any]:
        return {"settings": [asdict(s) for s in self.settings],
                "flags": [asdict(f) for f in self.flags], "bagpipe": self.bagpipe,
                "guidance": self.guidance}


def _noise(ratio: float, low: float, high: float) -> str:
    mark = noise_mark(ratio, low, high)
    return {NOISE_MARK: "within", UNKNOWN_MARK: "unknown"}.get(mark, "outside")


def _values(g: pd.DataFrame, col: str) -> np.ndarray:
    if col not in g:
        return np.array([])
    v = pd.to_numeric(g[col], errors="coerce").to_numpy(dtype=float)
    return v[~np.isnan(v)]


def _groups(runs: pd.DataFrame) -> dict[str, list[pd.DataFrame]]:
    """The groups of every setting (by setting label), in the report's order."""
    out: dict[str, list[pd.DataFrame]] = {}
    for _, g in ordered_groups(runs):
        out.setdefault(g.iloc[0]["setting"], []).append(g)
    return out


def _lead(groups: list[pd.DataFrame], col: str, higher: bool) -> Lead | None:
    """The best group by the median of `col` (highest, or lowest), with its gaps."""
    vals = {id(g): _values(g, col) for g in groups}
    ranked = [g for g in groups if len(vals[id(g)])]
    if not ranked:
        return None
    sign = -1 if higher else 1
    ranked.sort(key=lambda g: sign * percentile(vals[id(g)], 50))
    best = ranked[0]
    r0 = best.iloc[0]

    def gap(other: pd.DataFrame | None) -> Gap | None:
        if other is None:
            return None
        a, b = (vals[id(best)], vals[id(other)]) if higher else (vals[id(other)], vals[id(best)])
        if not percentile(b, 50) > 0:
            return None
        ratio = percentile(a, 50) / percentile(b, 50)
        return Gap(other.iloc[0]["variant"], ratio, _noise(ratio, *ratio_range(a, b)),
                   fidelity(other.iloc[0]))

    other = next((g for g in ranked if g.iloc[0]["system"] != r0["system"]), None)
    sync = next((g for g in ranked if g.iloc[0]["system"] == BASELINE), None)
    return Lead(r0["variant"], r0["system"], fidelity(r0), percentile(vals[id(best)], 50),
                len(vals[id(best)]), len(best), gap(other),
                gap(sync) if sync is not None and r0["system"] != BASELINE else None)


def _name(lead: Lead, speed: bool = True) -> str:
    """A group's name in the words, with what it trains when that is not sync's parameters."""
    if lead.fidelity == "approximate":
        return (f"`{lead.variant}` (approximate: it trains other parameters than sync"
                + (", so its speed alone does not make it the better system; its time to "
                   "target does)" if speed else ")"))
    if lead.fidelity == "rounding":
        return f"`{lead.variant}` (sync's parameters up to rounding)"
    if role(lead.system) == "bound":
        return f"`{lead.variant}` (every table on each trainer)"
    return f"`{lead.variant}`"


def _gaps(lead: Lead, words: str, other: bool = True) -> str:
    """Its gaps in words: `words` says what a ratio is ("{r}× the throughput of {who}");
    `other`: the gap over the best other system too (not when the headline said it)."""
    parts = []
    if lead.over_other is not None and other:
        o = lead.over_other
        parts.append(words.format(r=f"{o.ratio:.2f}", who=f"the best other system, {o.who}")
                     + f" ({NOISE_WORDS[o.noise]})")
    if lead.over_sync is not None and (lead.over_other is None
                                       or lead.over_sync.over != lead.over_other.over):
        s = lead.over_sync
        parts.append(words.format(r=f"{s.ratio:.2f}", who=s.who)
                     + f" ({NOISE_WORDS[s.noise]})")
    return ", and ".join(parts)


def _tie(setting: str, lead: Lead, values: str, words: str, speed: bool = True) -> str:
    """The headline of a lead within the noise: the two named, no multiplier; `values` says
    both groups' figures, `words` the lead's other gaps ("{r}× ... {who}")."""
    o = lead.over_other
    rest = _gaps(lead, words, other=False)
    name = _name(lead, speed)
    return (f"{setting}: {name} and {o.who} are within the noise of each other ({values}; "
            "their ranges over repeats overlap, so the repeats do not show which is faster)"
            + (f"; {name}: {rest}." if rest else "."))


def _within(lead: Lead) -> bool:
    return lead.over_other is not None and lead.over_other.noise == "within"


def _fastest_sentence(setting: str, fast: Lead) -> str:
    reps = f"median of {fast.runs} repeat{'s' if fast.runs != 1 else ''}"
    words = "{r}× the throughput of {who}"
    if _within(fast):
        other = fast.value / fast.over_other.ratio
        return _tie(setting, fast, f"{fast.value:,.0f} and {other:,.0f} samples/s, medians over "
                    "repeats of each run's batch / its mean iteration", words)
    gaps = _gaps(fast, words)
    return (f"{setting}: {_name(fast)} was fastest, {fast.value:,.0f} samples/s ({reps}; "
            f"{MEASURE})" + (f": {gaps}." if gaps else "; no other system ran here."))


def setting_verdict(setting: str, groups: list[pd.DataFrame]) -> SettingVerdict:
    """The verdict of one setting from its groups (the repeats of each variant)."""
    fast = _lead(groups, "samples_per_s", higher=True)
    sentences = [_fastest_sentence(setting, fast)] if fast is not None else []
    target = _target(groups)
    to_target = _lead(groups, "time_to_target_s", higher=False) if not math.isnan(target) else None
    if not math.isnan(target):
        sentences.append(_target_sentence(setting, target, to_target, groups))
    return SettingVerdict(setting, fast, to_target, target, tuple(sentences))


def _target_sentence(setting: str, target: float, lead: Lead | None,
                     groups: list[pd.DataFrame]) -> str:
    """The fastest to the target AUC in words (a lead within the noise: no multiplier)."""
    if lead is None:
        return f"{setting}: no system reached the target AUC {target:g}."
    missed = [g.iloc[0]["variant"] for g in groups if not len(_values(g, "time_to_target_s"))]
    tail = (f"; not reached by {', '.join(f'`{v}`' for v in missed)}." if missed else ".")
    words = "{r}× sooner than {who}"
    if _within(lead):
        values = (f"{lead.value:.2f} and {lead.value * lead.over_other.ratio:.2f} s to the "
                  f"target AUC {target:g}, medians over the repeats that reached it")
        return _tie(setting, lead, values, words, speed=False).removesuffix(".") + tail
    reached = f"{lead.runs} of {lead.repeats} repeat{'s' if lead.repeats != 1 else ''} that reached it"
    gaps = _gaps(lead, words)
    return (f"{setting}: fastest to the target AUC {target:g}: {_name(lead, speed=False)}, "
            f"{lead.value:.2f} s (median of the {reached})" + (f": {gaps}" if gaps else "") + tail)


def _target(groups: list[pd.DataFrame]) -> float:
    t = np.concatenate([_values(g, "target_auc") for g in groups]) if groups else np.array([])
    return float(np.median(t)) if len(t) else math.nan


def _loaded_detail(hit: pd.DataFrame) -> str:
    """What the loaded runs' summaries say about their load, in a few words: the worst figures,
    or the first run's own note where they recorded none."""
    def worst(col: str) -> float:
        v = _values(hit, col)
        return float(v.max()) if len(v) else math.nan

    load, wait = worst("contention_load_per_core"), worst("contention_queue_wait_share")
    parts = []
    if not math.isnan(load):
        parts.append(f"up to {load:.1f} other runnable processes per core at the start")
    if not math.isnan(wait):
        parts.append(f"their threads waited for a CPU up to {wait:.0%} of the time they could run")
    if parts:
        return ", and ".join(parts)
    notes = [n for n in hit.get("contention_note", pd.Series(dtype=object)) if isinstance(n, str)]
    # a note's own remedy left out: the flag gives the one its runs did not follow
    return notes[0].split(". Its speed")[0].rstrip(".") if notes else "no figures recorded"


def one_thread(runs: pd.DataFrame) -> bool:
    """Whether every run of `runs` computed with one torch thread (`--threads 1`, or one
    recorded in its environment): comparing --threads 1 is then what they already did."""
    def at_one(col: str) -> pd.Series:
        v = pd.to_numeric(runs[col], errors="coerce") if col in runs else None
        return v == 1 if v is not None else pd.Series(False, index=runs.index)

    return bool(len(runs)) and bool((at_one("threads") | at_one("env_torch_threads")).all())


def _fix(runs: pd.DataFrame) -> str:
    """The remedy of a flag on `runs`: never one they already followed."""
    return remedy(one_thread(runs))


def loaded_flags(runs: pd.DataFrame) -> list[Flag]:
    """A flag per setting with runs that recorded `contention.loaded` (runs that recorded no
    contention are not judged: unknown)."""
    if "contention_loaded" not in runs:
        return []
    out = []
    for setting, groups in _groups(runs).items():
        g = pd.concat(groups)
        hit = g[g["contention_loaded"].map(lambda v: v is True)]
        if hit.empty:
            continue
        ids = ", ".join(f"`{r}`" for r in hit["run_id"].head(3))
        more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
        out.append(Flag(setting, "loaded", tuple(hit["run_id"]),
                        f"{setting}: {len(hit)} of {len(g)} runs ran under load ({ids}{more}): "
                        f"{_loaded_detail(hit)}. Their times measure the other processes as much "
                        f"as the systems; {_fix(g)}."))
    return out


def _compute_ms(g: pd.DataFrame) -> float:
    """A group's compute: the median over repeats of its median forward + backward ms (NaN
    when its compute legitimately differs from the others', or was not recorded)."""
    if "popular_share" in g and g["popular_share"].notna().any():
        return math.nan  # hotline: batches split, computed in two parts
    skipped = _values(g, "samples_skipped")
    if len(skipped) and (skipped > 0).any():
        return math.nan  # slipstream: samples skipped
    if not {"median_ms_forward", "median_ms_backward"} <= set(g):
        return math.nan
    per_run = (pd.to_numeric(g["median_ms_forward"], errors="coerce")
               + pd.to_numeric(g["median_ms_backward"], errors="coerce"))
    return percentile(per_run.to_numpy(dtype=float), 50)


def compute_flags(runs: pd.DataFrame) -> list[Flag]:
    """A flag per setting whose systems computed the same model more than COMPUTE_SPREAD
    apart (see the module docstring)."""
    out = []
    for setting, groups in _groups(runs).items():
        ms = {g.iloc[0]["variant"]: _compute_ms(g) for g in groups}
        fix = _fix(pd.concat(groups))
        ms = {v: x for v, x in ms.items() if not math.isnan(x) and x > 0}
        if len(ms) < 2:
            continue
        fastest = min(ms, key=ms.__getitem__)
        slow = [v for v, x in ms.items() if x > COMPUTE_SPREAD * ms[fastest]]
        if not slow:
            continue
        spread = max(ms.values()) / ms[fastest]
        listed = ", ".join(f"`{v}` {x:.1f}" for v, x in ms.items())
        slower = ", ".join(f"`{v}`" for v in slow)
        out.append(Flag(setting, "compute", tuple(slow),
                        f"{setting}: the systems ran the same model at compute times {spread:.1f}× "
                        f"apart (forward + backward, median ms: {listed}): {slower} computed more "
                        f"than {COMPUTE_SPREAD:g}× slower than `{fastest}`, so the speed-ups in "
                        "this setting are not trustworthy. Likely cause: thread oversubscription "
                        "(a system's extra threads: loader, prefetcher, planner, competing with "
                        f"torch's) or a loaded machine; {fix}."))
    return out


def bagpipe_line(summary: pd.DataFrame) -> str | None:
    """Bagpipe's largest speed-up over sync, in one line (None without one)."""
    best = summary[(summary["system"].map(role) == "ours") & summary["speedup"].notna()]
    if not len(best):
        return None
    b = best.loc[best["speedup"].idxmax()]
    noise = _noise(b["speedup"], b["speedup_low"], b["speedup_high"])
    if noise == "within":
        return (f"Bagpipe against sync, at its best (`{b['variant']}`, {b['setting']}): "
                f"`{b['variant']}` and `sync` are within the noise of each other (their ranges "
                "over repeats overlap, so the repeats do not show which is faster).")
    return (f"Bagpipe's largest speed-up over sync: {b['speedup']:.2f}× (`{b['variant']}`, "
            f"{b['setting']}; {NOISE_WORDS[noise]}).")


def build_verdict(runs: pd.DataFrame, summary: pd.DataFrame) -> Verdict:
    """The verdict of annotated runs (`analysis.annotate`) and their summary table."""
    settings = [setting_verdict(s, gs) for s, gs in _groups(runs).items()]
    return Verdict(settings, loaded_flags(runs) + compute_flags(runs), bagpipe_line(summary),
                   fit_guidance(runs, _groups(runs)))
