"""advice.json and advice.md: the verdict, the predictions at the user's cluster, the fastest
system at each trainer count and network, the plot of speed-up against trainers, the
validation, and the load the advice was made under."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bagpipe_cli.files.atomic import write_json

COLUMNS = (("system", "system", "{}"), ("mean_ms", "ms / iteration", "{:.2f}"),
           ("speedup", "x sync", "{:.2f}"), ("compute_ms", "compute", "{:.2f}"),
           ("exposed_fetch_ms", "rows wait", "{:.2f}"), ("exposed_sync_ms", "sums wait", "{:.2f}"),
           ("exposed_plan_ms", "plans wait", "{:.2f}"))


def _cell(fmt: str, v: Any) -> str:
    """A figure, or - where there is none (x sync without sync among the systems)."""
    return "-" if isinstance(v, float) and math.isnan(v) else fmt.format(v)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(advice: Any) -> str:
    """The page (see the module docstring)."""
    cfg, v = advice.config, advice.verdict
    preds = sorted(advice.simulation.predictions, key=lambda p: p.mean_ms)
    lines = [f"# Advice for {advice.data}", "",
             f"{cfg.trainers} trainers, {cfg.net_gbps:g} Gbit/s, a global batch of {cfg.batch:,} "
             f"({cfg.per_trainer:,} a trainer), {cfg.model}, E = {cfg.emb_dim}"
             + (f", the log x{cfg.scale}" if cfg.scale > 1 else "") + ".", "",
             *(f"- {line}" for line in v.lines), "",
             "## Predicted at your cluster", "",
             *_table([c[1] for c in COLUMNS],
                     [[_cell(fmt, getattr(p, k)) for k, _, fmt in COLUMNS] for p in preds]), "",
             "Means after the warm-up; the waits are what the iteration waits beyond its compute.",
             "", "## Where the answer changes", "",
             *_table(["trainers", "fastest", "x sync"],
                     [[f"{d['trainers']:g}", d["fastest"], _cell("{:.2f}", d["speedup_over_sync"])]
                      for d in v.by_trainers]), "",
             *_table(["Gbit/s", "fastest", "x sync"],
                     [[f"{d['net_gbps']:g}", d["fastest"], _cell("{:.2f}", d["speedup_over_sync"])]
                      for d in v.by_gbps]), "",
             "![speed-up over sync against trainers](simulation/speedup_vs_trainers.png)", "",
             "## How far to trust it", "",
             f"The model against the {v.validated.get('runs', 0)} measuring runs it was "
             f"calibrated from (`bench/`): confidence {v.confidence}.", ""]
    rows = [[r["system"], f"{r['predicted_ms']:.2f}", f"{r['measured_ms']:.2f}",
             f"{100 * r['error']:+.1f}%"] for r in advice.validation]
    if rows:
        lines += [*_table(["system", "predicted ms", "measured ms", "error"], rows), ""]
    load = advice.load.get("load_per_core")
    lines.append("The machine's load while advising: "
                 + (f"{load:.2f} runnable processes per core beside it." if load is not None
                    else "not measured here.")
                 + " The runs computed on one torch thread each, and the planner's time is its "
                   "thread CPU time.")
    return "\n".join(lines) + "\n"


def write_advice(advice: Any, folder: Path) -> list[Path]:
    """advice.json and advice.md into `folder` (the command's temporary output)."""
    write_json(folder / "advice.json", advice.to_json())
    (folder / "advice.md").write_text(markdown(advice), encoding="utf-8")
    return [folder / "advice.json", folder / "advice.md"]
