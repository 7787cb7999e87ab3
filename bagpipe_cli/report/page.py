"""The report page: a list of blocks rendered to Markdown and to self-contained HTML."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass

import pandas as pd

from bagpipe_cli.report.analysis import BASELINE
from bagpipe_cli.report.noise import legend, noise_mark


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
