"""Figures follow JupyterLab's light/dark theme; tables carry readable headers and a CSV link; the
timeline's "Open window in Perfetto" offers the file: a ProfilerPanel in a real JupyterLab (headless
Chromium), the theme switched from the Settings menu as a user does it."""

from __future__ import annotations

import base64
import io

import nbformat
import pytest

NOTEBOOK = "theme_check.ipynb"
SOURCE = ("from workbench import ProfilerPanel, samples\n"
          "p = ProfilerPanel(samples.path('h200_streams_serial'))\n"
          "p")

LAYOUT_JS = """els => els.map(gd => ({
  paper: gd._fullLayout.paper_bgcolor, plot: gd._fullLayout.plot_bgcolor, font: gd._fullLayout.font.color,
  grid: gd._fullLayout.xaxis ? gd._fullLayout.xaxis.gridcolor : null,
  theme: gd.closest('.wb-plot') ? gd.closest('.wb-plot').dataset.wbTheme : null,
  visible: gd.offsetParent !== null,
}))"""

# what the theme's CSS variables resolve to, as plotly would write them (rgb(...) strings)
VARS_JS = """() => {
  const probe = document.createElement('div');
  document.body.appendChild(probe);
  const css = n => getComputedStyle(document.body).getPropertyValue(n).trim();
  const rgb = c => { probe.style.color = c; return getComputedStyle(probe).color; };
  const out = {bg: rgb(css('--jp-layout-color0')), fg: rgb(css('--jp-ui-font-color1'))};
  probe.remove();
  return out;
}"""


def _rgb(page, color: str) -> str:
    return page.evaluate("c => { const d = document.createElement('div'); document.body.appendChild(d); "
                         "d.style.color = c; const v = getComputedStyle(d).color; d.remove(); return v; }", color)


def _set_theme(page, name: str, light: bool) -> None:
    page.click(".lm-MenuBar-itemLabel:text-is('Settings')")
    page.hover(".lm-Menu-itemLabel:text-is('Theme')")
    page.click(f".lm-Menu-itemLabel:text-is('{name}')")
    page.wait_for_selector(f"body[data-jp-theme-light='{'true' if light else 'false'}']", state="attached",
                           timeout=30_000)


@pytest.mark.browser
def test_figures_follow_the_lab_theme_tables_export_csv_and_perfetto(open_notebook, lab_root):
    nb_doc = nbformat.v4.new_notebook()
    nb_doc.cells = [nbformat.v4.new_code_cell(SOURCE)]
    nb_doc.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb_doc, lab_root / NOTEBOOK)
    nb = open_notebook(NOTEBOOK)
    nb.run_all(timeout_s=300)
    assert nb.error_outputs() == []
    nb.wait_widgets(0, min_plots=1)
    page = nb.page
    out = nb.output(0)

    # light: the figure keeps its own colours
    light = [p for p in out.locator(".js-plotly-plot").evaluate_all(LAYOUT_JS) if p["visible"]]
    assert light and all(p["theme"] == "light" for p in light)
    assert all(_rgb(page, p["paper"]) == "rgb(255, 255, 255)" for p in light)

    # tables: words with units, and a CSV of the stored rows
    heads = out.locator(".wb-profiler-table-kernels th").all_inner_texts()
    assert "total (ms)" in heads and not any("_" in h for h in heads), heads
    href = out.locator(".wb-profiler-table-kernels a.wb-csv").get_attribute("href")
    import pandas as pd

    csv = pd.read_csv(io.StringIO(base64.b64decode(href.split("base64,", 1)[1]).decode()))
    assert {"name", "total_us", "count"} <= set(csv.columns) and len(csv) > 0

    try:
        _set_theme(page, "JupyterLab Dark", light=False)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.wb-plot')).every(e => e.dataset.wbTheme === 'dark')",
            timeout=30_000)
        want = page.evaluate(VARS_JS)
        dark = [p for p in out.locator(".js-plotly-plot").evaluate_all(LAYOUT_JS) if p["visible"]]
        assert dark and all(p["theme"] == "dark" for p in dark)
        for p in dark:
            assert _rgb(page, p["paper"]) == want["bg"] != "rgb(255, 255, 255)"
            assert _rgb(page, p["font"]) == want["fg"]
        nb.screenshot(0, "profiler_panel_dark", docs=True)

        # the timeline tab: "Open window in Perfetto" writes the file and offers it
        out.locator(".wb-profiler-tabs .lm-TabBar-tab:has-text('Timeline')").click()
        nb.wait_widgets(0, min_plots=1)
        out.locator(".wb-profiler-perfetto").click()
        link = out.locator(".wb-perfetto-download")
        link.wait_for(timeout=60_000)
        assert link.get_attribute("download").endswith(".perfetto.json")
        assert out.locator(".wb-perfetto-open").count() == 1
        assert "wrote " in out.locator(".wb-profiler-perfetto-note").inner_text()
    finally:
        _set_theme(page, "JupyterLab Light", light=True)
    back = [p for p in out.locator(".js-plotly-plot").evaluate_all(LAYOUT_JS) if p["visible"]]
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.wb-plot')).every(e => e.dataset.wbTheme === 'light')",
        timeout=30_000)
    assert back and nb.problems() == []
