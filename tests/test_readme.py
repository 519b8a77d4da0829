"""The README's code runs as written: the tour on the shipped samples, and "Profile your own step" on a CPU."""

from __future__ import annotations

import ast
import os
import re
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

pytest.importorskip("ipywidgets")


def _block(heading: str) -> str:
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


class _Shown(ast.NodeTransformer):
    """A bare expression at cell level (also inside if/else) becomes ``__shown__.append(expr)``: what a
    notebook would display. Function bodies and with-blocks are left as they are."""

    def visit_Expr(self, node):
        call = ast.parse("__shown__.append(None)").body[0]
        call.value.args = [node.value]
        return ast.copy_location(call, node)

    def visit_FunctionDef(self, node):
        return node

    def visit_With(self, node):
        return node


def _run(code: str) -> tuple[dict, list]:
    """Execute ``code`` as a notebook cell would; return its namespace and the displayed values."""
    tree = ast.fix_missing_locations(_Shown().visit(ast.parse(code)))
    ns: dict = {"__shown__": []}
    exec(compile(tree, str(README), "exec"), ns)  # noqa: S102 - the README's own code
    return ns, ns["__shown__"]


def test_the_tour_uses_only_the_front_door_and_runs():
    code = _block("A short tour")
    imports = [n for n in ast.walk(ast.parse(code)) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "workbench" for n in imports)
    ns, shown = _run(code)
    live = shown[2]
    try:
        profiler, memory, live, (bound, trace_ids), (cause, memory_ids) = shown
        assert profiler.last_error is None and "NVIDIA H200" in profiler.status.value
        assert memory.oom is not None and memory.oom.cause == "capacity"
        assert live.sampler.running
        # the analysis objects are what the panels read: the same findings, the same cause
        assert bound == profiler.analysis.diagnosis.bound
        assert trace_ids == [f.id for f in profiler.analysis.findings] and trace_ids
        assert cause == memory.oom.cause and memory_ids == [f.id for f in memory.analysis.findings]
    finally:
        live.close()


def test_profile_your_own_step_runs_on_a_cpu_as_written(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the README on a CPU")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORKBENCH_TRACE_DIR", str(tmp_path / "traces"))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    code = _block("Profile your own step")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns, shown = _run(code)
    profiler, memory = shown
    res = ns["res"]
    assert res.path.is_file() and res.steps == 3 and str(res.path).startswith(str(tmp_path))
    assert profiler.last_error is None and profiler.result is res
    assert [label for label, _ in profiler.step.options][1:] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    assert "aten::addmm" in set(profiler.table_frames["ops"]["name"])
    assert memory.last_error is None and memory.analysis.peak["allocated_bytes"] > 0
    # capture_oom without CUDA: armed handle that says so once, writes nothing
    assert ns["oom"].dumps == [] and any("no CUDA device" in str(w.message) for w in caught)
