"""Ledger io, baseline ratios, trace diff, comparison figures and ComparePanel."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pytest
from testdata import data_path

from workbench import samples
from workbench.analysis.trace.diff import baseline_ratios, check_verdicts, diff_summary, trace_diff
from workbench.errors import BadArtifact, MissingDependency, WorkbenchError
from workbench.figures.compare import experiment_figure, kernel_delta_figure, unique_labels
from workbench.io import load_trace
from workbench.io.ledger import LEDGER_COLUMNS, ledger_frame, load_ledger, save_ledger

BASE = data_path("trace_compare", "base.json.gz")
TEST = data_path("trace_compare", "test.json.gz")


# --------------------------------------------------------------------------- independent computations


def _events(path):
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _by_name(events, cats, skip_steps=False):
    count, total = Counter(), defaultdict(float)
    for e in events:
        if e.get("cat") in cats and not (skip_steps and e["name"].startswith("ProfilerStep#")):
            count[e["name"]] += 1
            total[e["name"]] += float(e.get("dur", 0))
    return count, total


def _union_length(intervals):
    out, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                out += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return out + ((cur_e - cur_s) if cur_e is not None else 0.0)


# --------------------------------------------------------------------------------------------- ledger


def _rows():
    common = dict(machine="m1", device="cuda:0", gpu="NVIDIA H200", torch_version="2.11.0", date="2026-12-02T10:00:00+00:00")
    return [
        dict(experiment="a", configuration="fp32", status="ok", step_ms_median=365.0, step_ms_q1=360.0,
             step_ms_q3=370.0, peak_allocated_bytes=int(15.0 * 2**30), samples_per_s=87.7, energy_j_per_step=200.0,
             check_verdict="ok", check_message="reference", **common),
        dict(experiment="a", configuration="tf32", status="ok", step_ms_median=123.0, step_ms_q1=122.0,
             step_ms_q3=125.0, peak_allocated_bytes=int(15.0 * 2**30), samples_per_s=260.2, energy_j_per_step=80.0,
             check_verdict="ok", check_message="fine", **common),
        dict(experiment="a", configuration="amp_bf16", status="ok", step_ms_median=50.0, step_ms_q1=49.0,
             step_ms_q3=51.0, peak_allocated_bytes=int(9.1 * 2**30), samples_per_s=640.0, energy_j_per_step=30.0,
             check_verdict="ok", check_message="fine", **common),
        dict(experiment="a", configuration="pure_fp16", status="oom", error="OutOfMemoryError: ...", **common),
        dict(experiment="b", configuration="fp32", status="ok", step_ms_median=10.0, peak_allocated_bytes=1000,
             samples_per_s=100.0, **common),
        dict(experiment="b", configuration="checkpoint(Block)", status="ok", step_ms_median=12.5,
             peak_allocated_bytes=250, samples_per_s=80.0, check_verdict="vanishing_updates",
             check_message="37% vanish", **common),
    ]


def test_ledger_json_roundtrip_append_and_columns(tmp_path):
    led = ledger_frame(_rows())
    assert list(led.columns[: len(LEDGER_COLUMNS)]) == list(LEDGER_COLUMNS)
    path = save_ledger(led.iloc[:4], tmp_path / "ledger.json")
    back = load_ledger(path)
    pd.testing.assert_frame_equal(back, led.iloc[:4].reset_index(drop=True))
    save_ledger(led.iloc[4:], path, append=True)
    both = load_ledger(path)
    assert len(both) == 6 and list(both["experiment"]) == list("aaaabb")
    assert both["peak_allocated_bytes"].dtype == "Int64" and pd.isna(both.loc[3, "step_ms_median"])
    doc = json.loads(path.read_text())
    assert doc["format"] == "gpu-workbench-ledger" and len(doc["rows"]) == 6
    assert doc["rows"][3]["step_ms_median"] is None  # NaN is written as null, not as invalid JSON


def test_ledger_bad_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(BadArtifact, match="x.json: not a JSON ledger"):
        load_ledger(bad)
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(BadArtifact, match="not a gpu-workbench ledger"):
        load_ledger(bad)
    with pytest.raises(BadArtifact, match="no such ledger file"):
        load_ledger(tmp_path / "missing.json")
    with pytest.raises(BadArtifact, match=r"\*.json or \*.parquet"):
        save_ledger(ledger_frame(_rows()), tmp_path / "ledger.csv")


def test_parquet_without_pyarrow_names_the_fix(tmp_path):
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from workbench.io.ledger import save_ledger, ledger_frame\n"
        "from workbench.errors import MissingDependency\n"
        "try:\n"
        f"    save_ledger(ledger_frame([{{'configuration': 'fp32'}}]), {str(tmp_path / 'l.parquet')!r})\n"
        "except MissingDependency as e:\n"
        "    print('MISSING', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "MISSING pyarrow is needed to save a ledger as Parquet" in out.stdout, out.stderr
    assert "pip install pyarrow" in out.stdout


def test_parquet_roundtrip_when_pyarrow_is_installed(tmp_path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependency, match="pyarrow"):
            save_ledger(ledger_frame(_rows()), tmp_path / "l.parquet")
        return
    led = ledger_frame(_rows())
    back = load_ledger(save_ledger(led, tmp_path / "l.parquet"))
    pd.testing.assert_frame_equal(back, led)


def test_baseline_ratios_per_experiment():
    r = baseline_ratios(ledger_frame(_rows()))
    a = r[r["experiment"] == "a"].set_index("configuration")
    b = r[r["experiment"] == "b"].set_index("configuration")
    assert a["is_baseline"].tolist() == [True, False, False, False]
    assert b["is_baseline"].tolist() == [True, False]
    assert a.loc["tf32", "speedup"] == pytest.approx(365 / 123)
    assert a.loc["amp_bf16", "step_time_ratio"] == pytest.approx(50 / 365)
    assert a.loc["amp_bf16", "peak_allocated_ratio"] == pytest.approx(int(9.1 * 2**30) / int(15.0 * 2**30))
    assert a.loc["amp_bf16", "energy_ratio"] == pytest.approx(30 / 200)
    assert a.loc["amp_bf16", "throughput_ratio"] == pytest.approx(640 / 87.7)
    assert math.isnan(a.loc["pure_fp16", "speedup"])
    assert b.loc["checkpoint(Block)", "peak_allocated_ratio"] == pytest.approx(0.25)
    # an explicit baseline; groups without it get no ratios
    r2 = baseline_ratios(ledger_frame(_rows()), baseline="tf32")
    a2 = r2[r2["experiment"] == "a"].set_index("configuration")
    assert a2.loc["fp32", "speedup"] == pytest.approx(123 / 365)
    assert r2[r2["experiment"] == "b"]["speedup"].isna().all()
    with pytest.raises(WorkbenchError, match="baseline 'nope' is not in the ledger"):
        baseline_ratios(ledger_frame(_rows()), baseline="nope")
    v = check_verdicts(ledger_frame(_rows()))
    assert v.set_index("configuration").loc["checkpoint(Block)", "check_verdict"] == "vanishing_updates"


# ----------------------------------------------------------------------------------------- trace diff


def test_trace_diff_against_plain_json():
    base_ev, test_ev = _events(BASE), _events(TEST)
    d = trace_diff(load_trace(BASE), load_trace(TEST))

    bc, bt = _by_name(base_ev, {"kernel"})
    tc, tt = _by_name(test_ev, {"kernel"})
    k = d.kernels.set_index("name")
    assert set(k.index) == set(bc) | set(tc)
    for name in k.index:
        assert k.loc[name, "base_count"] == bc[name] and k.loc[name, "test_count"] == tc[name]
        assert k.loc[name, "base_total_us"] == pytest.approx(bt[name])
        assert k.loc[name, "delta_us"] == pytest.approx(tt[name] - bt[name])
    # the one real change in this pair: a 4 us elementwise kernel ran 3 times, now 2
    top = d.kernels.iloc[0]
    assert top["delta_count"] == -1 and top["delta_us"] == pytest.approx(-4.0)
    assert d.kernel_delta_us == pytest.approx(sum(tt.values()) - sum(bt.values()))
    assert d.appeared_kernels == [] and d.disappeared_kernels == []

    boc, bot = _by_name(base_ev, {"cpu_op", "user_annotation"}, skip_steps=True)
    toc, tot = _by_name(test_ev, {"cpu_op", "user_annotation"}, skip_steps=True)
    o = d.ops.set_index("name")
    assert set(d.appeared_ops) == set(toc) - set(boc) == {"All2All_Pooled_Req", "CatBackward0", "AddmmBackward0"}
    assert d.disappeared_ops == []
    for name in o.index:
        assert o.loc[name, "delta_count"] == toc[name] - boc[name]
        assert o.loc[name, "delta_cpu_us"] == pytest.approx(tot[name] - bot[name])
    assert o.loc["nccl:all_reduce", "delta_count"] == -1

    # GPU busy: the union of kernel/memcpy/memset intervals (all inside the step window here)
    def busy(events):
        return _union_length([(e["ts"], e["ts"] + e["dur"]) for e in events
                              if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")])

    assert d.base_busy.busy_us == pytest.approx(busy(base_ev))
    assert d.test_busy.busy_us == pytest.approx(busy(test_ev))
    # the median step is the one definition (tables.step_numbers), as `workbench trace` gives it: each
    # step lasts until the work it launched has run. (Was the ProfilerStep host spans' median, equal on
    # both sides, which `workbench trace` and the diagnosis did not show: issue 32.)
    from workbench.analysis.trace.tables import step_numbers

    steps = [e["dur"] for e in base_ev if e["name"].startswith("ProfilerStep#")]
    nb, nt = step_numbers(d.base), step_numbers(d.test)
    assert d.base_steps == len(steps) == 2 and d.base_step_us == nb.step_median_us
    assert d.test_step_us == nt.step_median_us
    assert min(nb.step_us) >= min(steps)  # never shorter than the host's own span
    assert d.step_delta_us == pytest.approx(nt.step_median_us - nb.step_median_us)


def test_trace_diff_per_step_and_identity():
    b, t = load_trace(BASE), load_trace(TEST)
    per = trace_diff(b, t, normalize="per_step")
    tot = trace_diff(b, t)
    assert np.allclose(per.kernels.set_index("name")["delta_us"],
                       tot.kernels.set_index("name")["delta_us"] / 2)
    same = trace_diff(b, b)
    assert (same.kernels["delta_us"] == 0).all() and (same.ops["delta_count"] == 0).all()
    assert same.appeared_ops == [] and (same.kernels["status"] == "both").all()
    with pytest.raises(WorkbenchError, match="normalize"):
        trace_diff(b, t, normalize="bogus")
    alexnet = load_trace(samples.path("a100_alexnet"))  # no ProfilerStep annotations
    with pytest.raises(WorkbenchError, match="a100_alexnet.*no ProfilerStep"):
        trace_diff(b, alexnet, normalize="per_step")


def test_trace_diff_real_h200_against_cpu_only_everything_disappears():
    h200 = load_trace(samples.path("h200_train_step"))
    cpu = load_trace(samples.path("cpu_only"))
    d = trace_diff(h200, cpu)
    n_names = h200.events.loc[h200.events["cat"] == "kernel", "name"].astype(str).nunique()
    assert len(d.disappeared_kernels) == n_names and d.appeared_kernels == []
    assert d.test_busy.busy_us == 0
    kernel_total = float(h200.events.loc[h200.events["cat"] == "kernel", "dur_us"].sum())
    assert d.kernel_delta_us == pytest.approx(-kernel_total)
    # sorted by the size of the change
    assert (d.kernels["delta_us"].abs().diff().dropna() <= 1e-9).all()


def test_diff_summary_keys_and_json():
    d = trace_diff(load_trace(BASE), load_trace(TEST))
    s = diff_summary(d)
    text = json.dumps(s, allow_nan=False)  # strict JSON
    assert json.loads(text)["kernels"][0]["delta_us"] == pytest.approx(-4.0)
    for side in ("base", "test"):
        assert {"source", "gpu", "breakdown", "top_kernels", "top_ops", "findings"} <= set(s[side])
    assert s["base"]["source"]["path"].endswith("base.json.gz")
    assert {"name", "base_total_us", "test_total_us", "delta_us"} <= set(s["kernels"][0])
    assert len(s["kernels"]) == len(d.kernels)
    assert set(s["appeared"]["ops"]) == {"All2All_Pooled_Req", "CatBackward0", "AddmmBackward0"}
    assert s["gpu"]["delta_busy_us"] == pytest.approx(d.test_busy.busy_us - d.base_busy.busy_us)
    assert s["gpu"]["base_kernel_count"] == 6 and s["gpu"]["test_kernel_count"] == 5
    assert s["steps"]["base_count"] == 2
    assert len(diff_summary(load_trace(BASE), load_trace(TEST), top=1)["kernels"]) == 1


# -------------------------------------------------------------------------------------------- figures


def test_experiment_figure_marks_the_baseline():
    table = baseline_ratios(ledger_frame(_rows()[:4]))
    fig = experiment_figure(table)
    assert len(fig.data) == 4  # step time, memory, throughput, energy
    step, mem = fig.data[0], fig.data[1]
    assert list(step.x) == ["fp32", "tf32", "amp_bf16", "pure_fp16"]
    assert step.marker.color[0] != step.marker.color[1] == step.marker.color[2]
    assert step.text[1] == f"×{123 / 365:.2f}" and step.text[3] == ""
    assert mem.y[2] == pytest.approx(int(9.1 * 2**30) / 2**30)
    assert list(step.error_y.array[:3]) == pytest.approx([5.0, 2.0, 1.0])
    dashed = [s for s in fig.layout.shapes if s.line.dash == "dash"]
    assert len(dashed) == 4 and dashed[0].y0 == pytest.approx(365.0)
    assert "baseline: fp32" in fig.layout.title.text
    only = experiment_figure(table, metrics=["step_ms_median"], baseline="amp_bf16")
    assert len(only.data) == 1 and only.data[0].text[0] == f"×{365 / 50:.2f}"
    assert "no experiment rows" in experiment_figure(table.iloc[:0]).layout.title.text


def test_kernel_delta_figure_diverging_bars():
    d = trace_diff(load_trace(samples.path("h200_train_step")), load_trace(samples.path("cpu_only")))
    fig = kernel_delta_figure(d.kernels, top=5)
    bar = fig.data[0]
    assert len(bar.x) == 5
    expect = d.kernels.head(5)["delta_us"].to_numpy()[::-1] / 1e3
    assert np.allclose(bar.x, expect)
    assert all(label.endswith("(gone)") for label in bar.y)
    assert set(bar.marker.color) == {"#0072B2"}  # all faster (gone)
    ops = trace_diff(load_trace(BASE), load_trace(TEST)).ops
    fig2 = kernel_delta_figure(ops, top=3, value="delta_cpu_us")
    assert "#D55E00" in fig2.data[0].marker.color  # All2All_Pooled_Req costs more
    assert any(lbl.startswith("All2All_Pooled_Req") and lbl.endswith("(new)") for lbl in fig2.data[0].y)
    assert unique_labels(["void f<int>(int)", "void f<float>(float)", "g"]) == ["f", "f #2", "g"]


# ---------------------------------------------------------------------------------------------- panel


def test_compare_panel_from_traces_and_errors(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.panels.compare import ComparePanel

    p = ComparePanel.from_traces(BASE, TEST)
    assert p.last_error is None
    assert p.diff is not None and p.diff.kernel_delta_us == pytest.approx(-4.0)
    assert p.experiment_box.layout.display == "none"
    assert "appeared" in p.diff_summary_html.value and "All2All_Pooled_Req" in p.diff_ops.value
    assert len(p.diff_fig.data) == 1
    # swapping base and test flips the signs
    p.base.value, p.test.value = p.test.value, p.base.value
    assert p.diff.kernel_delta_us == pytest.approx(4.0)
    assert "wb-compare" in p._dom_classes and "wb-compare-base" in p.base._dom_classes

    bad = tmp_path / "broken.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a"'))
    p2 = ComparePanel.from_traces(BASE, bad)
    assert p2.last_error is not None and "broken.json.gz" in p2.last_error
    # what the panel cannot show raises before any widget is built, naming what fits
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match=r"this int: is not something a panel shows\. ComparePanel takes an "
                                             r"Experiment, a ledger DataFrame or a ledger file path"):
        ComparePanel(42)
    with pytest.raises(WorkbenchError, match=r"missing\.json: no such file\. ComparePanel takes"):
        ComparePanel(tmp_path / "missing.json")
    with pytest.raises(WorkbenchError) as err:
        ComparePanel(BASE)
    assert str(err.value) == (f"{BASE}: is one trace; ComparePanel compares two (or the rows of an experiment). "
                              "Use ProfilerPanel(path) for one trace, ComparePanel((base, test)) or "
                              "`workbench diff BASE TEST` for two")
    with pytest.raises(WorkbenchError, match=r"is a CUDA allocator snapshot, not what ComparePanel shows.*MemoryPanel"):
        ComparePanel((BASE, samples.path("h200_train_snapshot")))
    # a pair of traces is the diff view, as from_traces
    pair = ComparePanel((str(BASE), str(TEST)))
    assert pair.last_error is None and pair.diff.kernel_delta_us == pytest.approx(-4.0)
    # ComparePanel(base, test) is the same panel (no TypeError about a positional argument)
    two = ComparePanel(str(BASE), str(TEST))
    assert two.last_error is None and two.diff.kernel_delta_us == pytest.approx(-4.0)
    assert list(two._trace_sources) == list(pair._trace_sources)
    with pytest.raises(WorkbenchError, match=r"ComparePanel\(base, test\) takes two traces"):
        ComparePanel((str(BASE), str(TEST)), str(TEST))


def test_compare_panel_diff_leads_with_what_changed():
    """The streams pair in the panel: the headline (memcpy 57.0 -> 1.3 ms) and the change table come
    before the findings, which come before the kernel tables; 'per step' halves every total (2 steps)."""
    pytest.importorskip("ipywidgets")
    from workbench.panels.compare import ComparePanel

    p = ComparePanel((samples.path("h200_streams_serial"), samples.path("h200_streams_overlap")))
    assert p.last_error is None
    v = p.diff_summary_html.value
    assert "What changed:</b> memcpy/memset 57.0 -&gt; 1.3 ms" in v
    assert v.index("wb-diff-changes") < v.index("wb-diff-findings")
    # (no new finding: the sync_bound the overlapped trace had predicted a step below its GPU busy time;
    # what-ifs are clamped there now, issue 32)
    assert "wb-diff-finding-eased" in v and "memcpy_heavy" in v
    kids = list(p.diff_box.children)
    assert kids.index(p.diff_summary_html) < kids.index(p.diff_fig_box) < kids.index(p.diff_kernels)
    # tables: ms with units in the headers, no snake_case
    assert "<th style='padding:2px 8px;text-align:left;white-space:nowrap'>change ms</th>" in p.diff_kernels.value
    assert "download='diff_kernels.csv'" in p.diff_kernels.value and "download='diff_ops.csv'" in p.diff_ops.value
    assert "total_us" not in p.diff_kernels.value and "delta_cpu_us" not in p.diff_ops.value
    total_mem = p.diff.breakdown("base")["memory_us"]
    p.per_step.value = True
    assert p.last_error is None and p.diff.normalize == "per_step"
    assert p.diff.breakdown("base")["memory_us"] == pytest.approx(total_mem / 2)
    assert "memcpy/memset 28.5 -&gt; 0.7 ms" in p.diff_summary_html.value and "per step" in p.diff_summary_html.value


def test_compare_panel_on_a_ledger_file(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.panels.compare import ComparePanel

    rows = _rows()
    rows[0]["trace_path"] = str(BASE)  # absolute
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "test.json.gz").write_bytes(TEST.read_bytes())
    rows[2]["trace_path"] = "traces/test.json.gz"  # relative to the ledger file
    path = save_ledger(ledger_frame(rows), tmp_path / "ledger.json")
    p = ComparePanel(path)
    assert p.last_error is None
    assert p.baseline.options == ("fp32", "tf32", "amp_bf16", "checkpoint(Block)")
    assert "★ a / fp32" in p.table_html.value and "wb-compare-baseline-row" in p.table_html.value
    assert "vanishing_updates" in p.verdicts.value and "37% vanish" in p.verdicts.value
    speed_before = p.bars.data[0].text
    p.baseline.value = "amp_bf16"
    assert p.table.set_index("label").loc["a / amp_bf16", "is_baseline"]
    assert p.bars.data[0].text != speed_before
    assert "★ a / amp_bf16" in p.table_html.value
    # two rows carry traces: the diff view is on
    assert p.base.options == ("a / fp32", "a / amp_bf16") and p.diff is not None
    assert p.diff.kernel_delta_us == pytest.approx(-4.0)


def test_compare_panel_hides_what_it_cannot_draw():
    pytest.importorskip("ipywidgets")
    from workbench.panels.compare import ComparePanel

    # a ledger without traces: the table and bars show, the diff's pickers, figure and tables are hidden
    p = ComparePanel(ledger_frame(_rows()[:4]))
    assert p.last_error is None and p.diff is None
    assert p.bars_box.layout.display != "none" and len(p.bars.data) == 4
    for w in (p.diff_fig_box, p.diff_kernels, p.diff_ops, p.diff_choice):
        assert w.layout.display == "none"
    assert "No traces recorded for these rows" in p.diff_summary_html.value
    assert "trace=True" in p.diff_summary_html.value

    # one row with a trace: still no diff, and the text names that row
    rows = _rows()[:4]
    rows[1]["trace_path"] = str(BASE)
    p1 = ComparePanel(ledger_frame(rows))
    assert p1.diff is None and p1.diff_fig_box.layout.display == "none"
    assert "Only one row has a trace (tf32)" in p1.diff_summary_html.value

    # every row failed: no measured metric, the bars are hidden and the note says why
    failed = [dict(r, status="oom", step_ms_median=None, step_ms_q1=None, step_ms_q3=None,
                   peak_allocated_bytes=None, samples_per_s=None, energy_j_per_step=None) for r in _rows()[:2]]
    pf = ComparePanel(ledger_frame(failed))
    assert pf.bars_box.layout.display == "none" and pf.bars_note.layout.display != "none"
    assert "no measured metric" in pf.bars_note.value

    # two traces, no experiment: the experiment box and its bars are hidden, the diff shows
    pt = ComparePanel.from_traces(BASE, TEST)
    assert pt.experiment_box.layout.display == "none" and pt.bars_box.layout.display == "none"
    assert len(pt.bars.data) == 0
    assert pt.diff_fig_box.layout.display != "none" and len(pt.diff_fig.data) == 1
    assert pt.diff_choice.layout.display != "none"
    assert "CPU-only" not in pt.diff_summary_html.value

    # two CPU-only traces: no kernels, so the kernel figure and table are hidden and the text says why
    cpu = samples.path("cpu_only")
    pc = ComparePanel.from_traces(cpu, cpu)
    assert pc.last_error is None and pc.diff is not None and pc.diff.kernels.empty
    assert pc.diff_fig_box.layout.display == "none" and pc.diff_kernels.layout.display == "none"
    assert len(pc.diff_fig.data) == 0
    assert "CPU-only traces: no GPU kernels to compare; see the operator table" in pc.diff_summary_html.value
    assert pc.diff_ops.layout.display != "none" and "<b>Operators</b>" in pc.diff_ops.value
    assert not pc.diff.ops.empty

    # a CPU-only test against a GPU base still has kernels (all gone): the figure comes back
    pg = ComparePanel.from_traces(samples.path("h200_train_step"), cpu)
    assert pg.diff_fig_box.layout.display != "none" and len(pg.diff_fig.data) == 1


def test_compare_panel_from_experiment_runs_the_experiment():
    pytest.importorskip("ipywidgets")
    torch = pytest.importorskip("torch")
    from workbench import ComparePanel, Workload, configs

    work = Workload(model=lambda: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)),
                    batch=lambda n, dev: torch.randn(n, 32, device=dev),
                    loss=lambda m, x: m(x).square().mean(), batch_size=8)
    p = ComparePanel.from_experiment(work, [configs.fp32(), configs.amp_bf16()], steps=2, warmup=1, check_steps=1, progress=False)
    assert p.last_error is None
    assert list(p.table["configuration"]) == ["fp32", "amp_bf16"] and p.baseline.value == "fp32"
    assert bool(p.table.loc[p.table["configuration"] == "fp32", "is_baseline"].iloc[0])
    assert "amp_bf16" in p.table_html.value and "Numerical check" in p.verdicts.value
