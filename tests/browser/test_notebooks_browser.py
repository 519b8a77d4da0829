"""Each guided notebook, run top to bottom in a real JupyterLab (headless Chromium) as a Binder user would:
no CUDA device, no network (cells tagged nbval-skip are blanked, as nbval skips them).

Checks: no error output, every code cell ran, every widget and plotly figure is drawn with data, no
"Error displaying widget", no browser console errors, no request leaving the machine. One PNG per cell with
widgets goes to build/screenshots/<notebook>_cell<N>.png.

Speed: most of a notebook's time is its kernel computing, on one core, while the browser mostly waits. So the
next notebook (in test order) is opened and started while this one is checked: two notebooks in flight at once
(``WB_BROWSER_IN_FLIGHT``, default 2; 1 runs them one by one). Each page is closed and its kernel shut down as
soon as its test ends, so finished notebooks (a live panel keeps redrawing) do not load the machine.
"""

from __future__ import annotations

import os
import time

import pytest
from browser_helpers import NOTEBOOKS, TIMINGS, LabNotebook, is_drawn, is_titled_empty

GUIDED = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))

# A guided notebook should finish well inside a minute on 2 cores (docs/architecture.md, "Speed targets"); allow for a cold kernel and
# for sharing the machine with the notebook in flight beside it.
RUN_TIMEOUT_S = 600
IN_FLIGHT = max(1, int(os.environ.get("WB_BROWSER_IN_FLIGHT", "2")))

WIDGET_CELLS_JS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))
    .map((c, i) => c.querySelector('.jupyter-widgets, .js-plotly-plot, .jp-RenderedPlotly') ? i : -1)
    .filter(i => i >= 0)"""


class GuidedRunner:
    """Opens guided notebooks and starts their Run All ahead of their test, ``IN_FLIGHT`` at a time."""

    def __init__(self, open_notebook, order: list[str]):
        self.open_notebook, self.order = open_notebook, order
        self.started: dict[str, LabNotebook] = {}

    def _start(self, name: str) -> None:
        if name not in self.started:
            nb = self.open_notebook(f"notebooks/{name}")
            nb.start_run_all()
            self.started[name] = nb

    def take(self, name: str) -> LabNotebook:
        """``name``'s page, its Run All started, and the next notebooks' started too."""
        self._start(name)
        if name in self.order:
            i = self.order.index(name)
            for following in self.order[i + 1 : i + IN_FLIGHT]:
                self._start(following)
        return self.started.pop(name)


@pytest.fixture(scope="module")
def guided(request, open_notebook) -> GuidedRunner:
    order = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "originalname", None) == "test_guided_notebook_in_the_browser"]
    return GuidedRunner(open_notebook, order)


@pytest.mark.browser
@pytest.mark.parametrize("name", GUIDED)
def test_guided_notebook_in_the_browser(guided, name):
    t0 = time.monotonic()
    nb = guided.take(name)
    try:
        check_guided_notebook(nb, name, t0)
    finally:
        nb.close()


def check_guided_notebook(nb: LabNotebook, name: str, t0: float) -> None:
    nb.wait_run_done(timeout_s=RUN_TIMEOUT_S)
    t_ran = time.monotonic()
    assert nb.error_outputs() == [], f"{name}: cells raised"
    assert nb.unrun_code_cells() == [], f"{name}: cells never ran"

    widget_cells = nb.page.evaluate(WIDGET_CELLS_JS)
    stem = name.removesuffix(".ipynb")
    shots = []
    for index in widget_cells:
        # every visible figure drawn, or empty with a title that says why (a diff of CPU traces has no kernels)
        nb.wait_widgets(index, min_plots=0, all_drawn=True)
        text = nb.text(index)
        assert "Error displaying widget" not in text, f"{name} cell {index}: {text[:500]}"
        for i, p in enumerate(nb.plots(index)):
            # an empty figure is fine when its title says why; a blank default one looks broken to a reader
            assert is_drawn(p) or is_titled_empty(p), f"{name} cell {index} plot {i} is blank: {p}"
        pause = nb.output(index).locator(".wb-live-pause button, button.wb-live-pause")
        if pause.count():
            # A live panel redraws several times a second for as long as the page is open, which on 2 cores
            # slowed every later check and picture several-fold: take its picture running, then pause it.
            # Not waited for: on a loaded machine the kernel took over 30 s to answer (the panels test checks
            # Pause itself).
            nb.screenshot(index, f"{stem}_cell{index}")
            pause.first.click()
        else:
            shots.append((index, f"{stem}_cell{index}"))
    t_checked = time.monotonic()
    if shots:
        nb.screenshots(shots)
    t_shot = time.monotonic()
    assert nb.problems() == [], "\n".join(nb.problems())
    t = nb.timings
    TIMINGS.append((name, {
        "open": t["opened"] - t["open_started"],
        "run": t["run_done"] - t["run_started"],  # Run All to idle, partly before this test began
        "waited": t["run_done"] - t0,  # how long this test waited for its kernel (and for opening the next)
        "save": t_ran - t["run_done"],
        "checks": t_checked - t_ran,
        "shots": t_shot - t_checked,
        "test": t_shot - t0,
    }))
