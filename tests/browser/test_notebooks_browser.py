"""Each guided notebook, run top to bottom in a real JupyterLab (headless Chromium) as a Binder user would:
no CUDA device, no network (cells tagged nbval-skip are blanked, as nbval skips them).

Checks: no error output, every code cell ran, every widget and plotly figure is drawn with data, no
"Error displaying widget", no browser console errors, no request leaving the machine. One PNG per cell with
widgets goes to build/screenshots/<notebook>_cell<N>.png.
"""

from __future__ import annotations

import pytest
from browser_helpers import NOTEBOOKS, is_drawn, is_titled_empty

GUIDED = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))

# A guided notebook should finish well inside a minute on 2 cores (DESIGN.md); allow for a cold kernel.
RUN_TIMEOUT_S = 600


@pytest.mark.browser
@pytest.mark.parametrize("name", GUIDED)
def test_guided_notebook_in_the_browser(open_notebook, name):
    nb = open_notebook(f"notebooks/{name}")
    nb.run_all(timeout_s=RUN_TIMEOUT_S)
    assert nb.error_outputs() == [], f"{name}: cells raised"
    assert nb.unrun_code_cells() == [], f"{name}: cells never ran"

    widget_cells = nb.page.evaluate(
        """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell'))
                    .map((c, i) => c.querySelector('.jupyter-widgets, .js-plotly-plot, .jp-RenderedPlotly') ? i : -1)
                    .filter(i => i >= 0)"""
    )
    stem = name.removesuffix(".ipynb")
    for index in widget_cells:
        # every visible figure drawn, or empty with a title that says why (a diff of CPU traces has no kernels)
        nb.wait_widgets(index, min_plots=0, all_drawn=True)
        text = nb.text(index)
        assert "Error displaying widget" not in text, f"{name} cell {index}: {text[:500]}"
        for i, p in enumerate(nb.plots(index)):
            # an empty figure is fine when its title says why; a blank default one looks broken to a reader
            assert is_drawn(p) or is_titled_empty(p), f"{name} cell {index} plot {i} is blank: {p}"
        nb.screenshot(index, f"{stem}_cell{index}")
    assert nb.problems() == [], "\n".join(nb.problems())
