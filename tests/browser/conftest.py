"""Fixtures for the browser tests: one JupyterLab and one headless Chromium per pytest session.

- ``lab_root``: a temporary folder the server serves; it holds copies of ``tests/browser/panels.ipynb`` and
  of ``notebooks/`` (outputs cleared, cells tagged ``nbval-skip`` blanked as nbval would skip them), so a run
  never touches the repository.
- ``lab_server``: JupyterLab from this environment (``tests/jupyter_helpers.running_jupyter_lab``) on a free
  loopback port with a token, the news toast off and the notebook's windowing off (every cell in the DOM),
  no CUDA device visible and the network cut for its kernels (``offline_site/sitecustomize.py``).
- ``browser``: Debian's ``/usr/bin/chromium`` driven by Playwright, host names other than loopback unresolvable.
- ``open_notebook(path)``: a ``LabNotebook`` page opened on a notebook under ``lab_root``, collecting console
  errors, page errors and requests that leave the machine. ``LabNotebook.close()`` closes the page and shuts its
  kernel down; whatever is still open is closed so at the end of the module that asked.

The time each notebook spent opening, running and being checked is printed at the end of the run
("browser notebook timings"; ``browser_helpers.TIMINGS``).

``WB_BROWSER_CPU_THROTTLE=N`` (N > 1) runs each page's main thread N times slower (Chromium's CPU throttling),
as on a loaded machine, to bring out races between the kernel and the page.

Screenshots go to ``build/screenshots/``; with ``WB_UPDATE_SCREENSHOTS=1`` they are copied to
``docs/screenshots/`` too (``make screenshots``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/, for jupyter_helpers
sys.path.insert(0, str(HERE))

from browser_helpers import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LAB_SETTINGS,
    NOTEBOOKS,
    PANELS_NOTEBOOK,
    TIMINGS,
    VIEWPORT,
    LabNotebook,
    prepare_notebook,
    watch,
)
from jupyter_helpers import running_jupyter_lab


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lab")
    if PANELS_NOTEBOOK.exists():
        prepare_notebook(PANELS_NOTEBOOK, root / PANELS_NOTEBOOK.name)
        # real before/after traces for the compare panel, at the relative path panels.ipynb uses
        shutil.copytree(HERE.parent / "data" / "trace_compare", root / "data" / "trace_compare")
        # the per-rank traces of a real gloo DDP run with a straggler, for the ranks panel
        shutil.copytree(HERE.parent.parent / "workbench" / "samples" / "ranks" / "straggler", root / "data" / "ranks" / "straggler")
    for nb in sorted(NOTEBOOKS.glob("*.ipynb")):
        prepare_notebook(nb, root / "notebooks" / nb.name)
    (root / "notebooks").mkdir(exist_ok=True)
    # data the notebooks may read by relative path; not their jupytext sources (src/, jupytext.toml): paired
    # with the prepared copies above, jupytext would refuse to open a copy that differs from its .py
    for other in NOTEBOOKS.iterdir():
        if other.name in ("src", "jupytext.toml"):
            continue
        if other.is_file() and other.suffix != ".ipynb":
            shutil.copy2(other, root / "notebooks" / other.name)
        elif other.is_dir() and not other.name.startswith("."):
            shutil.copytree(other, root / "notebooks" / other.name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return root


@pytest.fixture(scope="session")
def lab_server(lab_root, tmp_path_factory):
    settings = tmp_path_factory.mktemp("lab-settings")
    for rel, value in LAB_SETTINGS.items():
        (settings / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings / rel).write_text(json.dumps(value))
    env = {
        "WB_TEST_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE / "offline_site"), os.environ.get("PYTHONPATH")])),
        "CUDA_VISIBLE_DEVICES": "",  # run as Binder would, even on a GPU machine
        "OMP_NUM_THREADS": "1",
        "KINETO_LOG_LEVEL": "6",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    with running_jupyter_lab(lab_root, settings_dir=settings, env=env, timeout=90) as server:
        yield server


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found (make test installs it: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture(scope="session")
def browser_context(browser):
    """One browser context for every page: JupyterLab's scripts are fetched and compiled once (its HTTP and code
    caches are per context). Each page gets its own workspace, so no layout is carried over."""
    context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(scope="module")
def open_notebook(browser_context, lab_server, lab_root):
    """Factory: ``open_notebook("notebooks/00_tour.ipynb")`` -> an opened LabNotebook (closed, kernel shut down,
    by ``nb.close()`` or at the end of the module)."""
    pages: list[LabNotebook] = []

    def _open(path: str, timeout_s: float = 90) -> LabNotebook:
        if not (lab_root / path).exists():
            raise FileNotFoundError(f"{path} is not under the served folder {lab_root}")
        nb = LabNotebook(page=browser_context.new_page(), server=lab_server, root=lab_root, path=path)
        pages.append(nb)
        watch(nb)
        throttle = float(os.environ.get("WB_BROWSER_CPU_THROTTLE", "0") or 0)
        if throttle > 1:  # a loaded machine, for the page only: its main thread runs `throttle` times slower
            cdp = browser_context.new_cdp_session(nb.page)
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": throttle})
        return nb.open(timeout_s)

    yield _open
    for nb in pages:
        nb.close()


def pytest_terminal_summary(terminalreporter):
    if not TIMINGS:
        return
    tr = terminalreporter
    tr.section("browser notebook timings (s)")
    keys = list(dict.fromkeys(k for _, row in TIMINGS for k in row))
    tr.write_line(f"{'notebook':44}" + "".join(f"{k:>12}" for k in keys))
    for name, row in TIMINGS:
        tr.write_line(f"{name:44}" + "".join(f"{row[k]:12.1f}" if k in row else " " * 12 for k in keys))


def pytest_runtest_logreport(report):
    """A browser test's failure is written to build/browser-failures.txt as soon as it happens (a whole run
    takes minutes; pytest prints failures only at the end)."""
    if report.failed and "browser" in report.keywords:
        out = HERE.parent.parent / "build" / "browser-failures.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n\n")
