"""The HTML reports in Chromium, opened from disk as a user opens them (file://, nothing else reachable): the
diagnosis and the OOM advice are cards (one headline, bars sorted by saving, a line of code whose copy button
puts it on the clipboard, the evidence folded) and a finding's details open on a click. One PNG each in
build/screenshots."""

from __future__ import annotations

import pytest
from browser_helpers import SCREENSHOTS, VIEWPORT, check_card

from workbench import samples


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    from workbench.report import memory_report, trace_report

    out = tmp_path_factory.mktemp("reports")
    return {"trace": trace_report(samples.path("h200_train_step"), out / "trace.html", top=5),
            "memory": memory_report(samples.path("h200_oom_snapshot"), out / "memory.html")}


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1,
                                  permissions=["clipboard-read", "clipboard-write"])
    pg = context.new_page()
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:", "about:"))
          else problems.append(f"request left the file: {r.url}"))
    pg.problems = problems
    yield pg
    context.close()


def _open(page, path):
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return lambda: page.evaluate("navigator.clipboard.readText()")


def _shot(locator, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(SCREENSHOTS / f"{name}.png"), animations="disabled")


@pytest.mark.browser
def test_trace_report_diagnosis_card(page, reports):
    clipboard = _open(page, reports["trace"])
    card = page.locator(".wb-diagnosis-card").first
    got = check_card(card, min_bars=2, clipboard=clipboard)
    assert got["headline"].startswith("Diagnosis: limited by the profiler"), got
    assert [c for c in card.locator(".wb-bar-row").evaluate_all("rs => rs.map(r => r.dataset.cause)")][:2] == \
        ["profiler", "fp32_matmul"]
    # the overview says which numbers are over the window and which a step
    overview = page.locator("h2:text-is('Overview') + div table").inner_text()
    assert "GPU busy over the window (ms)" in overview and "profiled window (ms)" in overview, overview
    assert "a step: GPU busy" in page.locator(".wb-per-step").inner_text()
    # a finding: its fix to copy, its evidence folded until its summary is clicked
    fp32 = page.locator(".wb-finding", has_text="fp32_matmul").first
    fp32.locator(".wb-copy").click()
    page.wait_for_function("() => [...document.querySelectorAll('.wb-copy')].some(b => b.textContent === 'copied')")
    assert clipboard().startswith("torch.backends.cuda.matmul.allow_tf32 = True")
    evidence = fp32.locator(".wb-evidence")
    assert not evidence.is_visible()
    fp32.locator("details.wb-finding-details summary").click()
    evidence.wait_for(state="visible", timeout=5_000)
    fp32.locator("details.wb-finding-details summary").click()
    page.wait_for_timeout(1600)  # the copy buttons read "copy" again
    # the section: from its heading to the next one
    top = page.locator("h2:text-is('Diagnosis and findings')").bounding_box()
    nxt = page.locator("h2:text-is('Diagnosis and findings') ~ h2").first.bounding_box()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "report_trace_findings.png"), full_page=True, animations="disabled",
                    clip={"x": 0, "y": top["y"] - 8, "width": VIEWPORT["width"], "height": nxt["y"] - top["y"]})
    assert page.problems == [], "\n".join(page.problems)


@pytest.mark.browser
def test_memory_report_oom_advice_card(page, reports):
    clipboard = _open(page, reports["memory"])
    card = page.locator(".wb-advice-card").first
    got = check_card(card, min_bars=3, clipboard=clipboard)
    assert got["headline"] == "Out of memory: capacity", got
    assert card.locator(".wb-bar-cap").count() == card.locator(".wb-bar-row").count() + 1
    # the fix offered is the first one that fits: its bar is green, under the cap tick
    first_fit = card.locator(".wb-bar-row:has(.wb-advice-fits)").first
    assert first_fit.count() == 1
    card.locator("details.wb-card-evidence summary").click()
    card.locator(".wb-memory-advice").wait_for(state="visible", timeout=5_000)
    assert "requested" in card.locator("details.wb-card-evidence").inner_text()
    card.locator("details.wb-card-evidence summary").click()
    page.wait_for_timeout(1600)
    _shot(card, "report_memory_oom_advice")
    assert page.problems == [], "\n".join(page.problems)
