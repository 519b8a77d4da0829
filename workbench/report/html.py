"""Write one self-contained HTML file from figures, tables and text.

plotly.js is embedded once (the first figure), so the file opens offline, on a cluster login node or
as a CI artifact. Tables are pandas' HTML with a light style, in a box that scrolls sideways when a
table is wider than the page (long kernel names wrap in their cell), so nothing runs off the page.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Section", "write_report", "render_report"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}
.meta{color:var(--jp-ui-font-color2,#666);font-size:.9rem} table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right} th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}
.finding{padding:.4rem .8rem;margin:.4rem 0;border-left:4px solid #888;background:#fafafa}
.finding.warning{border-color:#e69f00} .finding.critical{border-color:#d55e00} .finding.info{border-color:#0072b2}
.finding table{margin:.2rem 0;font-size:.8rem} .finding td,.finding th{border:none;padding:0 .5rem}
.wb-table{overflow-x:auto;max-width:100%;margin:.5rem 0} .wb-table table{margin:0}
table{display:block;overflow-x:auto;max-width:100%} .wb-table table{display:table}
td:first-child{max-width:40rem;overflow-wrap:anywhere} th{white-space:nowrap}
p,li,.finding{overflow-wrap:anywhere} pre{white-space:pre-wrap;overflow-wrap:anywhere}
"""
# Tables never run off the page: a DataFrame sits in a sideways-scrolling .wb-table box, any other table
# (a finding's evidence, raw HTML) scrolls by itself (display:block), long names wrap inside their cell.


@dataclass
class Section:
    """One heading with any mix of blocks: a plotly Figure, a pandas DataFrame, or text (escaped) / raw HTML."""

    title: str
    blocks: list[Any] = field(default_factory=list)
    raw_html: bool = False  # str blocks are escaped unless this is True


def _block_html(block: Any, state: dict, raw_html: bool) -> str:
    if hasattr(block, "to_html") and hasattr(block, "data") and hasattr(block, "layout"):  # plotly Figure
        import plotly.io as pio

        include = not state["plotly_included"]
        state["plotly_included"] = True
        return pio.to_html(block, include_plotlyjs=include, full_html=False, config={"displaylogo": False})
    if hasattr(block, "to_html") and hasattr(block, "columns"):  # pandas DataFrame
        table = block.to_html(index=False, border=0, float_format=lambda v: f"{v:,.3f}", na_rep="")
        return f"<div class='wb-table'>{table}</div>"
    text = str(block)
    return text if raw_html else f"<p>{html.escape(text)}</p>"


def render_report(title: str, sections: list[Section], subtitle: str = "") -> str:
    """The HTML text of a report."""
    state = {"plotly_included": False}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if subtitle:
        parts.append(f"<div class='meta'>{html.escape(subtitle)}</div>")
    for sec in sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        parts.extend(_block_html(b, state, sec.raw_html) for b in sec.blocks)
    parts.append("<div class='meta'>made by gpu-workbench</div></body></html>")
    return "\n".join(parts)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_report(path: str | os.PathLike, title: str, sections: list[Section], subtitle: str = "") -> Path:
    """Write the report atomically (temporary file, then rename; an existing file keeps its mode, a
    symlink/FIFO/folder target is refused: ``io/_files.py::atomic_write``) and return its path."""
    from workbench.io._files import atomic_write

    path = Path(path)
    text = render_report(title, sections, subtitle)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
    return path
