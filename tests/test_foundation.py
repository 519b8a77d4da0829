"""The package installs, imports in layers, and its CLI and samples work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import workbench
from workbench import samples
from workbench.errors import BadArtifact, MissingDependency, NoDevice, NoNVML, UnsafePickle, WorkbenchError

BLOCKED = ("torch", "pynvml", "ipywidgets")


def _run_blocked(code: str) -> subprocess.CompletedProcess:
    prelude = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in BLOCKED)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_analysis_figures_io_report_import_without_torch_pynvml_ipywidgets():
    r = _run_blocked(
        """
        import pkgutil, importlib
        import workbench, workbench.io, workbench.analysis, workbench.figures, workbench.report
        for pkg in (workbench.io, workbench.analysis, workbench.figures):
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(m.name)
        for m in ("torch", "pynvml", "ipywidgets"):
            assert sys.modules.get(m) is None, m
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_cli_help_without_torch_pynvml_ipywidgets():
    r = _run_blocked("import runpy, sys; sys.argv=['workbench','--help']; runpy.run_module('workbench', run_name='__main__')")
    assert r.returncode == 0, r.stderr
    assert "usage: workbench" in r.stdout


def test_import_workbench_is_light():
    r = subprocess.run(
        [sys.executable, "-c", "import sys, workbench; print(sorted(m for m in ('torch','plotly','ipywidgets','pandas','pynvml') if m in sys.modules))"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


FRONT_DOOR = [  # issue 30: the names the README or the tour types (tests/test_front_door.py), about 27
    "load_trace", "load_traces", "load_snapshot", "load_nvml_session", "TraceAnalysis", "MemoryAnalysis",
    "profile_steps", "profile", "record_memory_history", "capture_oom", "run_experiment", "Workload",
    "Configuration", "configs", "estimate", "largest_batch_that_fits", "ProfilerPanel", "MemoryPanel",
    "LiveGpuPanel", "EstimatePanel", "ComparePanel", "RanksPanel", "TimelinePanel", "load_ranks", "record_run",
    "align", "samples", "format_bytes",
]


def test_front_door_panel_loads_no_torch():
    # the check of issue 15, as written
    r = subprocess.run([sys.executable, "-c", "import workbench, sys; workbench.ProfilerPanel; print('torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_front_door_names_are_the_objects_of_their_modules():
    import importlib
    import inspect

    assert set(FRONT_DOOR) <= set(workbench.__all__) and set(FRONT_DOOR) <= set(dir(workbench))
    for name in set(workbench.__all__) - {"__version__"}:
        obj = getattr(workbench, name)
        if name == "samples":
            assert obj is importlib.import_module("workbench.samples")
            continue
        home = workbench._FRONT_DOOR[name]
        defined_in = getattr(obj, "__module__", None)
        assert defined_in and defined_in == home, (name, defined_in)
        assert not inspect.ismodule(obj), name
    # the layers stay reachable as attributes
    for layer in ("capture", "io", "analysis", "figures", "panels", "report", "errors"):
        assert getattr(workbench, layer) is importlib.import_module(f"workbench.{layer}")
    with pytest.raises(AttributeError, match="no attribute 'ProfilerPanle'"):
        workbench.ProfilerPanle  # noqa: B018


def test_front_door_estimate_is_the_function_whatever_was_imported_first():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import importlib, workbench
        importlib.import_module("workbench.capture.estimate")   # the module that defines it loads first
        from workbench import estimate, largest_batch_that_fits
        assert callable(workbench.estimate) and workbench.estimate is estimate, workbench.estimate
        assert estimate.__name__ == "estimate" and largest_batch_that_fits.__name__ == "largest_batch_that_fits"
        print("ok")
        """)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_version_and_help_from_console_script():
    exe = [sys.executable, "-m", "workbench"]
    v = subprocess.run(exe + ["--version"], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.strip() == f"gpu-workbench {workbench.__version__}"
    h = subprocess.run(exe + ["--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0
    for cmd in ("lab",):
        assert cmd in h.stdout


def test_cli_without_command_exits_2():
    r = subprocess.run([sys.executable, "-m", "workbench"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "give a command" in lines[0] and "--help" in lines[0], r.stderr


def test_import_contracts_hold():
    """import-linter's contracts in pyproject.toml: layers point down; analysis/figures/io never reach torch."""
    import shutil
    exe = shutil.which("lint-imports", path=str(__import__("pathlib").Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports not installed (pip install -e '.[test]')")
    r = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_error_family():
    for cls in (BadArtifact, UnsafePickle, MissingDependency, NoDevice, NoNVML):
        assert issubclass(cls, WorkbenchError)
    e = BadArtifact("x.json.gz", "truncated gzip stream", "re-copy the file")
    assert str(e) == "x.json.gz: truncated gzip stream. re-copy the file"
    m = MissingDependency("holistictraceanalysis", "for the benchmark", "bench")
    assert "pip install 'gpu-workbench[bench]'" in str(m)


def test_optional_import_names_the_fix():
    from workbench._optional import import_optional

    with pytest.raises(MissingDependency, match="pip install"):
        import_optional("surely_not_a_module_xyz", "for this test")


def _sample_files(name):
    p = samples.path(name)  # a rank_folder sample is a folder of gzipped traces + truth.json
    return sorted(p.glob("*.gz")) if p.is_dir() else [p]


@pytest.mark.parametrize("name", samples.names())
def test_every_sample_exists_and_is_gzip(name):
    files = _sample_files(name)
    assert files, name
    for p in files:
        assert p.stat().st_size > 1000
        assert p.read_bytes()[:2] == b"\x1f\x8b", f"{p} is not gzip"


def test_samples_kinds_and_unknown_name():
    assert set(samples.names("trace")) >= {"h200_train_step", "cpu_only", "a100_alexnet", "v100_nccl_rank0"}
    assert set(samples.names("snapshot")) == {"h200_train_snapshot", "h200_oom_snapshot", "h200_timeline_snapshot"}
    with pytest.raises(WorkbenchError, match="choose one of"):
        samples.path("nope")
    assert "h200_oom_snapshot" in samples.describe()


def test_samples_are_small():
    total = sum(p.stat().st_size for n in samples.names() for p in _sample_files(n))
    # 5 MB until lessons 16 and 18 (three GPT roofline traces with shapes, 1.5 MB, and the loader pairs)
    # + 37 kB for lesson 21: the checkpointing fix run's own allocator history
    assert total < 6_600_000, total
