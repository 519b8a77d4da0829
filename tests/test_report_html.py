"""The HTML report: findings with readable evidence, one offline file."""

from __future__ import annotations

import re

import pandas as pd

from workbench import samples
from workbench.analysis import findings, trace_summary
from workbench.io import load_trace
from workbench.report import Section, findings_html, write_report


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
