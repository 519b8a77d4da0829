"""torch.compile seen (docs/compile.md): the compile block's counts against dynamo's own counters, and the
what-ifs against the fixes measured without the profiler, on the recorded pairs of
benchmarks/record_compile_pairs.py (tests/data/compile_pairs/<backend>-<device>/; the H200 ones come from
benchmarks/record_compile_h200.py). A live capture checks the stamp, the TORCH_TRACE reader and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.analysis.trace.analysis import TraceAnalysis
from workbench.analysis.trace.compile import recompile_whatif, summarize

DATA = Path(__file__).parent / "data" / "compile_pairs"
PAIRS = sorted(p for p in DATA.iterdir() if (p / "measured.json").is_file()) if DATA.is_dir() else []
TOL = 0.25
# the recompile what-if on a static recording where it misses, and why (checked both ways: a miss that
# closes fails). The auto pair of the same backend holds (test_auto_recompile_whatif_reads_the_dynamic_compile).
RECOMPILE_GAPS = {"aot_eager-cpu": "the dynamic=False recording holds static compiles only, and the one dynamic "
                                   "compile of the fix cost aot_eager 1.8x the first static one (418 vs 237 ms: "
                                   "symbolic shapes in the trace, where the backend does little else); the "
                                   "what-if says its prediction is then a lower bound"}


def _measured(d: Path) -> dict:
    return json.loads((d / "measured.json").read_text())


@pytest.fixture(params=PAIRS, ids=[p.name for p in PAIRS])
def pair(request) -> Path:
    return request.param


def test_pairs_are_recorded():
    assert {"aot_eager-cpu", "inductor-cpu"} <= {p.name for p in PAIRS}


def test_break_counts_are_dynamos(pair):
    s = TraceAnalysis(pair / "break.pt.trace.json.gz").compile
    c = s.counters
    assert s.graphs == c["unique_graphs"] == 2
    assert s.graph_break_count == c["graph_breaks"] == 1
    (b,) = s.graph_breaks
    assert b["reason"].startswith("Unsupported Tensor.item() call")
    assert b["file"] == "record_compile_pairs.py" and b["count"] == 1
    src = (Path(__file__).parents[1] / "benchmarks" / "record_compile_pairs.py").read_text().splitlines()
    assert ".item()" in src[b["line"] - 1] and b["code"] in src[b["line"] - 1]
    fixed = TraceAnalysis(pair / "fixed.pt.trace.json.gz").compile
    assert fixed.graphs == fixed.counters["unique_graphs"] == 1 and fixed.graph_breaks == []


def test_break_whatif_predicts_the_fix(pair):
    m = _measured(pair)
    a = TraceAnalysis(pair / "break.pt.trace.json.gz")
    w = a.compile_whatifs["graph_breaks"]
    predicted = m["break_step_ms"] * (1.0 - w.saved_fraction)
    assert abs(predicted / m["fixed_step_ms"] - 1.0) <= TOL, (predicted, m["fixed_step_ms"])
    f = next(f for f in a.findings if f.id == "graph_breaks")
    assert "record_compile_pairs.py:" in f.message and f.what_if is not None


def test_recompile_counts_and_whatif(pair):
    m = _measured(pair)
    s = summarize(json.loads((pair / "recompile.compile.json").read_text()))
    n_lengths = len(set(m["lengths"]))
    assert s.graphs == s.counters["unique_graphs"] == n_lengths
    assert s.compiles == n_lengths and s.recompile_count == n_lengths - 1
    assert s.steps_until_stable == n_lengths and s.steps_until_stable_from == "calls"
    assert all("size mismatch" in r["reason"] for r in s.recompiles)
    w = recompile_whatif(s)
    fixed = w.evidence["calls_ms_if_fixed"]
    # no compile had a symbolic size: the fix's dynamic compile is assumed to cost the first static one, and
    # the what-if says the prediction is a lower bound (it holds, within the recordings' noise)
    assert all(r["dynamic_sizes"] == [] for r in s.compile_list)
    assert w.evidence["kept_compile_from"] == "static" and "lower bound" in w.evidence["assumes"]
    assert m["dynamic_calls_ms"] >= fixed * (1.0 - TOL), (fixed, m["dynamic_calls_ms"])
    within = abs(fixed / m["dynamic_calls_ms"] - 1.0) <= TOL
    if pair.name in RECOMPILE_GAPS:
        assert not within, f"{pair.name} is within {TOL:.0%} now: take it out of RECOMPILE_GAPS"
    else:
        assert within, (fixed, m["dynamic_calls_ms"])
    d = summarize(json.loads((pair / "dynamic.compile.json").read_text()))
    assert d.compiles == 1 and d.recompiles == [] and d.steps_until_stable == 1   # lengths above 32 (module doc)


def test_auto_recompile_whatif_reads_the_dynamic_compile(pair):
    """torch's default (dynamic=None): the first change of length recompiles the frame with that size symbolic
    (dynamo's automatic dynamic shapes), and no length compiles after it. The what-if keeps that dynamic
    compile, as recorded, and saves the static one: against dynamic=True timed in the same run."""
    if not (pair / "auto.compile.json").is_file():
        pytest.skip(f"{pair.name} has no auto pair yet: python benchmarks/record_compile_pairs.py --only auto "
                    "(benchmarks/record_compile_h200.py --only auto for inductor-cuda)")
    m = _measured(pair)
    s = summarize(json.loads((pair / "auto.compile.json").read_text()))
    assert s.graphs == s.counters["unique_graphs"] == 2 and s.compiles == 2 and s.recompile_count == 1
    assert s.steps_until_stable == 2 and "size mismatch at index 0" in s.recompiles[0]["reason"]
    first, second = s.compile_list
    assert first["dynamic_sizes"] == [] and second["dynamic_sizes"] == ["L['x'].size()[0]"]
    assert (first["call"], second["call"]) == (0, 1)
    w = recompile_whatif(s)
    e = w.evidence
    assert e["kept_compile_from"] == "dynamic" and e["assumes"] is None and e["dynamic_sizes"] == ["L['x'].size()[0]"]
    assert "L['x'].size()[0]" in w.change
    # the calls without the static compile: the first call's wall time beyond a stable call
    stable = sorted(c["ms"] for c in s.calls[2:])[len(s.calls[2:]) // 2]
    assert e["calls_ms_if_fixed"] == pytest.approx(m["auto_calls_ms"] - (s.calls[0]["ms"] - stable), abs=0.01)
    assert abs(e["calls_ms_if_fixed"] / m["auto_dynamic_calls_ms"] - 1.0) <= TOL, (e, m["auto_dynamic_calls_ms"])
    d = summarize(json.loads((pair / "auto_dynamic.compile.json").read_text()))
    assert d.compiles == 1 and d.recompiles == [] and "L['x'].size()[0]" in d.compile_list[0]["dynamic_sizes"]


def test_payback_predicts_the_cold_run(pair):
    m = _measured(pair)
    p = TraceAnalysis(pair / "fixed.pt.trace.json.gz").compile_whatifs["compile_cost"]
    n = m["cold_steps"]
    predicted = p["compile_ms"] + n * p["compiled_step_ms"]
    assert abs(predicted / m["cold_compiled_total_ms"] - 1.0) <= TOL, (predicted, m["cold_compiled_total_ms"])
    if p["steps_to_pay_back"] is None:   # compiled is slower: eager stays ahead
        assert m["cold_compiled_total_ms"] > m["eager_total_ms"]


def test_json_block(pair):
    doc = TraceAnalysis(pair / "break.pt.trace.json.gz").summary()
    c = doc["compile"]
    for key in ("graphs", "graph_breaks", "recompiles", "compile_ms", "steps_until_stable"):
        assert key in c
    assert {"reason", "file", "line", "count"} <= set(c["graph_breaks"][0])
    assert c["regions_per_step"] == 2
    json.dumps(doc)


# ------------------------------------------------------------------------------------- live capture


def test_live_capture_stamp_log_and_cli(tmp_path):
    torch = pytest.importorskip("torch")
    from workbench.capture.profiler import profile_steps

    script = tmp_path / "job.py"
    script.write_text(
        "import torch, sys\n"
        "from workbench.capture.profiler import profile_steps\n"
        "torch.set_num_threads(1)\n"
        "def f(x):\n"
        "    y = torch.relu(x) * 2\n"
        "    print('', end='')\n"
        "    return torch.tanh(y).sum()\n"
        "cf = torch.compile(f, backend='eager')\n"
        "shapes = iter([4, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6])\n"
        "r = profile_steps(lambda: cf(torch.randn(next(shapes), 3)), steps=2, device='cpu', path=sys.argv[1],\n"
        "                  progress=False, verbose=False)\n"
    )
    trace = tmp_path / "t.pt.trace.json.gz"
    env = dict(os.environ, TORCH_TRACE=str(tmp_path / "log"), PYTHONPATH=str(Path(__file__).parents[1]))
    subprocess.run([sys.executable, str(script), str(trace)], check=True, env=env, capture_output=True, timeout=300)
    a = TraceAnalysis(trace)
    s = a.compile
    assert s.graph_break_count == s.counters["graph_breaks"] >= 1
    assert s.graphs == s.counters["unique_graphs"]
    assert s.graph_breaks[0]["file"] == str(script) and s.graph_breaks[0]["line"] == 6
    assert s.recompile_count >= 1 and s.steps_until_stable >= 2
    # the same run's TORCH_TRACE folder gives the same counts
    from workbench.io.compile_log import load_compile_log

    log = summarize(load_compile_log(tmp_path / "log"))
    assert (log.graphs, log.graph_break_count, log.recompile_count, log.compiles) == \
        (s.graphs, s.graph_break_count, s.recompile_count, s.compiles)
    assert [b["line"] for b in log.graph_breaks] == [b["line"] for b in s.graph_breaks]
    # the first change of length made dynamo recompile with it symbolic (automatic dynamic shapes): both say so
    assert [(r["id"], r["dynamic_sizes"]) for r in log.compile_list] == [(r["id"], r["dynamic_sizes"]) for r in s.compile_list]
    assert any(r["dynamic_sizes"] == ["L['x'].size()[0]"] for r in s.compile_list)
    assert sum(c["compiles"] for c in s.calls) == len(s.compile_list) and all(r["call"] is not None for r in s.compile_list)
    # the CLI reads the folder with --compile-log
    out = subprocess.run([sys.executable, "-m", "workbench", "trace", str(trace), "--json", "--compile-log",
                          str(tmp_path / "log")], check=True, capture_output=True, text=True, env=env, timeout=300)
    block = json.loads(out.stdout)["compile"]
    assert block["source"] == "torch_trace" and block["graphs"] == s.graphs
    bad = subprocess.run([sys.executable, "-m", "workbench", "trace", str(trace), "--compile-log",
                          str(tmp_path / "nothing")], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "nothing" in bad.stderr


def test_timeline_shows_the_compiled_regions():
    from workbench.figures.trace import COMPILE_LANE, COMPILE_TRACE_NAME, timeline_figure
    from workbench.panels.profiler import ProfilerPanel

    a = TraceAnalysis(DATA / "aot_eager-cpu" / "break.pt.trace.json.gz")
    regions = a.compile_regions
    assert len(regions) == 2 * len(a.steps) and set(regions["depth"]) == {0, 1}
    fig = timeline_figure(a.trace, regions=regions)
    (tr,) = [d for d in fig.data if d.name == COMPILE_TRACE_NAME]
    assert len(tr.x) == 3 * len(regions)
    assert fig.layout.yaxis.ticktext[0] == COMPILE_LANE
    panel = ProfilerPanel(a.trace)
    from workbench.panels.profiler import TABS

    panel.tabs.selected_index = [k for k, _ in TABS].index("timeline")
    assert panel.tab == "timeline"
    names = [d.name for d in panel.figures["timeline"].fig.data]
    assert COMPILE_TRACE_NAME in names
    assert "torch.compile: 2 graphs, 1 graph break, 0 recompiles" in panel.status.value
    # a trace without torch.compile draws no such lane
    plain = timeline_figure(TraceAnalysis(DATA / "aot_eager-cpu" / "fixed.pt.trace.json.gz").trace, regions=None)
    assert COMPILE_TRACE_NAME not in [d.name for d in plain.data]


def test_record_run_stamps_what_compiled(tmp_path):
    """%%workbench and TimelinePanel go through record_run: its trace carries the stamp too, with one call
    per run.step()."""
    torch = pytest.importorskip("torch")
    from workbench.capture.session import record_run

    def f(x):
        y = x.sin()
        if y.sum().item() > 1e9:   # a graph break (line checked below)
            y = y * 0
        return y.cos()

    line = f.__code__.co_firstlineno + 2
    cf = torch.compile(f, backend="eager")
    with record_run(tmp_path, detail="light") as run:
        for _ in range(3):
            cf(torch.randn(8))
            run.step()
    s = TraceAnalysis(run.result.trace).compile
    assert s is not None and len(s.calls) == 3
    # every compile fell in one of the calls; the last call compiled nothing
    assert sum(c["compiles"] for c in s.calls) == s.compiles == s.counters["frames"]
    assert s.calls[-1]["compiles"] == 0 and s.steps_until_stable in (1, 2)
    assert s.graph_break_count == s.counters["graph_breaks"] >= 1
    assert s.graph_breaks[0]["file"] == __file__ and s.graph_breaks[0]["line"] == line
    assert s.graphs == s.counters["unique_graphs"]


def test_backward_compile_counts_in_compile_time():
    """A training graph's backward is compiled at the first backward: its time joins the frame's."""
    torch = pytest.importorskip("torch")
    from workbench.capture.compile import CompileRecorder

    torch._dynamo.reset()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    cm = torch.compile(m, backend="aot_eager")
    with CompileRecorder() as rec:
        for _ in range(2):
            cm(torch.randn(4, 8)).sum().backward()
            rec.call()
    stamp = rec.stamp()
    kinds = [r["kind"] for r in stamp["records"]]
    s = summarize(stamp)
    fwd = sum(r["metrics"]["entire_frame_compile_time_s"] - (r["metrics"].get("structured_logging_overhead_s") or 0)
              for r in stamp["records"] if r["kind"] == "compilation_metrics") * 1e3
    bwd = sum((r["metrics"].get("entire_frame_compile_time_s") or r["metrics"].get("inductor_compile_time_s") or 0.0)
              for r in stamp["records"] if r["kind"] == "bwd_compilation_metrics") * 1e3
    assert "bwd_compilation_metrics" in kinds   # dynamo logs the lazy backward compile (its time: inductor's)
    assert s.compile_ms == pytest.approx(fwd + bwd, rel=1e-6)
    assert s.frames[0].get("backward_compile_ms", 0.0) == pytest.approx(bwd, abs=1e-3)
    assert s.graphs == stamp["counters"]["unique_graphs"] == 1


def test_recompile_whatif_with_two_frames_compiling_in_one_call():
    """A graph break makes each call compile two frames (the function and the frame dynamo resumes in); with
    torch's default the first change of length recompiles both with the length symbolic. The compile list
    gives each compile its call, the costs split each call's wall time between its compiles, and the what-if
    keeps each frame's dynamic compile."""
    torch = pytest.importorskip("torch")
    from workbench.analysis.trace.compile import compile_costs, compiled_step_ms
    from workbench.capture.compile import CompileRecorder

    def f(x):
        y = x.sin()
        if y.sum().item() > 1e9:   # a graph break
            y = y * 0
        return y.cos() + x.shape[0]

    torch._dynamo.reset()
    cf = torch.compile(f, backend="eager")
    import time

    with CompileRecorder() as rec:
        for n in [5, 7, 9, 11, 13, 5, 7, 9]:
            x = torch.randn(n, 3)
            t0 = time.perf_counter()
            cf(x)
            rec.call((time.perf_counter() - t0) * 1e3)
    s = summarize(rec.stamp())
    assert s.recompile_count >= 2 and len({r["frame"] for r in s.compile_list}) >= 2
    assert sum(c["compiles"] for c in s.calls) == len(s.compile_list) == s.compiles
    assert [r["call"] for r in s.compile_list] == sorted(r["call"] for r in s.compile_list)
    assert max(c["compiles"] for c in s.calls) >= 2   # a call that compiled two frames
    recompiled = {r["frame"] for r in s.compile_list if r["compile"] and r["compile"] > 0}
    for fr in recompiled:   # each frame that recompiled did so with the length symbolic
        rows = [r for r in s.compile_list if r["frame"] == fr]
        assert rows[0]["dynamic_sizes"] == [] and rows[1]["dynamic_sizes"]
    stable = compiled_step_ms(s)
    cost = compile_costs(s, stable)
    for i, c in enumerate(s.calls):
        idx = [k for k, r in enumerate(s.compile_list) if r["call"] == i]
        if idx:   # every compile at least dynamo's own time, the call's compiles at least its wall beyond stable
            assert all(cost[k] >= s.compile_list[k]["compile_ms"] for k in idx)
            assert sum(cost[k] for k in idx) >= c["ms"] - stable - 1e-6
    w = recompile_whatif(s)
    assert w.evidence["kept_compile_from"] == "dynamic" and w.evidence["assumes"] is None
    static = [k for k, r in enumerate(s.compile_list) if r["frame"] in recompiled and not r["dynamic_sizes"]]
    assert w.evidence["calls_ms_if_fixed"] == pytest.approx(w.evidence["calls_ms"] - sum(cost[k] for k in static),
                                                            abs=0.01)
