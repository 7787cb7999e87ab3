"""The report page: a list of blocks rendered to Markdown and to self-contained HTML."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bagpipe_cli.report.accuracy import ACCURACY_TEXT, display_accuracy
from bagpipe_cli.report.analysis import BASELINE, TRAFFIC_TEXT
from bagpipe_cli.report.noise import legend, noise_mark
from bagpipe_cli.report.verdict import Verdict


@dataclass
class Block:
    """One piece of the page: kind is "h1", "h2", "p", "table" or "figure"."""

    kind: str
    text: str = ""
    table: pd.DataFrame | None = None
    figure: str = ""  # figure name (files <name>.png / .svg next to the page)
    png: bytes | None = None  # for embedding in HTML
    alt: str = ""  # a figure's short description


def _num(x: float, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def display_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary table as strings: median (p10–p90); a speed-up within the repeats' noise
    is marked (`noise.legend` of the column says how)."""
    rows = []
    for r in summary.itertuples():
        mark = "" if r.system == BASELINE else noise_mark(r.speedup, r.speedup_low, r.speedup_high)
        rows.append({
            "setting": r.setting, "system": r.variant, "runs": str(r.runs),
            "iteration ms: median (p10–p90)":
                f"{_num(r.iter_ms_median, '.1f')} ({_num(r.iter_ms_p10, '.1f')}–{_num(r.iter_ms_p90, '.1f')})",
            "samples/s: median (p10–p90)":
                f"{_num(r.samples_per_s_median, ',.0f')} ({_num(r.samples_per_s_p10, ',.0f')}–"
                f"{_num(r.samples_per_s_p90, ',.0f')})",
            "speed-up vs sync: median (p10–p90)":
                "—" if math.isnan(r.speedup) else
                f"{r.speedup:.2f}× ({_num(r.speedup_p10, '.2f')}–{_num(r.speedup_p90, '.2f')}) "
                f"{mark}".rstrip(),
            "final loss": _num(r.final_loss, ".4f"),
            "eval AUC": _num(r.eval_auc, ".4f"),
        })
    return pd.DataFrame(rows)


def table_with_legend(table: pd.DataFrame, *columns: str) -> list[Block]:
    """A table, then a line saying what the noise marks in `columns` mean (when any is used)."""
    key = legend(c for col in columns if col in table for c in table[col])
    return [Block("table", table=table)] + ([Block("p", key)] if key else [])


def display_traffic(traffic: pd.DataFrame) -> pd.DataFrame:
    """The bytes-by-role table as strings: MB per iteration, 3 decimals."""
    out = traffic.copy()
    names = {c: f"{c.removesuffix('_mb')} MB/it" for c in out.columns if c.endswith("_mb")}
    for c in names:
        out[c] = out[c].map(lambda v: _num(v, ".3f"))
    return out.rename(columns=names)


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block], image_ext: str = "png") -> str:
    out: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}\n")
        elif b.kind == "h2":
            out.append(f"## {b.text}\n")
        elif b.kind == "p":
            out.append(f"{b.text}\n")
        elif b.kind == "table" and b.table is not None:
            cols = list(b.table.columns)
            out.append("| " + " | ".join(map(_md_cell, cols)) + " |")
            out.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(cols))) + "|")
            for row in b.table.itertuples(index=False):
                out.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
            out.append("")
        elif b.kind == "figure":
            out.append(f"![{b.alt or b.figure}]({b.figure}.{image_ext})\n")
            out.append(f"*{b.text}*\n")
    return "\n".join(out)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; }
code { background: #f6f6f6; padding: 0 3px; }
"""


_NUM_TD = '<td class="num">'


def render_html(blocks: list[Block], title: str) -> str:
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "table" and b.table is not None:
            out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(str(c))}</th>"
                                                      for c in b.table.columns) + "</tr></thead><tbody>")
            for row in b.table.itertuples(index=False):
                out.append("<tr>" + "".join(
                    (_NUM_TD if i >= 2 else "<td>") + f"{html.escape(str(v))}</td>"
                    for i, v in enumerate(row)) + "</tr>")
            out.append("</tbody></table>")
        elif b.kind == "figure":
            src = (f"data:image/png;base64,{base64.b64encode(b.png).decode()}" if b.png
                   else f"{b.figure}.png")
            out.append(f"<figure><img src=\"{src}\" alt=\"{html.escape(b.alt or b.figure)}\">"
                       f"<figcaption>{_inline(b.text)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code>."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


VERDICT_TEXT = (
    "Per setting: the fastest system (median samples/s over repeats) and its lead over the best "
    "other system and over sync, each said to be outside the noise of the repeats only when the "
    "two systems' ranges over repeats (min–max) do not overlap; the fastest to the target AUC "
    "where runs evaluated. Warnings first: a setting whose runs ran under load, or whose systems "
    "computed the same model at very different speeds, has figures that say more about the "
    "machine than about the systems.")


def verdict_blocks(verdict: Verdict) -> list[Block]:
    """The verdict section: the flags, the sentences per setting, Bagpipe's line, the guidance."""
    blocks = [Block("h2", "Verdict"), Block("p", VERDICT_TEXT)]
    blocks += [Block("p", f"Warning: {f.text}") for f in verdict.flags]
    blocks += [Block("p", s) for v in verdict.settings for s in v.sentences]
    blocks += [Block("p", s) for s in ([verdict.bagpipe] if verdict.bagpipe else [])]
    return blocks + [Block("p", s) for s in verdict.guidance]


def _intro(inputs: Sequence[Path], runs: pd.DataFrame, sub: str) -> str:
    n_runs = len(runs)
    emulated = runs["network_emulated"].fillna(False).astype(bool) if "network_emulated" in runs \
        else pd.Series([False] * n_runs)
    rev = [r for r in dict.fromkeys(runs.get("env_git_revision", pd.Series(dtype=object)).dropna())]
    dirty = bool(runs.get("env_git_dirty", pd.Series(dtype=object)).fillna(False).astype(bool).any())
    return (f"{n_runs} runs from {', '.join(f'`{p}`' for p in inputs)}: {sub}. Network emulated "
            f"in {int(emulated.sum())} of {n_runs} runs. Code: "
            + (", ".join(f"`{r[:10]}`" for r in rev) if rev else "unknown revision")
            + (" (with uncommitted changes)" if dirty else "") + ". "
            "Speed figures exclude warm-up iterations; every number is a median with its "
            "p10–p90 spread.")


def page_blocks(inputs: Sequence[Path], runs: pd.DataFrame, summary: pd.DataFrame,
                figures: list[tuple[str, Any, str, str]], notes: list[str], sub: str,
                skipped: Sequence[Any], accuracy: pd.DataFrame, traffic: pd.DataFrame,
                verdict: Verdict) -> list[Block]:
    """The whole page: the verdict first, then the tables, the figures and the notes."""
    benches = [b for b in dict.fromkeys(runs["bench"].dropna())] if "bench" in runs else []
    title = f"Benchmark report: {', '.join(benches)}" if benches else "Benchmark report"
    blocks = [Block("h1", title), *verdict_blocks(verdict), Block("p", _intro(inputs, runs, sub)),
              Block("h2", "Summary"),
              Block("p", "One row per system and setting. Samples/s and iteration time: medians "
                         "over repeats of each run's samples/s and median iteration (the "
                         "iteration's p10–p90: the median over repeats of each run's own; "
                         "samples/s's: over repeats), as `bench` shows them; speed-up = median "
                         "samples/s / median samples/s of sync in the same setting."),
              *table_with_legend(display_summary(summary), "speed-up vs sync: median (p10–p90)")]
    if len(accuracy):
        blocks += [Block("h2", "Accuracy and time to target"), Block("p", ACCURACY_TEXT),
                   *table_with_legend(display_accuracy(accuracy), "time-to-accuracy speed-up (range)",
                                      "throughput speed-up (range)")]
    if len(traffic):
        blocks += [Block("h2", "Bytes per iteration by role"), Block("p", TRAFFIC_TEXT),
                   Block("table", table=display_traffic(traffic))]
    for name, _, heading, caption in figures:
        blocks += [Block("h2", heading), Block("figure", caption, figure=name, alt=heading)]
    if notes:
        blocks += [Block("h2", "Notes")] + [Block("p", n) for n in notes]
    if skipped:
        blocks += [Block("h2", "Skipped runs"),
                   Block("p", "Unreadable, left out of every figure and table: "
                              + "; ".join(f"`{s.path}`: {s.reason}" for s in skipped))]
    env_cols = [c for c in ("env_cpu", "env_torch", "env_torch_threads", "env_cuda", "env_hostname")
                if c in runs]
    if env_cols:
        env = runs[env_cols].astype(str).drop_duplicates()
        env.columns = [c.removeprefix("env_") for c in env_cols]
        blocks += [Block("h2", "Environment"), Block("table", table=env)]
    return blocks
