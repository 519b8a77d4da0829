"""docs/json.md documents every key the CLI's JSON has: each command's document is generated here from
shipped samples, and every key path in it must be listed on that command's section of the page."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import samples

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "json.md"

# objects whose keys are data (a cause, a phase, a module path, a finding's evidence): their own key is
# documented, their children are described in words
OPEN = {
    "idle_gaps.by_cause_us", "findings[].evidence", "breakdown.base", "breakdown.test", "by_phase", "by_category",
    "by_module", "oom.by_category", "profiler_categories.by_category", "diagnosis.what_if",
    "diagnosis.critical_path_ms", "straggler.evidence.others_wait_us_per_step", "roofline.peak_tflops",
    "roofline.measured_peak_tflops", "meta.flops_by_kind",
}
PAIRS = ROOT / "tests" / "data" / "h200_pairs"


def _sections() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^## `workbench (\w+)[^`]*`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _documented(section: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def _paths(obj, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            if re.sub(r"^(base\.|test\.|traces\[\]\.)", "", p) not in OPEN:
                out |= _paths(v, p)
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, dict):
                out |= _paths(item, prefix + "[]")
        if prefix:
            out.discard(prefix)
            out.add(prefix + "[]" if obj and isinstance(obj[0], dict) else prefix)
    return out


def _cli(*args, cwd=ROOT) -> dict:
    r = subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _undocumented(doc: dict, command: str) -> set[str]:
    have = _documented(_sections()[command])
    trace_keys = _documented(_sections()["trace"])
    missing = set()
    for p in _paths(doc):
        if command == "diff" and doc.get("kind") != "memory" and p.split(".")[0] in ("base", "test") and "." in p:
            keys, p = trace_keys, p.split(".", 1)[1]  # each side is a trace summary
        elif command == "trace" and p.startswith("traces[]."):
            keys, p = trace_keys, p.removeprefix("traces[].")  # several files: one summary each
        else:
            keys = have
        # a list is documented as `a[]`
        if p not in keys and p + "[]" not in keys and p.removesuffix("[]") not in keys:
            missing.add(p)
    return missing


def test_the_page_has_a_section_per_command():
    assert {"trace", "ranks", "diff", "memory", "monitor", "estimate", "timeline"} <= set(_sections())


def test_trace_keys_are_documented_with_the_evidence_of_each_finding():
    docs = [_cli("trace", samples.path(name), "--json") for name in
            ("h200_train_step", "h200_streams_serial", "cpu_only", "a100_alexnet")]
    # recorded H200 pairs whose diagnosis is input / sync / pinned-copy bound (docs[0] stays the shipped step)
    docs += [_cli("trace", PAIRS / case / name, "--json") for case, name in
             (("loader", "workers0.light.trace.json.gz"), ("sync", "h5.9_g6.5_item.light.trace.json.gz"),
              ("copies", "pageable.light.trace.json.gz"))]
    several = _cli("trace", samples.path("h200_streams_serial"), samples.path("h200_streams_overlap"), "--json")
    assert set(several) == {"traces"} and len(several["traces"]) == 2
    for doc in docs + [several]:
        assert not _undocumented(doc, "trace")
    main_blocks = {"source", "gpu", "breakdown", "top_kernels", "top_ops", "findings", "steps", "memcpy", "launch",
                   "idle_gaps"}
    assert main_blocks <= set(docs[0])
    # the nested keys of each main block were checked above; the page lists each finding's evidence keys
    section = _sections()["trace"]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", section, flags=re.M))
    seen = set()
    for doc in docs:
        for f in doc["findings"]:
            seen.add(f["id"])
            listed = set(re.findall(r"`(\w+)`", rows[f["id"]]))
            assert set(f["evidence"]) <= listed, (f["id"], set(f["evidence"]) - listed)
    assert {"profiler_overhead", "input_bound", "host_bound", "launch_bound", "sync_bound", "fp32_matmul",
            "memcpy_heavy", "cpu_only"} <= seen


def test_ranks_keys_are_documented_with_the_evidence_of_each_finding(tmp_path):
    data = samples.path("ranks_healthy").parent
    docs = [_cli("ranks", data / s, "--json", "--no-cache") for s in ("straggler", "slow_collective", "healthy")]
    assert docs[0]["straggler"] is not None and docs[0]["skipped"]
    for doc in docs:
        assert not _undocumented(doc, "ranks")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", _sections()["ranks"], flags=re.M))
    for doc in docs:
        for f in doc["findings"]:
            assert set(f["evidence"]) <= set(re.findall(r"`(\w+)`", rows[f["id"]])), f["id"]


def test_diff_keys_are_documented():
    doc = _cli("diff", samples.path("h200_streams_serial"), samples.path("h200_streams_overlap"), "--json")
    assert not _undocumented(doc, "diff")
    per_step = _cli("diff", samples.path("h200_train_step"), samples.path("h200_streams_overlap"), "--json",
                    "--per-step")
    assert per_step["normalize"] == "per_step" and not _undocumented(per_step, "diff")


def test_memory_diff_keys_are_documented():
    doc = _cli("diff", samples.path("h200_train_snapshot"), samples.path("h200_oom_snapshot"), "--json")
    assert doc["kind"] == "memory" and doc["axis"] == "step"
    assert not _undocumented(doc, "diff")


def test_memory_keys_are_documented():
    oom = _cli("memory", samples.path("h200_oom_snapshot"), "--json")
    train = _cli("memory", samples.path("h200_train_snapshot"), "--json", "--profiler-timeline",
                 samples.path("h200_memory_timeline"))
    assert oom["oom"] is not None and train["profiler_categories"] is not None
    for doc in (oom, train):
        assert not _undocumented(doc, "memory")


def test_monitor_session_keys_are_documented(tmp_path):
    out = tmp_path / "session.jsonl.gz"
    r = subprocess.run([sys.executable, "-m", "workbench", "monitor", "--replay", "h200_nvml_session", "--speed",
                        "1000", "--interval", "0.01", "--quiet", "--csv", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in gzip.open(out, "rt")]
    assert len(records) > 100
    keys = set().union(*records)
    have = _documented(_sections()["monitor"])
    assert keys - have == set()
    assert {"t_s", "gpu", "util_gpu_pct", "mem_used_bytes", "power_w"} <= keys


def test_estimate_keys_are_documented():
    pytest.importorskip("torch")
    doc = _cli("estimate", ROOT / "examples" / "estimate_mlp.py", "--batch-size", "4", "--json")
    assert not _undocumented(doc, "estimate")
    assert set(doc["by_category"]) <= set(re.findall(r"`(\w+)`", _sections()["estimate"]))


def test_timeline_keys_are_documented():
    docs = [_cli("timeline", "--trace", samples.path("h200_timeline_trace"), "--memory",
                 samples.path("h200_timeline_snapshot"), "--nvml", samples.path("h200_timeline_nvml"), "--json"),
            _cli("timeline", "--trace", samples.path("cpu_only"), "--nvml", samples.path("h200_nvml_session"), "--json")]
    for doc in docs:
        assert not _undocumented(doc, "timeline")
    assert docs[0]["activity"] and docs[0]["memory"] and docs[1]["notes"]
