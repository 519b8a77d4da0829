"""Shared fixtures and the rules for the `gpu` and `browser` markers.

`gpu` tests need a CUDA device (torch) and the NVML library; elsewhere they are skipped with the
reason. `browser` tests need /usr/bin/chromium (make test installs it) and Playwright.
"""

from __future__ import annotations

import os
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from testdata import DATA, ROOT, data_path  # noqa: F401  (re-exported for fixtures below)


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound and friends
        return f"NVML not available: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_unavailable_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
        if "browser" in item.keywords and not shutil.which("chromium"):
            item.add_marker(pytest.mark.skip(reason="browser test: /usr/bin/chromium not found (make test installs it)"))


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture(autouse=True)
def _no_stray_threads_across_tests():
    """Samplers and panels must end their threads; fail the test that leaks one."""
    import threading

    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [
        t for t in threading.enumerate()
        if t.ident not in before and t.is_alive() and t.name.startswith("workbench")
    ]
    for t in leaked:
        t.join(timeout=2.0)
    leaked = [t for t in leaked if t.is_alive()]
    assert not leaked, f"threads left running: {[t.name for t in leaked]}"


# the shipped H200 snapshots, analysed once per test module (tests/test_memory_analysis.py,
# tests/test_memory_compare.py)
@pytest.fixture(scope="module")
def train():
    from workbench import samples
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.io.snapshot import load_snapshot

    return analyze_snapshot(load_snapshot(samples.path("h200_train_snapshot")))


@pytest.fixture(scope="module")
def oom():
    from workbench import samples
    from workbench.analysis.memory.oom import analyze_snapshot
    from workbench.io.snapshot import load_snapshot

    return analyze_snapshot(load_snapshot(samples.path("h200_oom_snapshot")))
