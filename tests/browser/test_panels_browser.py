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
from browser_helpers import PANELS_NOTEBOOK, TIMINGS, LabNotebook, check_card, plot_signature
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
    wait_changed(nb, index, plot_signature(nb.plots(index)), "10 s of replay (the live plot never moved)", timeout_s=10)
    out.locator(".wb-live-pause button, button.wb-live-pause").first.click()
    # generous: on a loaded 2-core machine the browser is busy drawing the live plot (see the report)
    out.locator(".wb-live-status:has-text('paused')").wait_for(timeout=30_000)
    frozen = _signature_after(nb, index, 0.5)
    assert _signature_after(nb, index, 1.5) == frozen, "the live plot kept moving while paused"
    type_value(".wb-live-window", "5")(nb, index)
    deadline = time.monotonic() + 10
    while True:
        spans = [p["xrange"][1] - p["xrange"][0] for p in nb.plots(index) if p["xrange"]]
        if spans and max(spans) <= 5.01:
            break  # left paused: a paused panel stops redrawing
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


def wait_changed(nb: LabNotebook, index: int, before: list, what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while plot_signature(nb.plots(index)) == before:
        assert time.monotonic() < deadline, f"the figure did not change after {what}"
        time.sleep(0.2)


def assert_drawn(plots: list[dict], where: str) -> None:
    assert plots, f"{where}: no visible figure"
    for i, p in enumerate(plots):
        assert not p["webgl_missing"], f"{where} plot {i}: plotly says WebGL is not supported"
        assert p["traces"] > 0 and p["points"] > 0, f"{where} plot {i} ({p['title']!r}) has no data: {p}"
        assert p["marks"] > 0, f"{where} plot {i} ({p['title']!r}) drew no marks: {p}"
        assert p["width"] > 150 and p["height"] > 100, f"{where} plot {i} ({p['title']!r}) is squashed: {p}"


def profiler_slider_step_and_tabs(nb: LabNotebook, index: int) -> None:
    """Top N by keyboard shows fewer kernels; another step changes the totals; every tab draws its figure."""
    out = nb.output(index)
    # the diagnosis comes first in the findings, with what the fix saves (the shipped H200 step: the
    # profiler's own overhead, not input)
    diag = out.locator(".wb-profiler-findings .wb-diagnosis").first
    diag.wait_for(timeout=15_000)
    assert "profiler" in diag.inner_text(), diag.inner_text()
    text = out.locator(".wb-profiler-findings").first.inner_text()
    assert text.index("Diagnosis") < text.index("profiler_overhead") and "saves" in text, text[:400]
    assert "input_bound" not in text
    # the diagnosis is a card: one headline, bars from the step now to each fix by saving, a line to copy
    card = check_card(out.locator(".wb-profiler-findings .wb-diagnosis-card").first, min_bars=2)
    assert card["code"].startswith('profile_steps(step, detail="light")'), card
    numbers = out.locator(".wb-diagnosis-card .wb-card-numbers").inner_text()
    assert numbers.count(" ms") == numbers.count(" ms a step") == 3, numbers  # every number says "a step"
    header = out.locator(".wb-status").first.inner_text()
    assert "ms window: GPU busy" in header and "a step: GPU busy" in header, header  # window vs a step
    # each finding: its fix as a line of code; the rest of its message folded until opened
    fp32 = out.locator(".wb-profiler-findings .wb-finding", has_text="fp32_matmul").first
    assert "allow_tf32 = True" in fp32.locator(".wb-fix-code").inner_text()
    more = fp32.locator("details.wb-finding-details")
    assert not more.locator(".wb-evidence").is_visible()
    more.locator("summary").click()
    more.locator(".wb-evidence").wait_for(state="visible", timeout=5_000)
    more.locator("summary").click()  # folded again for the screenshots
    bars = len(nb.plots(index)[0]["yticks"])
    before = plot_signature(nb.plots(index))
    press_on_slider(".wb-profiler-topn", "ArrowLeft", times=5)(nb, index)
    wait_changed(nb, index, before, "Top N - 5")
    after = len(nb.plots(index)[0]["yticks"])
    assert after < bars, f"Top N lowered by 5 but the kernel bars went {bars} -> {after}"

    before = plot_signature(nb.plots(index))
    choose_other_option(".wb-profiler-step")(nb, index)
    wait_changed(nb, index, before, "choosing another step")
    out.locator(".wb-status:has-text('scope: ProfilerStep#')").wait_for(timeout=15_000)  # the header follows

    visit_tabs(nb, index, ".wb-profiler-tabs", "profiler", docs={"timeline", "idle_gaps"}, at_least=6)
    zoom_timeline_with_the_mouse(nb, index)


def zoom_timeline_with_the_mouse(nb: LabNotebook, index: int) -> None:
    """A box zoom dragged on the timeline reaches Python (PlotWidget.on_relayout) and the panel redraws the
    events inside the new window (its title changes); a double-click goes back to the whole step."""
    out = nb.output(index)
    out.locator(".wb-profiler-tabs .lm-TabBar-tab", has_text="Timeline").first.click()
    nb.wait_widgets(index, min_plots=1)
    plot = out.locator(".wb-profiler-fig-timeline .js-plotly-plot")
    title = plot.locator(".gtitle")
    whole = title.text_content()
    # on screen first: the mouse reaches only what the viewport shows (the findings above may push it down)
    plot.locator(".draglayer .nsewdrag").first.scroll_into_view_if_needed()
    box = plot.locator(".draglayer .nsewdrag").first.bounding_box()
    y = box["y"] + box["height"] / 2
    x0, x1 = box["x"] + box["width"] * 0.40, box["x"] + box["width"] * 0.46
    mouse = nb.page.mouse
    mouse.move(x0, y)
    mouse.down()
    mouse.move((x0 + x1) / 2, y, steps=4)
    mouse.move(x1, y, steps=4)
    mouse.up()
    deadline = time.monotonic() + 30
    while title.text_content() == whole:
        assert time.monotonic() < deadline, f"zooming the timeline did not redraw it (title still {whole!r})"
        time.sleep(0.2)
    nb.wait_widgets(index, min_plots=1)
    assert_drawn(nb.plots(index), "the profiler timeline after a zoom")
    plot.locator(".draglayer .nsewdrag").first.dblclick(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    deadline = time.monotonic() + 30
    while title.text_content() != whole:
        assert time.monotonic() < deadline, f"a double-click did not bring the whole timeline back: {title.text_content()!r}"
        time.sleep(0.2)


def visit_tabs(nb: LabNotebook, index: int, tabs_selector: str, name: str, docs=frozenset(), at_least=2):
    """Click every tab of the panel; each must show a figure drawn with data. One screenshot per tab."""
    tabs = nb.output(index).locator(f"{tabs_selector} .lm-TabBar-tab")
    titles = [t.strip() for t in tabs.all_inner_texts()]
    assert len(titles) >= at_least, f"{name}: tabs {titles}"
    for i, title in enumerate(titles):
        tabs.nth(i).click()
        nb.wait_widgets(index, min_plots=1)
        assert_drawn(nb.plots(index), f"{name} tab {title!r}")
        text = nb.text(index)
        assert "Traceback" not in text and "Error displaying widget" not in text, text[:1000]
        slug = re.sub(r"\W+", "_", title.lower()).strip("_")
        nb.screenshot(index, f"panel_{name}_{slug}", docs=slug in docs)


def memory_groupby_and_tabs(nb: LabNotebook, index: int) -> None:
    """Stacking by function instead of category redraws the timeline; every tab draws."""
    before = plot_signature(nb.plots(index))
    nb.output(index).locator(".wb-memory-groupby select").select_option("function")
    wait_changed(nb, index, before, "stack by function")
    visit_tabs(nb, index, ".wb-memory-tabs", "memory")


def memory_oom_tabs(nb: LabNotebook, index: int) -> None:
    """The OOM snapshot opens on its OOM tab, which names the cause, under its findings; the other tabs
    draw too."""
    out = nb.output(index)
    oom = out.locator(".wb-memory-oom").inner_text()
    assert "capacity" in oom or "fragmentation" in oom, oom[:500]
    findings = out.locator(".wb-memory-findings").inner_text()
    assert "oom_capacity" in findings, findings[:500]  # the memory findings, above the tabs
    # the advice is a card: the peak vs the cap with each fix, largest saving first, the fix that fits to copy
    card = check_card(out.locator(".wb-memory-oom .wb-advice-card").first, min_bars=3)
    assert card["headline"].startswith("Out of memory"), card
    assert out.locator(".wb-memory-oom .wb-bar-cap").count() >= 4  # the cap drawn on the bars
    visit_tabs(nb, index, ".wb-memory-tabs", "memory_oom", at_least=3)  # OOM tab = panel_memory_oom.png
    out.locator(".wb-memory-tabs .lm-TabBar-tab").first.click()  # back to the timeline
    nb.wait_widgets(index, min_plots=1)
    before = plot_signature(nb.plots(index))
    out.locator(".wb-memory-groupby select").select_option("function")
    wait_changed(nb, index, before, "stack by function")


def estimate_precision_and_budget(nb: LabNotebook, index: int) -> None:
    """bf16 lowers the estimated peak; a 0.1 GiB budget turns the verdict to "does not fit"."""
    out = nb.output(index)
    summary = out.locator(".wb-estimate-summary")
    peak = _gib_after("peak allocated", summary.inner_text())
    before = plot_signature(nb.plots(index))
    out.locator(".wb-estimate-precision select").select_option("bf16")
    wait_changed(nb, index, before, "precision bf16", timeout_s=60)
    deadline = time.monotonic() + 60
    while _gib_after("peak allocated", summary.inner_text()) == peak:
        assert time.monotonic() < deadline, "the estimate summary did not follow the precision change"
        time.sleep(0.2)
    assert _gib_after("peak allocated", summary.inner_text()) < peak
    type_value(".wb-estimate-budget", "0.1")(nb, index)
    out.locator(".wb-estimate-summary:has-text('does not fit')").wait_for(timeout=60_000)


def _gib_after(label: str, text: str) -> float:
    m = re.search(label + r"\s+([\d.,]+)\s*GiB", text)
    assert m, f"no '{label} ... GiB' in {text[:300]!r}"
    return float(m.group(1).replace(",", ""))


def compare_swap(nb: LabNotebook, index: int) -> None:
    """Swapping base and test flips the diff."""
    out = nb.output(index)
    base, test = out.locator(".wb-compare-base select"), out.locator(".wb-compare-test select")
    b, t = base.input_value(), test.input_value()
    assert b != t, (b, t)
    summary = out.locator(".wb-compare-diff-summary").inner_text()
    base.select_option(t)
    test.select_option(b)
    deadline = time.monotonic() + 20
    while out.locator(".wb-compare-diff-summary").inner_text() == summary:
        assert time.monotonic() < deadline, "the diff summary did not change after swapping base and test"
        time.sleep(0.2)


def ranks_sort_and_tabs(nb: LabNotebook, index: int) -> None:
    """The verdict names the straggler; sorting the ranks redraws the bars; every tab draws."""
    out = nb.output(index)
    verdict = out.locator(".wb-ranks-verdict").inner_text()
    assert "straggler: rank 2" in verdict, verdict[:500]
    before = plot_signature(nb.plots(index))
    choose_other_option(".wb-ranks-sort")(nb, index)
    wait_changed(nb, index, before, "sorting the ranks")
    visit_tabs(nb, index, ".wb-ranks-tabs", "ranks", at_least=3)
_X_RANGES_JS = ("gd => Object.keys(gd._fullLayout).filter(k => /^xaxis\\d*$/.test(k)).sort()"
                ".map(k => gd._fullLayout[k].range.map(Number))")


def timeline_drag_zoom(nb: LabNotebook, index: int) -> None:
    """Drag across the bottom row of the one-clock figure (a zoom on x, as a user does it with the mouse):
    every row follows (they share x) and the kernel redraws the figure for the window."""
    fig = nb.output(index).locator(".wb-timeline-figure .js-plotly-plot").first
    before = fig.evaluate(_X_RANGES_JS)
    drags = fig.locator(".nsewdrag")
    assert drags.count() >= 2, "the timeline figure has fewer than two rows"
    bottom = drags.nth(drags.count() - 1)
    bottom.scroll_into_view_if_needed()
    box = bottom.bounding_box()
    y = box["y"] + box["height"] / 2
    nb.page.mouse.move(box["x"] + 0.15 * box["width"], y)
    nb.page.mouse.down()
    nb.page.mouse.move(box["x"] + 0.30 * box["width"], y + 2, steps=8)
    nb.page.mouse.up()
    deadline = time.monotonic() + 30
    while True:  # every row's x range is the zoomed one
        ranges = fig.evaluate(_X_RANGES_JS)
        same = len({tuple(round(v, 6) for v in r) for r in ranges}) == 1
        if same and ranges[0][1] - ranges[0][0] < 0.5 * (before[0][1] - before[0][0]):
            break
        assert time.monotonic() < deadline, f"the rows did not follow the zoom: {before} -> {ranges}"
        time.sleep(0.2)


@dataclass(frozen=True)
class PanelSpec:
    controls: tuple[str, ...]  # CSS selectors that must match inside the panel's output
    interact: Callable[[LabNotebook, int], None]
    min_plots: int = 1
    ready: Callable[[LabNotebook, int], None] | None = None  # waited for before the screenshot
    docs: bool = True  # copy its screenshot to docs/screenshots with WB_UPDATE_SCREENSHOTS=1


# Tested in this order. The live panel comes first (its cell is the notebook's last): its test leaves it
# paused, so its redraws stop competing with the other panels' tests for the browser and the kernel.
PANELS: dict[str, PanelSpec] = {
    "live": PanelSpec(
        controls=(".wb-live-window", ".wb-live-pause", ".wb-live-gpus", ".wb-live-mark", ".wb-live-export",
                  ".wb-live-status", ".wb-live-figure"),
        interact=live_moves_pauses_and_windows,
        ready=live_replay_reaches(20.0),
    ),
    # The widget stack itself (ipywidgets + the panels' plotly widget via anywidget), not a workbench panel.
    "stack": PanelSpec(controls=(".wb-stack-metric",), interact=choose_other_option(".wb-stack-metric"), docs=False),
    "profiler": PanelSpec(
        controls=(".wb-profiler-sort", ".wb-profiler-topn", ".wb-profiler-filter", ".wb-profiler-step",
                  ".wb-profiler-byshape", ".wb-profiler-tabs", ".wb-profiler-findings"),
        interact=profiler_slider_step_and_tabs,
    ),
    "memory": PanelSpec(
        controls=(".wb-memory-range", ".wb-memory-groupby", ".wb-memory-moment", ".wb-memory-peak",
                  ".wb-memory-tabs", ".wb-memory-timeline", ".wb-memory-live"),
        interact=memory_groupby_and_tabs,
    ),
    "memory_oom": PanelSpec(
        controls=(".wb-memory-tabs", ".wb-memory-oom", ".wb-memory-range", ".wb-memory-findings"),
        interact=memory_oom_tabs,
    ),
    "estimate": PanelSpec(
        controls=(".wb-estimate-batch", ".wb-estimate-seq", ".wb-estimate-precision",
                  ".wb-estimate-checkpointing", ".wb-estimate-budget", ".wb-estimate-summary"),
        interact=estimate_precision_and_budget,
        min_plots=2,
    ),
    "ranks": PanelSpec(
        controls=(".wb-ranks-verdict", ".wb-ranks-sort", ".wb-ranks-perstep", ".wb-ranks-tabs", ".wb-ranks-table"),
        interact=ranks_sort_and_tabs,
    ),
    "compare": PanelSpec(
        controls=(".wb-compare-base", ".wb-compare-test", ".wb-compare-diff-summary", ".wb-compare-diff-fig",
                  ".wb-compare-diff-kernels"),
        interact=compare_swap,
    ),
    "timeline": PanelSpec(
        controls=(".wb-timeline", ".wb-timeline-figure", ".wb-timeline-summary", ".wb-timeline-reset"),
        interact=timeline_drag_zoom,
    ),
    # %%workbench run in the kernel: the ProfilerPanel (diagnosis first) and the TimelinePanel under the cell
    "magic": PanelSpec(
        controls=(".wb-profiler", ".wb-profiler-findings", ".wb-timeline", ".wb-timeline-figure"),
        interact=timeline_drag_zoom,
        min_plots=2,
        docs=False,
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
    nb.run_all(timeout_s=600)  # ~100 s on a quiet 2-core machine
    t = nb.timings
    TIMINGS.append((PANELS_NOTEBOOK.name, {"open": t["opened"] - t["open_started"],
                                           "run": t["run_done"] - t["run_started"]}))
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
    assert_drawn(plots, f"the {key} panel")
    for selector in spec.controls:
        assert nb.output(index).locator(selector).count() > 0, f"control {selector} missing from the {key} panel"

    if spec.ready is not None:
        spec.ready(nb, index)
    nb.screenshot(index, f"panel_{key}", docs=spec.docs)

    before = plot_signature(plots)
    spec.interact(nb, index)
    wait_changed(nb, index, before, f"the {key} panel's interaction")
    nb.wait_widgets(index, min_plots=spec.min_plots)
    assert_drawn(nb.plots(index), f"the {key} panel after the interaction")
    text = nb.text(index)
    assert "Error displaying widget" not in text and "Traceback" not in text, text[:1000]
    assert nb.problems() == [], "\n".join(nb.problems())
