"""io/isolation.py: a loader run in a forked child; its result, its errors and its death come back as
one value or one BadArtifact in the caller, and its progress bars are drawn by the caller."""

from __future__ import annotations

import os
import signal

import pytest

from workbench.errors import BadArtifact, UnsafePickle
from workbench.io.isolation import can_isolate, make_bar, run_isolated

pytestmark = pytest.mark.skipif(not can_isolate(), reason="fork isolation is Linux only")


def _value():
    return {"pid": os.getpid(), "cols": list(range(5))}


def _unsafe():
    raise UnsafePickle("f.pickle", "names a global", "only plain containers")


def _crash():
    import faulthandler

    faulthandler.disable()  # pytest's would print the child's stack
    os.kill(os.getpid(), signal.SIGSEGV)


def _bug():
    raise KeyError("oops")


def _with_bar():
    bar = make_bar(10, "reading", "B")
    for _ in range(10):
        bar.update(1)
    bar.close()
    return "done"


def test_the_result_comes_from_a_child():
    out = run_isolated(_value, "f", "fix")
    assert out["cols"] == [0, 1, 2, 3, 4] and out["pid"] != os.getpid()


def test_a_bad_artifact_keeps_its_class_and_text():
    with pytest.raises(UnsafePickle, match="names a global"):
        run_isolated(_unsafe, "f.pickle", "fix")


def test_a_crash_is_one_line_naming_the_signal():
    with pytest.raises(BadArtifact, match=r"crashed the unpickler \(SIGSEGV\)"):
        run_isolated(_crash, "f.pickle", "copy it again", crashed="crashed the unpickler")


def test_a_bug_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="KeyError"):
        run_isolated(_bug, "f", "fix")


def test_progress_of_the_child_is_drawn_here(capsys):
    assert run_isolated(_with_bar, "f", "fix", progress=True) == "done"
    assert "reading" in capsys.readouterr().err
