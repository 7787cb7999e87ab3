"""`bagpipe report`: figures and a page from stored results (a pure function of them).

Entry point: `build_report(ReportConfig(results=(...), out=..., formats=(...))) -> ReportResult`.
It reads run folders with `bagpipe_cli.results.load_runs` (a run that cannot be read, inside
a folder given, is skipped: `ReportResult.skipped`, listed on the page and in report.json)
and the access profiles a bench stored in `<bench>/profiles/<dataset>/`, and writes
(atomically) into one folder:

- `report.md`, `report.html` (figures embedded as PNG, self-contained), as asked;
- figures `speedup`, `time_breakdown`, `throughput_vs_lookahead`, `throughput_vs_cache`,
  `loss`, `rows_fetched`, `timeline` and `overlap` (runs with a trace: `report/over_time.py`),
  `auc` (runs that evaluated during training), `access_cdf` in the image formats asked (png,
  svg); a figure the results cannot support (no lookahead sweep, no trace, no profile...) is
  skipped with a note;
- `summary.csv` (the summary table, numeric), `time_breakdown.csv`, `runs.csv` (every run
  loaded, one row each), `accuracy.csv` and `overlap.csv` (when there are evaluations or
  traces), `report.json` (inputs, figures, notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bagpipe_cli.engine.records.metrics import MIN_AUC_CLASS, auc_warning
from bagpipe_cli.errors import ConfigError
from bagpipe_cli.files.atomic import atomic_dir, write_json
from bagpipe_cli.files.outputs import Output, check_output
from bagpipe_cli.files.records import read_record
from bagpipe_cli.report import plots
from bagpipe_cli.report.analysis import (
    BASELINE,
    annotate,
    context,
    summary_table,
    swept,
    time_breakdown,
    traffic_table,
)
from bagpipe_cli.report.over_time import draw_accuracy, draw_timeline
from bagpipe_cli.report.page import Block, page_blocks, render_html, render_markdown
from bagpipe_cli.report.verdict import Verdict, build_verdict
from bagpipe_cli.results import SkippedRun, is_run, load_runs

FORMATS = ("png", "svg", "html", "md")
IMAGE_FORMATS = ("png", "svg")
REPORT_SCHEMA_VERSION = 1
_Figure = tuple[str, Any, str, str]  # name, matplotlib figure, heading, caption



@dataclass(frozen=True)
class ReportConfig:
    """What `bagpipe report` reads and writes."""

    results: tuple[Path, ...]  # run folders, bench folders or parents
    out: Path | None = None  # default: <first result>/report
    formats: tuple[str, ...] = ("png", "html", "md")  # of FORMATS
    overwrite: bool = False  # replace a non-empty --out (never a bagpipe folder of another kind)

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", tuple(Path(p) for p in self.results))
        object.__setattr__(self, "formats", tuple(dict.fromkeys(f.strip().lower()
                                                                 for f in self.formats if f.strip())))
        if not self.results:
            raise ConfigError("RESULTS: give at least one results folder")
        if not self.formats:
            raise ConfigError("--format: give at least one of " + ",".join(FORMATS))
        for f in self.formats:
            if f not in FORMATS:
                raise ConfigError(f"--format {f!r}: choose from {','.join(FORMATS)}")

    @property
    def out_dir(self) -> Path:
        return Path(self.out) if self.out is not None else self.results[0] / "report"


@dataclass
class ReportResult:
    """What a report contains: its folder and files, the tables and the notes."""

    out: Path
    files: list[Path]
    runs: pd.DataFrame
    summary: pd.DataFrame
    breakdown: pd.DataFrame
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[SkippedRun] = field(default_factory=list)  # runs that could not be read
    accuracy: pd.DataFrame = field(default_factory=pd.DataFrame)  # time to target, per group
    overlap: pd.DataFrame = field(default_factory=pd.DataFrame)  # transfers hidden, per group
    traffic: pd.DataFrame = field(default_factory=pd.DataFrame)  # MB per iteration by role and kind
    verdict: Verdict = field(default_factory=Verdict)  # the words: fastest, flags, guidance


def find_profiles(paths: tuple[Path, ...], runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame, dict]]:
    """(dataset name, access_cdf.csv, profile.json) of the bench profiles near `paths`."""
    cands: list[Path] = []
    for p in paths:
        p = Path(p)
        cands += sorted(p.glob("profiles/*/access_cdf.csv"))
        if is_run(p):  # a run folder inside <bench>/runs/
            cands += sorted(p.parent.parent.glob("profiles/*/access_cdf.csv"))
        if not cands:
            cands += sorted(q for q in p.rglob("access_cdf.csv") if "report" not in q.parts)
    seen, out = set(), []
    datasets = set(runs["dataset"].dropna())
    for c in cands:
        name = c.parent.name
        if name in seen or (datasets and name not in datasets):
            continue
        seen.add(name)
        prof = {}
        if (c.parent / "profile.json").is_file():
            try:
                prof = read_record(c.parent / "profile.json", "profile")  # limited; a bad one: {}
            except ValueError:
                prof = {}
        out.append((name, pd.read_csv(c), prof))
    return out


def _curves(runs: pd.DataFrame, metrics: pd.DataFrame, measured_only: bool
            ) -> tuple[list[tuple[str, str, pd.DataFrame]], list[str]]:
    """Per (dataset, model): the first setting that has sync, every variant's first repeat."""
    out, panels = [], []
    for (_ds, _model), g in runs.groupby(["dataset", "model"], sort=False):
        with_sync = g[g["system"] == BASELINE]["setting_key"]
        key = with_sync.iloc[0] if len(with_sync) else g["setting_key"].iloc[0]
        gs = g[g["setting_key"] == key]
        label = f"{gs['dataset'].iloc[0]} · {gs['model'].iloc[0]} · {gs['setting'].iloc[0]}"
        panels.append(label)
        for _, v in gs.groupby("variant", sort=False):
            r = v.sort_values("repeat").iloc[0]
            m = metrics[metrics["run_path"] == r["run_path"]]
            if measured_only:
                m = m[m["measured"]]
            out.append((label, r["variant"], m))
    return out, panels


def _loss_note(curves: list[tuple[str, str, pd.DataFrame]]) -> str:
    notes = []
    for panel in dict.fromkeys(p for p, _, _ in curves):
        mine = {v: m["loss"].to_numpy() for p, v, m in curves if p == panel}
        base = next((m for v, m in mine.items() if v.split()[0] == BASELINE), None)
        if base is None:
            continue
        for v, m in mine.items():
            if v.split()[0] == BASELINE:
                continue
            if len(m) == len(base) and np.array_equal(m, base):
                notes.append(f"{v}: bitwise identical to sync")
            elif len(m) == len(base):
                notes.append(f"{v}: max |Δloss| vs sync {np.max(np.abs(m - base)):.2g}")
    return "; ".join(notes)


def build_report(cfg: ReportConfig) -> ReportResult:
    """Load the results under `cfg.results`, draw every figure, write the page(s)."""
    out = cfg.out_dir
    check_output(Output("--out", out, "report"), cfg.overwrite)
    loaded = load_runs(*cfg.results)
    runs, metrics = annotate(loaded.runs), loaded.metrics
    summary = summary_table(runs)
    bd = time_breakdown(runs, metrics)
    sub = context(runs)
    figures: list[_Figure] = []
    notes: list[str] = []
    _draw_speedup(runs, summary, sub, figures, notes)
    _draw_breakdown(bd, sub, figures)
    _draw_sweeps(runs, sub, figures, notes)
    _draw_curves(runs, metrics, sub, figures)
    overlap = draw_timeline(runs, sub, figures, notes)
    acc = draw_accuracy(runs, loaded.evals, summary, sub, figures, notes)
    _draw_access_cdf(cfg, runs, figures, notes)
    notes += auc_notes(runs)
    traffic = traffic_table(runs, loaded.traffic)
    verdict = build_verdict(runs, summary)
    blocks = page_blocks(cfg.results, runs, summary, figures, notes, sub, loaded.skipped, acc,
                         traffic, verdict)
    result = ReportResult(out, [], runs, summary, bd, [f[0] for f in figures], notes,
                          loaded.skipped, acc, overlap, traffic, verdict)
    result.files = _write_report(cfg, result, figures, blocks)
    return result


def auc_notes(runs: pd.DataFrame) -> list[str]:
    """A note naming the runs whose held-out AUC rests on fewer than MIN_AUC_CLASS samples of a
    class (runs written before the summary counted the classes are not judged)."""
    if not {"eval_positives", "eval_negatives"} <= set(runs):
        return []
    thin = []
    for _, r in runs.iterrows():
        p, n = r["eval_positives"], r["eval_negatives"]
        if pd.notna(p) and pd.notna(n) and auc_warning(int(p), int(n)):
            thin.append(f"`{r['run_id']}` ({int(p):,} positive, {int(n):,} negative)")
    if not thin:
        return []
    return [f"Held-out AUC: {len(thin)} run{'s' if len(thin) != 1 else ''} rest on fewer than "
            f"{MIN_AUC_CLASS} held-out samples of one class, so their AUC says little (raise "
            "--eval-rows): " + "; ".join(thin) + "."]


def _draw_speedup(runs: pd.DataFrame, summary: pd.DataFrame, sub: str, figures: list[_Figure],
                  notes: list[str]) -> None:
    systems = list(dict.fromkeys(runs["system"]))
    fig = plots.plot_speedup(summary, sub)
    if fig is None:
        notes.append("No speed-up chart: the results have no `sync` run in the same setting as "
                      "another system." if BASELINE in systems or len(systems) > 1 else
                      "No speed-up chart: the results hold only one system.")
        return
    missing = [s for s in systems if s != BASELINE and not
               summary[(summary["system"] == s)]["speedup"].notna().any()]
    if missing:
        notes.append(f"No sync run in the setting of {', '.join(missing)}: no speed-up for them.")
    figures.append(("speedup", fig, "Speed-up over sync",
                    "Median samples/s of each system divided by the median samples/s of `sync` in "
                    "the same setting (same dataset, model, network, trainers...). Error bars: "
                    "p10–p90 over repeats of each repeat's samples/s divided by sync's median. "
                    "Warm-up iterations are excluded."))


def _draw_breakdown(bd: pd.DataFrame, sub: str, figures: list[_Figure]) -> None:
    fig = plots.plot_breakdown(bd, sub)
    if fig is not None:
        figures.append(("time_breakdown", fig, "Per-iteration time breakdown",
                        "Mean time per measured iteration spent in each stage, stacked (means, so "
                        "that costs paid once per round, such as Bagpipe's prefetch wait at a "
                        "round's start, are amortised over the round); `other` is iteration time "
                        "outside the six timed stages. The black tick is the median iteration time "
                        "(the median over repeats of each run's median, as in the summary)."))


def _draw_sweeps(runs: pd.DataFrame, sub: str, figures: list[_Figure], notes: list[str]) -> None:
    for col, name, heading in (("lookahead", "throughput_vs_lookahead", "Throughput vs lookahead"),
                               ("cache_rows", "throughput_vs_cache", "Throughput vs cache size")):
        sw = swept(runs, col)
        fig = plots.plot_sweep(sw, col, runs[runs["system"] == BASELINE], sub)
        if fig is None:
            notes.append(f"{heading}: skipped, the results do not vary `{col}` for a system that "
                         "reads it.")
        else:
            figures.append((name, fig, heading,
                            f"Median samples/s over repeats against `{col}` (p10–p90 error bars); "
                            "horizontal lines: sync in the same setting."))


def _draw_curves(runs: pd.DataFrame, metrics: pd.DataFrame, sub: str, figures: list[_Figure]) -> None:
    """The per-iteration figures: loss, and rows fetched."""
    warmup = int(runs["warmup"].min()) if "warmup" in runs else 0
    curves, _ = _curves(runs, metrics, measured_only=False)
    loss_note = _loss_note(curves)
    fig = plots.plot_loss(curves, warmup, sub, "sync thick, bagpipe thin dashed on top")
    if fig is not None:
        figures.append(("loss", fig, "Loss curves",
                        "Training loss of each system's first repeat, every iteration (the grey band "
                        "is the warm-up, excluded from the speed figures only). Sync is drawn as a "
                        "thick translucent line and Bagpipe as a thin dashed line on top: Bagpipe "
                        "produces the same parameters as synchronous training, so where the curves "
                        "are identical only the dashed line over the thick one shows. "
                        + (f"Checked on the stored losses: {loss_note}." if loss_note else "")))
    curves_m, _ = _curves(runs, metrics, measured_only=True)
    fig = plots.plot_rows_fetched(curves_m, sub)
    if fig is not None:
        figures.append(("rows_fetched", fig, "Rows fetched per iteration",
                        "Embedding rows each system fetched from the embedding servers in each "
                        "measured iteration (first repeat); the dotted line is the batch's unique "
                        "rows, which sync fetches every time. Bagpipe fetches only rows not used in "
                        "the previous L iterations."))


def _draw_access_cdf(cfg: ReportConfig, runs: pd.DataFrame, figures: list[_Figure],
                     notes: list[str]) -> None:
    profiles = find_profiles(cfg.results, runs)
    fig = plots.plot_access_cdf(profiles)
    if fig is None:
        notes.append("Access skew: skipped, no `profiles/<dataset>/access_cdf.csv` (written by "
                     "`bagpipe bench` or `bagpipe profile`) next to the results.")
    else:
        figures.append(("access_cdf", fig, "Access skew of the dataset",
                        "Share of all embedding accesses taken by the most-accessed rows (from "
                        "`bagpipe profile`): the skew that makes caching pay."))


def _write_report(cfg: ReportConfig, res: ReportResult, figures: list[_Figure],
                  blocks: list[Block]) -> list[Path]:
    """Write the figures, tables, page(s) and report.json into `res.out` (atomically)."""
    out = res.out
    images = tuple(f for f in cfg.formats if f in IMAGE_FORMATS)
    if "md" in cfg.formats and "png" not in images:
        images = ("png", *images)  # the Markdown page links PNG files
    files: list[Path] = []
    with atomic_dir(out, overwrite=True) as tmp:
        for name, fig, _, _ in figures:
            files += [out / p.name for p in plots.save(fig, tmp, name, images)]
        res.summary.to_csv(tmp / "summary.csv", index=False)
        res.breakdown.to_csv(tmp / "time_breakdown.csv", index=False)
        res.runs.to_csv(tmp / "runs.csv", index=False)
        files += [out / "summary.csv", out / "time_breakdown.csv", out / "runs.csv"]
        for name, table in (("accuracy.csv", res.accuracy), ("overlap.csv", res.overlap),
                            ("traffic.csv", res.traffic)):
            if len(table):
                table.to_csv(tmp / name, index=False)
                files.append(out / name)
        if "md" in cfg.formats:
            (tmp / "report.md").write_text(render_markdown(blocks))
            files.append(out / "report.md")
        if "html" in cfg.formats:
            pngs = {name: plots.png_bytes(fig) for name, fig, _, _ in figures}
            for b in blocks:
                if b.kind == "figure":
                    b.png = pngs[b.figure]
            (tmp / "report.html").write_text(render_html(blocks, blocks[0].text))
            files.append(out / "report.html")
        write_json(tmp / "report.json", {
            "kind": "bagpipe-report", "schema_version": REPORT_SCHEMA_VERSION,
            "results": [str(p) for p in cfg.results], "runs": len(res.runs),
            "formats": list(cfg.formats), "figures": [f[0] for f in figures], "notes": res.notes,
            "skipped": [s.to_dict() for s in res.skipped], "verdict": res.verdict.to_json(),
        })
    return files
