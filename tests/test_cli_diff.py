"""``workbench diff BASE TEST [--json] [--html OUT]`` on the real trace pair."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict

import pytest
from testdata import data_path

from workbench import samples
from workbench.cli import main

BASE = str(data_path("trace_compare", "base.json.gz"))
TEST = str(data_path("trace_compare", "test.json.gz"))


def _kernel_totals(path):
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    total = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            total[e["name"]] += e["dur"]
    return total


def test_diff_json_matches_plain_json(capsys):
    assert main(["diff", BASE, TEST, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"base", "test", "kernels"} <= set(doc)
    assert doc["base"]["source"]["path"] == BASE and doc["test"]["source"]["path"] == TEST
    b, t = _kernel_totals(BASE), _kernel_totals(TEST)
    got = {k["name"]: k for k in doc["kernels"]}
    assert set(got) == set(b) | set(t)
    for name, k in got.items():
        assert k["base_total_us"] == pytest.approx(b[name])
        assert k["test_total_us"] == pytest.approx(t[name])
        assert k["delta_us"] == pytest.approx(t[name] - b[name])
    assert sorted(doc["appeared"]["ops"]) == ["AddmmBackward0", "All2All_Pooled_Req", "CatBackward0"]


def test_diff_text_and_html(tmp_path, capsys):
    out_html = tmp_path / "diff.html"
    assert main(["diff", BASE, TEST, "--html", str(out_html), "--top", "5"]) == 0
    cap = capsys.readouterr()
    text = cap.out
    assert "median step: 111.224 ms -> 111.224 ms (+0.0%)" in text
    assert "kernels:     6 -> 5 launches, total time change -0.004 ms" in text
    assert "All2All_Pooled_Req [new]" in text
    assert "ops appeared: " in text
    assert f"wrote {out_html}" in cap.err
    page = out_html.read_text()
    assert page.count("plotly.js") >= 1 and "Kernels" in page and "All2All_Pooled_Req" in page


def test_diff_per_step_on_real_traces(capsys):
    h200 = str(samples.path("h200_train_step"))
    mi250 = str(samples.path("mi250_rocm"))
    assert main(["diff", h200, mi250, "--json", "--per-step", "--top", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["normalize"] == "per_step" and len(doc["kernels"]) == 3
    assert doc["steps"]["base_count"] == 3 and doc["steps"]["test_count"] == 2
    assert doc["base"]["source"]["device"] != doc["test"]["source"]["device"]


@pytest.mark.parametrize("content", [b"", b"not json at all", gzip.compress(b'{"traceEvents": [')[:-4]])
def test_bad_files_exit_2_with_one_line(tmp_path, content):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "workbench", "diff", BASE, str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.json.gz" in lines[0] and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_missing_file_and_bad_top(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "nope.json"), TEST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.json" in err[0]
    assert main(["diff", BASE, TEST, "--top", "0"]) == 2
