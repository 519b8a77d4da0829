"""The hostile-input suite's harness: every case runs the CLI in this process (its ``main()``), in an
empty folder, under an alarm, and is checked for the outcomes that must never happen (a traceback,
the last-resort "please report" line, an exit code other than 0/2, an error line that does not name
the file, a changed input, the code-execution sentinel)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hostile_cases  # noqa: E402

ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"
CASE_TIMEOUT_S = 60  # a hang fails the case instead of the suite


class Hung(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int = CASE_TIMEOUT_S):
    def fire(signum, frame):
        raise Hung(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def digest_tree(folder: Path) -> dict[str, str]:
    """sha256 of every regular file under ``folder`` (symlinks, FIFOs and devices are not read)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        try:
            if p.is_symlink() or not p.is_file():
                continue
        except OSError:
            continue
        out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``workbench argv`` in this process: (exit code, stdout, stderr). An exception escaping main()
    (not SystemExit) fails the test with its traceback, which is the point."""
    from workbench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), alarm():
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # --help and friends
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def assert_clean(rc: int, err: str, names: tuple[str, ...] = (), ok_codes=(0, 2)) -> None:
    """No traceback, no last-resort line, an allowed exit code; an error is one line naming one of ``names``."""
    from workbench.cli import REPORT_LINE

    assert "Traceback" not in err, err
    assert REPORT_LINE not in err, f"the last-resort handler fired (a bug): {err}"
    assert rc in ok_codes, (rc, err)
    if rc == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert lines, "exit 2 without a message"
        last = lines[-1]
        assert "error" in last, last
        if names:
            assert any(n in last for n in names), f"the error line names none of {names}: {last}"
