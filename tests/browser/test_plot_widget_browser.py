"""PlotWidget in a real JupyterLab when anywidget's model watchdog fires (workbench/panels/_plot.py).

anywidget 0.11 gives each widget model 2 s from its creation to load its JavaScript module; a model that
misses it logs "[anywidget] Failed to initialize model." and drops every message the kernel sends it
afterwards, while its views are still created, from the model's first state. On a loaded 2-core machine the
page's main thread is held for seconds now and then (plotly.js being evaluated, a large figure drawn, other
kernels' output), and a model created just before such a moment misses the watchdog. The LiveGpuPanel of
notebooks/00_tour.ipynb then stayed blank in a full CI run: its figure's first state has no samples, every
sample came in a later update.

Here the page's main thread is held for 2.5 s right after each PlotWidget model is created (when anywidget
makes the module's Blob, after arming its watchdog), which makes the watchdog fire every time: the figures
must still show what the kernel sent after their first message, and keep following it.
"""

from __future__ import annotations

import time

import nbformat
import pytest
from browser_helpers import is_drawn

# Hold the main thread 2.5 s when anywidget makes the Blob of plot_widget.js (one per PlotWidget model, right
# after the model and its 2 s watchdog are created): a loaded machine, on purpose.
HOLD_AFTER_MODEL_JS = """() => {
  const Original = window.Blob;
  window.__wbHeld = 0;
  window.Blob = class extends Original {
    constructor(parts, options) {
      if (options && options.type === "text/javascript" && Array.isArray(parts)
          && parts.some((p) => typeof p === "string" && p.includes("wb-plot-area"))) {
        const t0 = performance.now();
        while (performance.now() - t0 < 2500) {}
        window.__wbHeld += 1;
      }
      super(parts, options);
    }
  };
}"""

CELLS = [
    # a figure whose first message is empty, its data in an update (most panels: PlotWidget(), then show)
    "import plotly.graph_objects as go\n"
    "from workbench.panels import PlotWidget\n"
    "fw = PlotWidget()\n"
    "fw.show(go.Figure(go.Scatter(y=[1, 3, 2]), layout={'title': {'text': 'shown after'}}))\n"
    "fw",
    # the tour's live panel: NVML missing here, so it replays the shipped session, every sample in an update
    "from workbench import LiveGpuPanel\n"
    "live = LiveGpuPanel(window_s=30)\n"
    "live",
]


@pytest.mark.browser
def test_figures_update_after_anywidget_dropped_the_model(lab_root, open_notebook):
    nb_file = lab_root / "notebooks" / "plot_widget_watchdog.ipynb"
    nb_file.parent.mkdir(parents=True, exist_ok=True)
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in CELLS])
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                   "language": "python"}
    nbformat.write(book, nb_file)

    nb = open_notebook("notebooks/plot_widget_watchdog.ipynb")
    try:
        nb.page.evaluate(HOLD_AFTER_MODEL_JS)
        nb.run_all(timeout_s=180)
        blank = []
        for index in range(len(CELLS)):
            try:
                nb.wait_widgets(index, min_plots=1, timeout_s=60)
            except AssertionError as exc:
                blank.append(str(exc))
        assert blank == [], "\n".join(blank + nb.console_errors[:6])
        for index in range(len(CELLS)):
            assert all(is_drawn(p) for p in nb.plots(index)), nb.plots(index)
        held = nb.page.evaluate("() => window.__wbHeld")
        assert held >= len(CELLS), f"the page was held for {held} PlotWidget models, not {len(CELLS)}"
        # the hold really made anywidget drop the models (else this test checks nothing)
        tripped = [e for e in nb.ignored_errors if "Failed to initialize model" in e]
        assert tripped, f"anywidget's watchdog never fired; console: {nb.console_errors[:5]}"
        assert nb.problems() == [], "\n".join(nb.problems())
        # the live figure keeps moving (more points while the 30 s window fills, then the window slides)
        moving = lambda: [(p["xrange"], p["points"]) for p in nb.plots(1)]  # noqa: E731
        first = moving()
        time.sleep(2.0)
        assert moving() != first, f"the live figure stopped moving: {first}"
    finally:
        nb.close()
