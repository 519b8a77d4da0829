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
