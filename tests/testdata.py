"""Paths of the recorded test data. Import this (not conftest: tests/browser has its own conftest,
and `from conftest import` would pick whichever pytest loaded last)."""

from __future__ import annotations

import signal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """Path of a file under tests/data; fails loudly (not a skip) when it is missing."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        raise FileNotFoundError(f"test data missing: {p} (see tests/data/README.md)")
    return p


def default_sigint() -> None:
    """``preexec_fn`` for a command a test stops with SIGINT (Ctrl-C). A shell without job control starts
    background jobs with SIGINT ignored (a CI runner, `make test &`), children inherit that, and Python then
    never raises KeyboardInterrupt: the child starts as a terminal would start it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_processes(procs) -> None:
    """Terminate the processes a test started (a Dask scheduler and its workers), last first; kill what does
    not end within 20 s."""
    import subprocess

    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
