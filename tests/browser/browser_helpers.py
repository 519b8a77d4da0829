"""Helpers for the browser tests: a LabNotebook page wrapper, what plotly drew, screenshots.

Fixtures using them are in conftest.py beside this file.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

SCREENSHOTS = ROOT / "build" / "screenshots"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
PANELS_NOTEBOOK = HERE / "panels.ipynb"
NOTEBOOKS = ROOT / "notebooks"

# (notebook, {stage: seconds}) per notebook checked, printed at the end of the run by conftest.py.
TIMINGS: list[tuple[str, dict[str, float]]] = []

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    # Nothing but the local server resolves: a page that reaches for a CDN fails here and is recorded.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
VIEWPORT = {"width": 1280, "height": 1000}

# JupyterLab user settings for the test server: no news/update toast over the screenshots, and every cell
# kept in the DOM (windowing would detach off-screen cells and their plots).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}

# Console messages that are not failures. Each pattern is specific and says why it is harmless.
IGNORED_CONSOLE = [
    # anywidget 0.11 gives each widget model 2 s to load its module; on a loaded machine a model now and then
    # misses it and then drops every later message from the kernel. The workbench's anywidgets (PlotWidget,
    # PerfettoLink) get nothing from the kernel after their first message (what changes lives in a plain
    # ipywidgets model beside them), so a miss loses nothing; what it would lose is checked directly (every
    # figure drawn with data; tests/browser/test_plot_widget_browser.py makes the miss happen on purpose).
    # Kept in LabNotebook.ignored_errors.
    re.compile(r"^(Uncaught \(in promise\) )?(Error: )?\[anywidget\] Failed to initialize model\.$"),
]

# JS run on every `.js-plotly-plot` element: what plotly drew, for assertions and before/after comparisons.
PLOT_INFO_JS = """
els => els.map(gd => {
  const len = a => (a && typeof a.length === 'number') ? a.length : 0;
  const full = (gd._fullData || []).filter(t => t.visible === true);
  const texts = sel => Array.from(gd.querySelectorAll(sel)).map(e => e.textContent);
  const marks = gd.querySelectorAll(
    '.scatterlayer .trace, .barlayer .trace, .boxlayer .trace, .pielayer .trace, .funnellayer .trace,' +
    ' .heatmaplayer image, .heatmaplayer .hm, .contourlayer .trace, .table .trace, .sunburstlayer .trace,' +
    ' .treemaplayer .trace, .gl-container canvas, .imagelayer image').length;
  const box = gd.getBoundingClientRect();
  const xa = gd._fullLayout && gd._fullLayout.xaxis;
  return {
    visible: gd.offsetParent !== null && box.width > 0 && box.height > 0,
    xrange: xa && xa.range ? xa.range.map(Number) : null,
    title: texts('.gtitle').join(' | '),
    traces: full.length,
    points: full.reduce((n, t) => n + Math.max(t._length || 0, len(t.x), len(t.y), len(t.z), len(t.values),
                                                 len(t.cells && t.cells.values)), 0),
    marks: marks,
    width: Math.round(box.width), height: Math.round(box.height),
    xticks: texts('.xtick text'), yticks: texts('.ytick text'), legend: texts('.legendtext'),
    shapes: Array.from(gd.querySelectorAll('.trace path, .trace rect, .point path'))
                 .map(p => p.getAttribute('d') || '').join(';').length,
    names: full.map(t => String(t.type) + ':' + String(t.name || '') + ':' + String(t._length || 0)),
    webgl_missing: !!gd.querySelector('.gl-container') && /WebGL is not supported/.test(gd.textContent),
  };
})
"""


# The part of PLOT_INFO_JS that says whether a figure is drawn (is_drawn, is_titled_empty), for polling loops:
# it leaves out the ticks, legend and the path geometry, which cost seconds a call on a big figure when the
# machine is loaded.
PLOT_STATE_JS = """
els => els.map(gd => {
  const len = a => (a && typeof a.length === 'number') ? a.length : 0;
  const full = (gd._fullData || []).filter(t => t.visible === true);
  const box = gd.getBoundingClientRect();
  return {
    visible: gd.offsetParent !== null && box.width > 0 && box.height > 0,
    title: Array.from(gd.querySelectorAll('.gtitle')).map(e => e.textContent).join(' | '),
    traces: full.length,
    points: full.reduce((n, t) => n + Math.max(t._length || 0, len(t.x), len(t.y), len(t.z), len(t.values),
                                                 len(t.cells && t.cells.values)), 0),
    marks: gd.querySelectorAll(
      '.scatterlayer .trace, .barlayer .trace, .boxlayer .trace, .pielayer .trace, .funnellayer .trace,' +
      ' .heatmaplayer image, .heatmaplayer .hm, .contourlayer .trace, .table .trace, .sunburstlayer .trace,' +
      ' .treemaplayer .trace, .gl-container canvas, .imagelayer image').length,
  };
})
"""


def prepare_notebook(src: Path, dst: Path) -> None:
    """Copy a notebook for a browser run: outputs cleared, a python3 kernel, `nbval-skip` cells blanked."""
    import nbformat

    nb = nbformat.read(src, as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if "nbval-skip" in cell.get("metadata", {}).get("tags", []):
            cell.source = "# (not run in the browser test: tagged nbval-skip, e.g. it needs a GPU)"
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)


@dataclass
class LabNotebook:
    """One browser page on one notebook of the test server, with what went wrong on it."""

    page: object
    server: object
    root: Path
    path: str
    console_errors: list[str] = field(default_factory=list)
    ignored_errors: list[str] = field(default_factory=list)  # console and page errors IGNORED_CONSOLE matched
    external_requests: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # time.monotonic() of each stage, for the summary
    closed: bool = False

    # -- opening and running -------------------------------------------------------------------------
    def open(self, timeout_s: float = 90) -> LabNotebook:
        self.timings["open_started"] = time.monotonic()
        workspace = f"t{uuid.uuid4().hex[:8]}"  # a fresh workspace per page: no layout carried over
        self.page.goto(f"{self.server.url}lab/workspaces/{workspace}/tree/{self.path}?reset&token={self.server.token}")
        self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_kernel_idle(timeout_s)
        # Hide the file browser so the notebook (and its screenshots) get the width.
        if self.page.locator("#jp-left-stack").is_visible():
            self.page.keyboard.press("Control+b")
        self.timings["opened"] = time.monotonic()
        return self

    def wait_kernel_idle(self, timeout_s: float = 90) -> None:
        # The execution indicator says idle before the kernel connects; the status bar's "| Idle" does not.
        self.page.wait_for_function(
            "() => /\\|\\s*Idle/.test((document.querySelector('#jp-main-statusbar') || {}).innerText || '')",
            timeout=timeout_s * 1000,
        )

    def run_all(self, timeout_s: float = 240) -> None:
        """Menu Run > Run All Cells, then wait until no cell is queued or running and save the notebook."""
        self.start_run_all()
        self.wait_run_done(timeout_s)

    def start_run_all(self) -> None:
        """Menu Run > Run All Cells, without waiting: the kernel works while the test does something else."""
        self.page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        self.page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        self.timings["run_started"] = time.monotonic()

    def wait_run_done(self, timeout_s: float = 240) -> None:
        """Wait until no cell is queued or running (after ``start_run_all``), then save the notebook."""
        self.page.wait_for_function(
            """() => {
              const p = Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'))
                             .map(e => e.innerText);
              return p.length > 0 && !p.some(t => t.includes('*')) && p.some(t => /\\[\\d+\\]/.test(t));
            }""",
            timeout=timeout_s * 1000,
            polling=250,
        )
        self.wait_kernel_idle(30)
        self.timings["run_done"] = time.monotonic()
        self.save()

    def close(self) -> None:
        """Close the page and shut its kernel down (a closed tab alone leaves the kernel running)."""
        from jupyter_helpers import shutdown_sessions

        if self.closed:
            return
        self.closed = True
        try:
            self.page.close()
        finally:
            shutdown_sessions(self.server, self.path)

    def save(self, timeout_s: float = 30) -> None:
        file = self.root / self.path
        before = file.stat().st_mtime_ns
        self.page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})  # focus inside the app
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + timeout_s
        while file.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.path}: Ctrl+S did not save the notebook within {timeout_s} s")
            time.sleep(0.1)
        time.sleep(0.3)  # the contents API writes atomically, but give the rename a moment

    def error_outputs(self) -> list[str]:
        """'cell N: Name: value' for each error output in the saved notebook (run_all saves)."""
        import nbformat

        nb = nbformat.read(self.root / self.path, as_version=4)
        return [
            f"cell {i}: {o.get('ename')}: {o.get('evalue')}"
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.outputs if o.get("output_type") == "error"
        ]

    def unrun_code_cells(self) -> list[int]:
        import nbformat

        nb = nbformat.read(self.root / self.path, as_version=4)
        return [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and c.source.strip() and c.execution_count is None]

    # -- cells and widgets ---------------------------------------------------------------------------
    def cell(self, index: int):
        return self.page.locator(".jp-Notebook .jp-Cell").nth(index)

    def output(self, index: int):
        return self.cell(index).locator(".jp-Cell-outputArea")

    def wait_widgets(self, index: int, min_plots: int = 1, timeout_s: float = 180, settle_s: float = 1.0,
                     all_drawn: bool = False) -> None:
        """Wait until cell ``index`` shows ``min_plots`` visible plotly figures drawn with data (with
        ``all_drawn``, every visible figure is drawn or is an empty one whose title says why), and its DOM
        stops changing for ``settle_s``. A figure can be blank while plotly.js loads or its data is on the way,
        which is why blank ones are waited for rather than failed at once."""
        out = self.output(index)
        deadline = time.monotonic() + timeout_s
        last, stable_since = None, time.monotonic()
        while True:
            plots = self.plots(index, light=True)
            drawn = sum(is_drawn(p) for p in plots)
            ok = drawn >= min_plots and (not all_drawn or all(is_drawn(p) or is_titled_empty(p) for p in plots))
            state = (drawn, len(plots), out.locator(".jupyter-widgets, .js-plotly-plot .trace").count(),
                     out.locator(".widget-loading, .jupyter-widgets-loading").count())
            now = time.monotonic()
            if state != last:
                last, stable_since = state, now
            elif ok and state[3] == 0 and now - stable_since >= settle_s:
                return
            if now > deadline:
                raise AssertionError(
                    f"{self.path} cell {index}: widgets not drawn within {timeout_s} s (figures drawn with data: "
                    f"{drawn} of {len(plots)} visible, wanted {min_plots}); blank: "
                    f"{[p for p in plots if not is_drawn(p)][:2]}; output text: {out.inner_text()[:300]!r}"
                )
            time.sleep(0.25)

    def plots(self, index: int, visible_only: bool = True, light: bool = False) -> list[dict]:
        """What each plotly figure in cell ``index`` drew (those in hidden tabs left out unless asked); with
        ``light``, only what says whether it is drawn (PLOT_STATE_JS)."""
        plots = self.output(index).locator(".js-plotly-plot").evaluate_all(PLOT_STATE_JS if light else PLOT_INFO_JS)
        return [p for p in plots if p["visible"] or not visible_only]

    def text(self, index: int) -> str:
        return self.output(index).inner_text()

    def screenshot(self, index: int, name: str, docs: bool = False) -> Path:
        """PNG of cell ``index``'s output area into build/screenshots; with ``docs`` and
        WB_UPDATE_SCREENSHOTS=1 also into docs/screenshots (the README's pictures)."""
        return self.screenshots([(index, name)], docs=docs)[0]

    def screenshots(self, shots: list[tuple[int, str]], docs: bool = False) -> list[Path]:
        """``screenshot`` for several (cell index, name) pairs in one pass: the window is resized at most once."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        # JupyterLab scrolls inside its notebook panel, not the page: an output taller than the panel would be
        # cut and framed by menus. Grow the window until the tallest output fits, then put it back. Each resize
        # makes every figure in the notebook lay itself out again, hence one for all the pictures.
        size = self.page.viewport_size
        height = max(self.output(i).evaluate("e => e.getBoundingClientRect().height") for i, _ in shots)
        if height + 260 > size["height"]:
            self.page.set_viewport_size({"width": size["width"], "height": min(int(height) + 300, 8000)})
            self.page.wait_for_timeout(300)  # let the layout settle
        targets = []
        try:
            for index, name in shots:
                target = SCREENSHOTS / f"{name}.png"
                out = self.output(index)
                out.evaluate("e => e.scrollIntoView({block: 'start'})")
                self.page.mouse.move(0, 0)  # no hover label in the picture
                out.screenshot(path=str(target), animations="disabled")
                if docs and os.environ.get("WB_UPDATE_SCREENSHOTS") == "1":
                    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(target, DOCS_SCREENSHOTS / target.name)
                targets.append(target)
        finally:
            if self.page.viewport_size != size:
                self.page.set_viewport_size(size)
        return targets

    # -- what went wrong -----------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Console errors, uncaught page errors and requests that tried to leave the machine."""
        return [*self.console_errors, *(f"external request: {u}" for u in self.external_requests)]


def watch(nb: LabNotebook) -> None:
    page, base = nb.page, nb.server.url

    def on_console(msg):
        if msg.type != "error":
            return
        if any(p.search(msg.text) for p in IGNORED_CONSOLE):
            nb.ignored_errors.append(f"console error: {msg.text[:500]}")
            return
        loc = msg.location or {}
        nb.console_errors.append(f"console error: {msg.text[:500]} ({loc.get('url', '')}:{loc.get('lineNumber', '')})")

    def on_page_error(exc):
        text = str(exc)
        if any(p.search(text) for p in IGNORED_CONSOLE):
            nb.ignored_errors.append(f"page error: {text[:500]}")
        else:
            nb.console_errors.append(f"page error: {text}")

    def on_request(req):
        if not req.url.startswith((base, "blob:", "data:", "about:")):
            nb.external_requests.append(req.url)

    page.on("console", on_console)
    page.on("pageerror", on_page_error)
    page.on("request", on_request)


def is_drawn(p: dict) -> bool:
    """A plotly figure that holds data and drew marks for it."""
    return p["traces"] > 0 and p["points"] > 0 and p["marks"] > 0


def is_titled_empty(p: dict) -> bool:
    """An empty figure whose title explains it (e.g. "no kernels in either trace"), not a blank default one."""
    return p["traces"] == 0 and bool(p["title"].strip())


def plot_signature(plots: list[dict]) -> list:
    """What a figure shows, minus pixel sizes: titles, ticks, legend, trace names/lengths and mark geometry."""
    return [(p["title"], p["xticks"], p["yticks"], p["legend"], p["names"], p["shapes"]) for p in plots]


_WS = re.compile(r"\s+")


def squash(text: str) -> str:
    return _WS.sub(" ", text).strip()


def check_card(card, *, min_bars: int = 1, clipboard=None) -> dict:
    """A findings card (figures.text: the diagnosis or the OOM advice) as a reader sees it: one headline,
    bars drawn with a width and sorted by their saving (``data-saved``, largest first), one line of code
    to copy, the evidence folded. Clicks the copy button; ``clipboard``: a callable returning the page's
    clipboard text (the page granted clipboard access), which must then be the code. Returns
    ``{"headline", "saved", "code"}``."""
    card.wait_for(timeout=30_000)
    assert card.locator(".wb-card-headline").count() == 1, "a card has one headline"
    headline = card.locator(".wb-card-headline").inner_text()
    rows = card.locator(".wb-bar-row")
    saved = rows.evaluate_all("rs => rs.map(r => parseFloat(r.dataset.saved))")
    assert len(saved) >= min_bars, f"{len(saved)} bars under {headline!r}"
    assert saved == sorted(saved, reverse=True), f"bars not sorted by saving: {saved}"
    widths = card.locator(".wb-bar-track > div:first-child").evaluate_all(
        "ds => ds.map(d => d.getBoundingClientRect().width)")
    assert widths and all(w > 0 for w in widths), f"bars drawn without a width: {widths}"
    assert widths[0] == max(widths) or "wb-advice-card" in (card.get_attribute("class") or ""), widths
    code = card.locator(".wb-fix-code").first.inner_text().strip()
    assert code, "no fix code in the card"
    details = card.locator("details.wb-card-evidence").first
    assert details.evaluate("d => d.open") is False, "the evidence should start folded"
    button = card.locator(".wb-copy").first
    button.click()
    deadline = time.monotonic() + 10
    while button.inner_text() == "copy":
        assert time.monotonic() < deadline, "the copy button did nothing"
        time.sleep(0.1)
    assert button.inner_text() in ("copied", "selected: Ctrl-C"), button.inner_text()
    if clipboard is not None:
        assert button.inner_text() == "copied"
        assert clipboard() == code, (clipboard(), code)
    return {"headline": headline, "saved": saved, "code": code}
