"""Pieces every panel shares: a status line, an error area, guarded callbacks, tables.

Figures are drawn with :class:`workbench.panels._plot.PlotWidget` (``PlotWidget(fig)``, ``fw.show(fig)``).

A panel subclasses :class:`PanelBase` (an ``ipywidgets.VBox``), so it is the last expression of a cell
and displays itself; ``panel.widget`` is the same object for code that expects an attribute. Callbacks
wrapped with :meth:`PanelBase.guard` never raise into the notebook: the message goes to the panel's
error area (an ``ipywidgets.Output``) and to ``panel.last_error``; a :class:`WorkbenchError` shows
its own text (it names the cause and the fix), anything else its type and message.

Every panel is built one way, ``Panel(source)``, with a file path, a loaded object or a capture result.
:func:`classify` says what ``source`` is without loading it (the artifact registry, ``io/kinds.py``: a
file by its first bytes, an object by its type); a panel given a kind it does not show raises
:func:`wrong_kind`'s error, which names the panel or command that does::

    MemoryPanel("run.pt.trace.json.gz")
    BadArtifact: run.pt.trace.json.gz: is a Kineto trace, not an allocator snapshot. Use
    ProfilerPanel(path) or `workbench trace` ...

A missing file raises too, before any widget exists, so no dead controls or progress bar are left in
the output. A file of the right kind that fails to load (truncated, corrupt) is the loader's error.
:func:`panel_class` imports the panel the registry names for a kind.

CSS classes for browser tests: ``wb-panel``, ``wb-status``, ``wb-errors``.
"""

from __future__ import annotations

import functools
import html
import os
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from workbench._optional import import_optional
from workbench.errors import BadArtifact, WorkbenchError

widgets = import_optional("ipywidgets", "to show workbench panels")

__all__ = ["PanelBase", "table_html", "csv_link", "error_text", "path_label", "classify", "wrong_kind",
           "panel_class"]


def error_text(exc: BaseException) -> str:
    """One line for the user: a WorkbenchError's own message, else ``Type: message``."""
    if isinstance(exc, WorkbenchError):
        return str(exc)
    msg = str(exc) or "(no message)"
    return f"{type(exc).__name__}: {msg}"


_CUT = 64  # characters of a text cell shown (the whole text on hover), so the number columns fit beside it
_CSV_MAX_BYTES = 8 * 2**20  # a bigger table gets no CSV link (the data URI travels in the page)


def csv_link(df: pd.DataFrame, name: str = "table.csv") -> str:
    """A link that downloads ``df`` (every row, the stored columns and units) as a CSV file; empty when
    the CSV would be larger than 8 MiB."""
    import base64

    text = df.to_csv(index=False)
    data = text.encode("utf-8")
    if len(data) > _CSV_MAX_BYTES:
        return ""
    href = "data:text/csv;charset=utf-8;base64," + base64.b64encode(data).decode("ascii")
    safe = html.escape(name if name.endswith(".csv") else name + ".csv", quote=True)
    return (f"<a class='wb-csv' download='{safe}' href='{href}' title='download these {len(df):,} rows as CSV "
            f"(stored units: µs, bytes)' style='font-size:11px;margin-left:4px'>CSV</a>")


def table_html(df: pd.DataFrame | None, max_rows: int = 50, float_format: str = "{:,.1f}",
               css_class: str = "wb-table", formats: dict[str, str] | None = None, *, readable: bool = True,
               csv: str | None = "table.csv", csv_frame: pd.DataFrame | None = None) -> str:
    """A DataFrame as light HTML (escaped cells, right-aligned numbers, long names on one line cut with
    the full name on hover), with a CSV link of the rows (``csv``: its file name; None: no link).

    ``readable`` (default) shows snake_case columns as words with their unit and converts the values:
    ``*_us`` in ms, ``*_bytes`` in MiB, ``*_fraction`` in % (:func:`workbench.figures.text.readable_frame`);
    the CSV keeps the stored columns (``csv_frame``: other rows for it, e.g. the analysis rows behind a
    table formatted for display). ``formats`` maps a shown column to its own float format."""
    if df is None or df.empty:
        return "<div class='wb-table-empty' style='color:var(--jp-ui-font-color2,#666)'>(no rows)</div>"
    shown, fmts_by_col = df, {}
    if readable:
        from workbench.figures.text import readable_frame

        shown, fmts_by_col = readable_frame(df)
    fmts_by_col.update(formats or {})
    rows = shown.head(max_rows)
    head = "".join(f"<th style='padding:2px 8px;text-align:left;white-space:nowrap'>{html.escape(str(c))}</th>"
                   for c in rows.columns)
    fmts = [fmts_by_col.get(c, float_format) for c in rows.columns]
    body = []
    for rec in rows.itertuples(index=False):
        cells = []
        for v, fmt in zip(rec, fmts):
            if isinstance(v, float):
                text, align, title = ("" if pd.isna(v) else fmt.format(v)), "right", ""
            elif isinstance(v, (int,)) and not isinstance(v, bool):
                text, align, title = f"{v:,}", "right", ""
            else:
                s = "" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)
                text = s if len(s) <= _CUT else s[: _CUT - 1] + "…"
                align, title = "left", s if len(s) > _CUT else ""
            t = f" title='{html.escape(title, quote=True)}'" if title else ""
            cells.append(f"<td style='padding:2px 8px;text-align:{align};white-space:nowrap'{t}>"
                         f"{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f"<div style='color:var(--jp-ui-font-color2,#666)'>… {len(df) - max_rows:,} more rows</div>" if len(df) > max_rows else ""
    link = csv_link(df if csv_frame is None else csv_frame, csv) if csv else ""
    # a table wider than the cell scrolls sideways instead of being cut at the cell's edge (width 0 +
    # min-width 100%: the box takes its parent's width and never widens the parent to fit the table)
    return (f"<div class='wb-table-scroll' style='overflow-x:auto;width:0;min-width:100%'>"
            f"<table class='{css_class}' style='border-collapse:collapse;font-size:12px'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>{more}{link}")


def path_label(path) -> str:
    """HTML for a file in a status line: the file name, with the full path as a tooltip.

    Status lines end up in saved notebooks and screenshots; the name is what a reader needs, and the
    machine's directory layout is nobody else's business."""
    full = str(path)
    name = os.path.basename(full.rstrip("/")) or full
    return f"<span title='{html.escape(full, quote=True)}'>{html.escape(name)}</span>"


# ------------------------------------------------------------------ what a panel was given (io/kinds.py)


def panel_class(kind: str):
    """The panel class that shows ``kind`` (the registry's ``"module:Class"``, imported now), or None."""
    import importlib

    from workbench.io.kinds import KINDS

    k = KINDS.get(kind)
    if k is None or not k.panel:
        return None
    module, _, name = k.panel.partition(":")
    return getattr(importlib.import_module(module), name)


def classify(source, panel: str, takes: str) -> tuple[str, Path | None]:
    """``(kind, path)`` of what ``panel`` was given (:func:`workbench.io.kinds.kind_of`); ``path`` is None
    for objects. A path that does not exist, is a folder or is not a regular file raises before its
    content is looked at (a folder of traces names RanksPanel)."""
    from workbench.io import kinds

    if isinstance(source, (str, os.PathLike)):
        try:
            is_dir = Path(source).is_dir()
        except OSError:
            is_dir = False
        if is_dir and kinds.sniff_path(source) == "rank_folder":
            raise wrong_kind(source, "rank_folder", panel, takes)
        path = kinds.check_path(source, panel, takes)
        return kinds.sniff_file(path), path
    return kinds.kind_of(source), None


def _label(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    return f"this {type(source).__name__}"


def wrong_kind(source, kind: str, panel: str, takes: str) -> BadArtifact:
    """The error for ``panel`` given ``source`` of ``kind``, which it does not show: it names the panel
    or command that does (the registry's ``fits``)."""
    from workbench.io.kinds import KINDS, UNKNOWN, describe

    if kind == UNKNOWN:
        what = ("is not an artifact gpu-workbench recognises" if isinstance(source, (str, os.PathLike))
                else "is not something a panel shows")
        return BadArtifact(_label(source), what, f"{panel} takes {takes}")
    fits = KINDS[kind].fits if kind in KINDS else ""
    fix = f"Use {fits}" if fits else ""
    return BadArtifact(_label(source), f"is {describe(kind)}, not what {panel} shows ({takes})", fix)


class PanelBase(widgets.VBox):
    """VBox with ``status`` (HTML line) and ``errors`` (Output) widgets and a callback guard."""

    def __init__(self, children=(), **kwargs):
        self.status = widgets.HTML(value="")
        self.status.add_class("wb-status")
        self.errors = widgets.Output(layout=widgets.Layout(max_height="12em", overflow="auto"))
        self.errors.add_class("wb-errors")
        self.last_error: str | None = None
        super().__init__(children=list(children), **kwargs)
        self.add_class("wb-panel")

    @property
    def widget(self):
        """The displayable widget (the panel itself)."""
        return self

    def set_status(self, text: str, *, raw_html: bool = False) -> None:
        self.status.value = text if raw_html else f"<span style='color:var(--jp-ui-font-color2,#444)'>{html.escape(text)}</span>"

    def show_error(self, exc: BaseException | str) -> None:
        """Show one error in the error area (replacing the previous one)."""
        msg = exc if isinstance(exc, str) else error_text(exc)
        self.last_error = msg
        self.errors.outputs = ()
        self.errors.append_stderr(msg.rstrip("\n") + "\n")

    def clear_error(self) -> None:
        self.last_error = None
        self.errors.outputs = ()

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a callback: errors are shown in the panel instead of raised."""

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                out = fn(*args, **kwargs)
            except Exception as exc:  # a panel callback must never leave a traceback in the notebook
                self.show_error(exc)
                return None
            return out

        return wrapped
