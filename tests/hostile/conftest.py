"""The hostile suite's autouse fixture (the harness itself is hostile_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostile_cases  # noqa: E402
from hostile_harness import ROOT  # noqa: E402


@pytest.fixture(autouse=True)
def _in_empty_folder(tmp_path, monkeypatch):
    """Each case runs in an empty folder; afterwards the code-execution sentinel must not exist there
    or at the repository root."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("WORKBENCH_PROGRESS_AFTER_S", "3600")
    yield work
    for where in (work, ROOT, tmp_path):
        assert not (where / hostile_cases.SENTINEL).exists(), "a pickle ran code: the sentinel file exists"
