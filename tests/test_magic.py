"""The %%workbench cell magic and %workbench monitor in a real IPython InteractiveShell (CPU torch here;
on a CUDA machine the same cells profile CUDA and record the allocator's history)."""

from __future__ import annotations


import pytest

pytest.importorskip("IPython")
torch = pytest.importorskip("torch")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from IPython.utils.capture import capture_output  # noqa: E402


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "workbench")
    yield shell
    shell.run_line_magic("unload_ext", "workbench")


def _steps(trace_path) -> list[str]:
    """The steps the loader reads (torch opens one more ProfilerStep at the last step() call; the capture
    marks it in the trace's metadata and the loader leaves it out)."""
    from workbench.io import load_trace

    names = load_trace(trace_path).events["name"].astype(str)
    return sorted({n for n in names if n.startswith("ProfilerStep#")})


def test_the_extension_registers_the_line_and_cell_magic(ip):
    magics = ip.magics_manager.magics
    assert "workbench" in magics["cell"] and "workbench" in magics["line"]


def test_a_profiled_cell_runs_in_the_notebook_namespace_and_shows_both_panels(ip, tmp_path):
    cell = (f"%%workbench --memory --nvml --steps 2 --out {tmp_path}\n"
            "a = torch.randn(128, 128)\n"
            "with torch.profiler.record_function('my_range'):\n"
            "    b = (a @ a).relu()\n"
            "total = float(b.sum())\n")
    ip.user_ns["torch"] = torch
    with capture_output() as cap:
        r = ip.run_cell(cell)
    assert r.success, r.error_in_exec
    assert isinstance(ip.user_ns["total"], float)          # the cell's variables are the notebook's
    run = ip.user_ns["_workbench_run"]
    assert run.complete and run.steps == 2 and run.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert run.trace.parent == tmp_path and run.trace.exists()
    assert _steps(run.trace) == ["ProfilerStep#0", "ProfilerStep#1"]
    # the paths are printed for the CLI
    assert f"trace: {run.trace}" in cap.stdout
    if not torch.cuda.is_available():
        assert run.memory_source == "profiler" and "CPU [memory] events" in cap.stdout
    shown = [o.data.get("text/plain", "") for o in cap.outputs]
    assert [s.split("(")[0] for s in shown] == ["ProfilerPanel", "TimelinePanel"]   # the diagnosis first
    from workbench.analysis.timeline import align
    from workbench.panels.timeline import resolve_sources

    tl = align(*resolve_sources(**run.sources()))
    names = set(tl.annotations["name"])
    assert {"my_range", "ProfilerStep#0", "ProfilerStep#1"} <= names
    assert tl.memory is not None and len(tl.memory) > 0   # allocations of the cell, on the trace's clock
    peak_at = tl.annotation_at(tl.memory_peak["time_ns"])
    assert peak_at is not None and peak_at["name"] in names


def test_an_error_in_the_cell_propagates_unchanged_and_the_partial_capture_is_kept(ip, tmp_path):
    ip.user_ns["torch"] = torch
    cell = (f"%%workbench --memory --out {tmp_path}\n"
            "x = torch.ones(64) * 2\n"
            "err = KeyError('boom')\n"
            "raise err\n")
    with capture_output() as cap:
        r = ip.run_cell(cell)
    assert not r.success
    assert r.error_in_exec is ip.user_ns["err"]            # the very exception the cell raised
    run = ip.user_ns["_workbench_run"]
    assert not run.complete and run.trace is not None and run.trace.exists()
    assert "partial capture kept" in cap.stdout and str(run.trace) in cap.stdout
    assert ip.user_ns["x"].tolist() == [2.0] * 64          # what ran before the error did run


def test_bad_arguments_are_a_usage_error_not_a_traceback(ip):
    from IPython.core.error import UsageError

    for line in ("--detail heavy", "--steps 0", "--bogus"):
        with capture_output():
            r = ip.run_cell(f"%%workbench {line}\nx = 1\n")
        assert isinstance(r.error_in_exec, UsageError), (line, r.error_in_exec)


def test_workbench_monitor_opens_the_live_panel(ip):
    with capture_output() as cap:
        r = ip.run_cell("%workbench monitor --replay h200_gpm_session --no-dock")
    assert r.success, r.error_in_exec
    assert r.result is None  # not shown a second time as the cell's result
    panel = ip.user_ns["_workbench_monitor"]
    try:
        assert type(panel).__name__ == "LiveGpuPanel" and panel.counters
        shown = [o for o in cap.outputs if "LiveGpuPanel" in o.data.get("text/plain", "")]
        assert len(shown) == 1, cap.outputs
    finally:
        panel.close()
