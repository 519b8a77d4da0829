"""Figures in a real JupyterLab: the panels' PlotWidget against plotly's own go.FigureWidget (the peer).

A notebook of N cells, each showing one plotly figure (a 2,000-point line and a bar trace), is run with
Run All in JupyterLab, driven by Playwright in Debian's Chromium (headless). For each widget kind, in the
same run and on the same server: seconds from Run All until every figure is drawn with data, the
browser's JS heap afterwards, the bytes the kernel sent over the websocket (comm messages), and how many
figures were still blank after a wait.

    python benchmarks/bench_figure_widgets.py --figures 20 --rounds 2 [--json out.json]

Needs the test environment (jupyterlab, playwright, /usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import nbformat  # noqa: E402
from browser_helpers import CHROMIUM, CHROMIUM_ARGS, LAB_SETTINGS, VIEWPORT, LabNotebook  # noqa: E402
from jupyter_helpers import running_jupyter_lab, shutdown_sessions  # noqa: E402

SETUP = """
import numpy as np
import plotly.graph_objects as go
from workbench.panels import PlotWidget

rng = np.random.default_rng(0)

def fig(i):
    return go.Figure([go.Scatter(x=np.arange(2000.0), y=rng.random(2000), name=f"line {i}"),
                      go.Bar(x=list("abc"), y=[1, 2, i])], layout={"title": {"text": f"figure {i}"}, "height": 300})
"""
CELL = {"plotly FigureWidget": "go.FigureWidget(fig({i}))", "workbench PlotWidget": "PlotWidget(fig({i}))"}

COUNT_JS = """els => els.filter(gd => (gd._fullData || []).some(t => t.visible === true && (t._length || 0) > 0)
                                 && gd.querySelector('.scatterlayer .trace')).length"""


def notebook(kind: str, n: int) -> nbformat.NotebookNode:
    cells = [nbformat.v4.new_code_cell(SETUP)] + [nbformat.v4.new_code_cell(CELL[kind].format(i=i)) for i in range(n)]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def one(context, server, root: Path, kind: str, n: int, timeout_s: float) -> dict:
    name = f"bench_{kind.split()[0]}_{int(time.time() * 1000)}.ipynb"
    nbformat.write(notebook(kind, n), root / name)
    page = context.new_page()
    ws_bytes = [0]

    def on_ws(ws):
        if "/channels" in ws.url:
            ws.on("framereceived", lambda payload: ws_bytes.__setitem__(0, ws_bytes[0] + len(payload)))

    page.on("websocket", on_ws)
    lab = LabNotebook(page=page, server=server, root=root, path=name)
    try:
        lab.open()
        lab.start_run_all()
        t0 = time.monotonic()
        drawn, deadline = 0, t0 + timeout_s
        while time.monotonic() < deadline:
            drawn = page.locator(".jp-Notebook .js-plotly-plot").evaluate_all(COUNT_JS)
            if drawn >= n:
                break
            time.sleep(0.1)
        seconds = time.monotonic() - t0
        heap = page.evaluate("() => performance.memory ? performance.memory.usedJSHeapSize : null")
        return {"kind": kind, "figures": n, "all_drawn_s": round(seconds, 2) if drawn >= n else None,
                "drawn": drawn, "js_heap_mb": round(heap / 2**20, 1) if heap else None,
                "ws_received_mb": round(ws_bytes[0] / 2**20, 2)}
    finally:
        page.close()
        shutdown_sessions(server, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--figures", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    root, settings = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    for rel, value in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    rows = []
    with running_jupyter_lab(root, settings_dir=settings, timeout=90) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=CHROMIUM_ARGS + ["--enable-precise-memory-info"])
        try:
            for r in range(args.rounds):
                for kind in (CELL if r % 2 == 0 else reversed(list(CELL))):  # alternate who goes first
                    context = browser.new_context(viewport=VIEWPORT)  # fresh page state per measurement
                    try:
                        row = one(context, server, root, kind, args.figures, args.timeout)
                    finally:
                        context.close()
                    row["round"] = r
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            browser.close()
    print(f"\n{args.figures} figures, {args.rounds} rounds, {platform.node()} ({platform.processor() or platform.machine()})")
    print(f"{'widget':24}{'all drawn (s, median)':>24}{'JS heap MB':>12}{'websocket MB':>14}{'blank':>7}")
    for kind in CELL:
        rs = [r for r in rows if r["kind"] == kind]
        times = [r["all_drawn_s"] for r in rs if r["all_drawn_s"] is not None]
        med = f"{statistics.median(times):.1f}" if times else "never"
        heap = statistics.median([r["js_heap_mb"] for r in rs if r["js_heap_mb"]] or [float("nan")])
        wsmb = statistics.median([r["ws_received_mb"] for r in rs])
        blank = sum(args.figures - r["drawn"] for r in rs)
        print(f"{kind:24}{med:>24}{heap:>12.1f}{wsmb:>14.2f}{blank:>7}")
    if args.json:
        args.json.write_text(json.dumps({"figures": args.figures, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
