"""Every panel in a real JupyterLab (headless Chromium): drawn with data, controls present, no widget or
console errors, a control changes the figure; one PNG per panel in build/screenshots.

The panels are built by tests/browser/panels.ipynb (written by make_panels_notebook.py), one per cell tagged
`panel:<key>`; PANELS below says what each one must show and how to interact with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import nbformat
import pytest
from browser_helpers import PANELS_NOTEBOOK, LabNotebook, plot_signature
from make_panels_notebook import PANEL_CELLS


# -- interactions: change one control through the DOM, as a user would -------------------------------------
def choose_other_option(selector: str) -> Callable[[LabNotebook, int], None]:
    """Pick, in the dropdown matched by ``selector`` (inside the cell output), an option other than the current."""

    def interact(nb: LabNotebook, index: int) -> None:
        select = nb.output(index).locator(f"{selector} select").first
        current = select.input_value()
        options = [o for o in select.locator("option").evaluate_all("os => os.map(o => o.value)") if o != current]
        assert options, f"{selector}: the dropdown offers nothing but {current!r}"
        select.select_option(options[-1])

    return interact


def type_value(selector: str, value: str) -> Callable[[LabNotebook, int], None]:
    """Type ``value`` into the text/number field matched by ``selector`` and press Enter."""

    def interact(nb: LabNotebook, index: int) -> None:
        field = nb.output(index).locator(f"{selector} input").first
        field.fill(value)
        field.press("Enter")

    return interact


def press_on_slider(selector: str, key: str = "ArrowRight", times: int = 3) -> Callable[[LabNotebook, int], None]:
    """Move the slider matched by ``selector`` with the keyboard (focus its handle, press ``key``)."""

    def interact(nb: LabNotebook, index: int) -> None:
        handle = nb.output(index).locator(f"{selector} .noUi-handle").first
        handle.focus()
        for _ in range(times):
            handle.press(key)

    return interact


def _signature_after(nb: LabNotebook, index: int, wait_s: float) -> list:
    time.sleep(wait_s)
    return plot_signature(nb.plots(index))


def live_moves_pauses_and_windows(nb: LabNotebook, index: int) -> None:
    """The live plot moves on its own; Pause freezes it; a 5 s window narrows the x axis to 5 s."""
    out = nb.output(index)
    first = plot_signature(nb.plots(index))
    assert _signature_after(nb, index, 1.5) != first, "the live plot did not move in 1.5 s"
    out.locator(".wb-live-pause button, button.wb-live-pause").first.click()
    out.locator(".wb-live-status:has-text('paused')").wait_for(timeout=10_000)
    frozen = _signature_after(nb, index, 0.5)
    assert _signature_after(nb, index, 1.5) == frozen, "the live plot kept moving while paused"
    type_value(".wb-live-window", "5")(nb, index)
    deadline = time.monotonic() + 10
    while True:
        spans = [p["xrange"][1] - p["xrange"][0] for p in nb.plots(index) if p["xrange"]]
        if spans and max(spans) <= 5.01:
            break
        assert time.monotonic() < deadline, f"x range after a 5 s window: {spans}"
        time.sleep(0.2)


def live_replay_reaches(t_s: float) -> Callable[[LabNotebook, int], None]:
    """Wait until the replay's clock (status line "t = X s") reaches ``t_s``: the shipped session's GPU
    goes busy at about 9 s, so the screenshot shows training rather than an idle GPU."""

    def ready(nb: LabNotebook, index: int) -> None:
        deadline = time.monotonic() + t_s + 15
        while True:
            m = re.search(r"t = ([\d.]+) s", nb.output(index).locator(".wb-live-status").inner_text())
            if m and float(m.group(1)) >= t_s:
                return
            assert time.monotonic() < deadline, f"replay clock stuck at {m and m.group(1)} s"
            time.sleep(0.25)

    return ready


@dataclass(frozen=True)
class PanelSpec:
    controls: tuple[str, ...]  # CSS selectors that must match inside the panel's output
    interact: Callable[[LabNotebook, int], None]
    min_plots: int = 1
    ready: Callable[[LabNotebook, int], None] | None = None  # waited for before the screenshot
    docs: bool = True  # copy its screenshot to docs/screenshots with WB_UPDATE_SCREENSHOTS=1


PANELS: dict[str, PanelSpec] = {
    # The widget stack itself (ipywidgets + plotly FigureWidget via anywidget), not a workbench panel.
    "stack": PanelSpec(controls=(".wb-stack-metric",), interact=choose_other_option(".wb-stack-metric"), docs=False),
    "live": PanelSpec(
        controls=(".wb-live-window", ".wb-live-pause", ".wb-live-gpus", ".wb-live-mark", ".wb-live-export",
                  ".wb-live-status", ".wb-live-figure"),
        interact=live_moves_pauses_and_windows,
        ready=live_replay_reaches(20.0),
    ),
}


def _cell_index(key: str) -> int:
    nb = nbformat.read(PANELS_NOTEBOOK, as_version=4)
    hits = [i for i, c in enumerate(nb.cells) if f"panel:{key}" in c.get("metadata", {}).get("tags", [])]
    assert len(hits) == 1, f"panels.ipynb: {len(hits)} cells tagged panel:{key} (want 1)"
    return hits[0]


def test_every_panel_is_in_the_browser_notebook():
    """A panel exported by workbench.panels must be built in panels.ipynb and described in PANELS."""
    from workbench import panels

    exported = [n for n in panels.__all__ if n.endswith("Panel")]
    missing = [n for n in exported if not any(n in src for src in PANEL_CELLS.values())]
    assert not missing, f"add these to tests/browser/make_panels_notebook.py PANEL_CELLS: {missing}"
    assert set(PANEL_CELLS) == set(PANELS), "every cell in PANEL_CELLS needs a PanelSpec in PANELS and back"
    written = nbformat.read(PANELS_NOTEBOOK, as_version=4)
    from make_panels_notebook import build

    assert [c.source for c in written.cells] == [c.source for c in build().cells], (
        "panels.ipynb is stale: run .venv/bin/python tests/browser/make_panels_notebook.py"
    )


@pytest.fixture(scope="module")
def panels_page(open_notebook) -> LabNotebook:
    nb = open_notebook(PANELS_NOTEBOOK.name)
    nb.run_all(timeout_s=300)
    return nb


@pytest.mark.browser
def test_panels_notebook_runs_without_errors(panels_page):
    assert panels_page.error_outputs() == []
    assert panels_page.unrun_code_cells() == []


@pytest.mark.browser
@pytest.mark.parametrize("key", list(PANELS))
def test_panel_draws_and_reacts(panels_page, key):
    nb, spec, index = panels_page, PANELS[key], _cell_index(key)
    nb.wait_widgets(index, min_plots=spec.min_plots)
    text = nb.text(index)
    assert "Error displaying widget" not in text and "Traceback" not in text, text[:1000]

    plots = nb.plots(index)
    assert len(plots) >= spec.min_plots
    for i, p in enumerate(plots):
        assert not p["webgl_missing"], f"plot {i}: plotly says WebGL is not supported"
        assert p["traces"] > 0 and p["points"] > 0, f"plot {i} ({p['title']!r}) has no data: {p}"
        assert p["marks"] > 0, f"plot {i} ({p['title']!r}) drew no marks: {p}"
        assert p["width"] > 150 and p["height"] > 100, f"plot {i} ({p['title']!r}) is squashed: {p}"
    for selector in spec.controls:
        assert nb.output(index).locator(selector).count() > 0, f"control {selector} missing from the {key} panel"

    if spec.ready is not None:
        spec.ready(nb, index)
    nb.screenshot(index, f"panel_{key}", docs=spec.docs)

    before = plot_signature(plots)
    spec.interact(nb, index)
    deadline = time.monotonic() + 15
    while plot_signature(nb.plots(index)) == before:
        assert time.monotonic() < deadline, f"the {key} panel's figures did not change after the interaction"
        time.sleep(0.2)
    nb.wait_widgets(index, min_plots=spec.min_plots)
    after = nb.plots(index)
    assert all(p["traces"] > 0 and p["marks"] > 0 for p in after), f"a figure emptied after the interaction: {after}"
    assert "Error displaying widget" not in nb.text(index)
    assert nb.problems() == [], "\n".join(nb.problems())
