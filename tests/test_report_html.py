"""The HTML report: findings with readable evidence, one offline file."""

from __future__ import annotations

import os
import re

import pandas as pd
import pytest

from workbench import samples
from workbench.analysis import findings, trace_summary
from workbench.figures.text import findings_html
from workbench.io import load_trace
from workbench.report import Section, write_report


def test_findings_render_evidence_as_text_from_objects_and_json_dicts(tmp_path):
    tr = load_trace(samples.path("h200_train_step"))
    objs = findings(tr)
    dicts = trace_summary(tr)["findings"]
    a, b = findings_html(objs), findings_html(dicts)
    assert a == b  # the same text from the objects and from the JSON summary
    assert a.count("class='finding ") == len(objs)
    ev = "".join(a.split("wb-evidence")[1:])
    assert "profiled window <b>" in ev and " ms" in ev and "What if fixed:" in a and "%" in a
    assert "_us" not in ev and "['" not in ev and "e+0" not in ev
    assert findings_html([]) == "<p>No findings.</p>"
    out = write_report(tmp_path / "r.html", "t", [Section("Findings", [a], raw_html=True),
                                                  Section("Table", [pd.DataFrame({"x": [1.5]})])])
    text = out.read_text()
    assert len(re.findall(r"wb-evidence-item", text)) >= 4 and "1.500" in text


def test_the_three_reports_are_callable_from_a_notebook(tmp_path):
    # what `workbench trace|memory|diff --html` write, from Python objects or paths, returning the path

    from workbench.analysis import trace_diff
    from workbench.report import diff_report, memory_report, trace_report

    tr = load_trace(samples.path("h200_train_step"))
    out = trace_report(tr, tmp_path / "trace.html", top=5)
    assert out == tmp_path / "trace.html" and out.is_file()
    text = out.read_text()
    for heading in ("Overview", "Diagnosis and findings", "Kernels", "Operators", "Steps", "Idle gaps", "Timeline"):
        assert f">{heading}</h2>" in text, heading
    assert text.count("<script") >= 1 and "profiler_overhead" in text and "What if fixed:" in text

    mem = memory_report(samples.path("h200_oom_snapshot"), tmp_path / "mem.html")
    mtext = mem.read_text()
    assert ">OOM post-mortem: capacity</h2>" in mtext and ">Live at the peak</h2>" in mtext
    # the memory findings as the panels show them, right after the post-mortem
    heads = re.findall(r"<h2>([^<]+)</h2>", mtext)
    assert heads[:2] == ["OOM post-mortem: capacity", "Findings"]
    assert "<div class='finding critical wb-finding wb-finding-critical'" in mtext
    assert "<b>oom_capacity</b>" in mtext

    serial, overlap = samples.path("h200_streams_serial"), samples.path("h200_streams_overlap")
    a = diff_report(serial, tmp_path / "diff_a.html", test=overlap)
    b = diff_report(trace_diff(load_trace(serial), load_trace(overlap)), tmp_path / "diff_b.html")
    ta, tb = a.read_text(), b.read_text()
    heads = re.findall(r"<h2>([^<]+)</h2>", ta)
    assert heads[:4] == ["What changed", "Findings", "Kernels (total over 2 -&gt; 2 steps)",
                         "Operators (total over 2 -&gt; 2 steps)"]
    strip = lambda s: re.sub(r'id="[^"]+"|"[0-9a-f]{8}-[0-9a-f-]{27}"', "", s)  # noqa: E731 - plotly div ids
    assert len(strip(ta)) == len(strip(tb))  # from paths or from a TraceDiff: the same report


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_reports_get_the_mode_of_a_new_file(tmp_path, umask, mode):
    """0644 under the usual umask, so a group on a shared cluster can read them (the temporary file's
    0600 is not kept); a private umask still gives a private file."""
    old = os.umask(umask)
    try:
        out = write_report(tmp_path / "r.html", "t", [Section("s", ["text"])])
    finally:
        os.umask(old)
    assert (os.stat(out).st_mode & 0o777) == mode


def test_report_tables_scroll_or_wrap_instead_of_running_off_the_page(tmp_path):
    import pandas as pd

    from workbench.report.html import Section, render_report

    name = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>" * 4
    frame = pd.DataFrame({"name": [name], **{f"column_{i}_ms": [1.0] for i in range(30)}})
    text = render_report("wide", [Section("kernels", [frame])])
    assert "<div class='wb-table'><table" in text  # the DataFrame sits in a box that scrolls sideways
    style = text[text.index("<style>"):text.index("</style>")]
    assert ".wb-table{overflow-x:auto;max-width:100%" in style
    assert "table{display:block;overflow-x:auto;max-width:100%}" in style  # raw-HTML tables scroll too
    assert "td:first-child{max-width:40rem;overflow-wrap:anywhere}" in style  # long names wrap in their cell


def _bars_saved(text: str, cls: str) -> list[float]:
    block = text[text.index(cls):]
    block = block[: block.index("wb-fix") if "wb-fix" in block else len(block)]
    return [float(v) for v in re.findall(r"data-saved='(-?[\d.]+)'", block)]


def test_the_diagnosis_is_a_card_with_bars_by_saving_and_a_fix_to_copy():
    from workbench.analysis.trace.analysis import TraceAnalysis

    a = TraceAnalysis(samples.path("h200_train_step"))
    text = findings_html(a.findings, a.diagnosis)
    card = text[: text.index("class='finding ")]
    assert "wb-diagnosis-card" in card and card.count("wb-card-headline") == 1
    assert "Diagnosis: limited by the profiler" in card
    # the step now, then each what-if that saves at least 3%, largest saving first (TF32 from the finding)
    saved = _bars_saved(card, "wb-diagnosis-bars")
    assert len(saved) >= 2 and saved == sorted(saved, reverse=True), saved
    assert re.findall(r"data-cause='(\w+)'", card)[:2] == ["profiler", "fp32_matmul"]
    assert card.count("wb-bar-now") == 1 and "32.61 ms</b> a step" in card
    # every number of the card's header says "a step"
    nums = re.search(r"wb-card-numbers[^>]*>(.*?)</div>", card).group(1)
    assert nums.count("ms</b>") == nums.count("ms</b> a step") == 3, nums
    # the fix of the bound as one line of code with a copy button; the evidence folded
    assert re.search(r"<code class='wb-fix-code'[^>]*>profile_steps\(step, detail=&quot;light&quot;\)", card)
    assert "navigator.clipboard" in card and "<details class='wb-card-evidence'" in card
    # each finding: its own fix line (TF32 for fp32_matmul) and the rest of its message folded
    fp32 = text[text.index("<b>fp32_matmul</b>"):]
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in fp32[: fp32.index("<details")]
    assert text.count("<details class='wb-finding-details'") == len(a.findings)


def test_every_what_if_carries_its_fix_as_code_in_the_json():
    from workbench.analysis.trace.analysis import TraceAnalysis

    s = TraceAnalysis(samples.path("h200_train_step")).summary()
    wis = s["diagnosis"]["what_if"]
    assert all(w["fix_code"] for w in wis.values()), {c: w["fix_code"] for c, w in wis.items()}
    assert list(wis["sync"])[-1] == "fix_code"  # a new key after the others: older readers see the same keys
    fp32 = next(f for f in s["findings"] if f["id"] == "fp32_matmul")
    assert fp32["what_if"]["fix_code"].startswith("torch.backends.cuda.matmul.allow_tf32 = True")


def test_the_oom_advice_is_a_card_of_peak_against_cap():
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.figures.text import advice_html
    from workbench.io.snapshot import load_snapshot

    oom = analyze_snapshot(load_snapshot(samples.path("h200_oom_snapshot"))).oom
    text = advice_html(oom.advice, headline=f"Out of memory: {oom.cause}", details="<div>more</div>")
    assert "wb-advice-card" in text and "Out of memory: capacity" in text
    saved = _bars_saved(text, "wb-advice-bars")
    assert len(saved) == len([a for a in oom.advice if a["id"] != "bigger_gpu"]) and saved == sorted(saved, reverse=True)
    assert text.count("wb-bar-cap") == len(saved) + 1  # the cap on every bar, the peak as it is included
    fits = next(a for a in oom.advice if a["what_if"]["fits"] and a["fix_code"])
    assert html_unescape(re.search(r"<code class='wb-fix-code'[^>]*>(.*?)</code>", text).group(1)) == fits["fix_code"]
    assert "<details class='wb-card-evidence'" in text and "<div>more</div>" in text


def html_unescape(s: str) -> str:
    import html

    return html.unescape(s)
