"""The lessons travel: ``workbench lab`` outside a checkout copies them into a working folder (never over the
user's edits) and opens it; a wheel holds them and everything they read; a lesson runs from a copy outside
the checkout; stopping ``workbench lab`` stops JupyterLab."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from testdata import ROOT
from workbench import samples
from workbench.commands.lab import DEFAULT_FOLDER, copy_lessons, lesson_files, lesson_source, notebook_directory

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "KINETO_LOG_LEVEL": "6"}


def test_lesson_source_is_the_checkouts_notebooks_in_a_checkout():
    assert lesson_source() == ROOT / "notebooks"
    names = [p.name for p in lesson_files()]
    assert names[0] == "00_tour.ipynb" and "14_many_gpus.ipynb" in names
    assert names == sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_copy_lessons_once_and_keeps_the_users_edits(tmp_path):
    folder = tmp_path / "lessons"
    copied, kept = copy_lessons(folder)
    assert copied == [p.name for p in lesson_files()] and kept == []
    edited = folder / "10_step_time.ipynb"
    edited.write_text("my edits")
    copied, kept = copy_lessons(folder)
    assert copied == [] and kept == copied + [p.name for p in lesson_files()]
    assert edited.read_text() == "my edits"
    (folder / "00_tour.ipynb").unlink()  # deleting one gets a fresh copy
    assert copy_lessons(folder)[0] == ["00_tour.ipynb"]
    assert copy_lessons(ROOT / "notebooks") == ([], [])  # never into the source itself


def test_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert notebook_directory(None) == Path("notebooks")  # a checkout opens the lessons themselves
    monkeypatch.chdir(tmp_path)
    assert notebook_directory(None) == Path(DEFAULT_FOLDER)
    (tmp_path / "notebooks").mkdir()  # somebody's own notebooks/ is not the lessons
    assert notebook_directory(None) == Path(DEFAULT_FOLDER)


def test_lessons_read_no_file_of_the_checkout():
    for src in sorted((ROOT / "notebooks" / "src").glob("*.py")):
        text = src.read_text()
        assert "tests/data" not in text.replace("tests\" / \"data", "tests/data"), src.name
        assert 'Path("..")' not in text, src.name


def test_wheel_holds_the_lessons_and_the_data_they_read(tmp_path):
    """Built from a copy of the tracked sources (the checkout gets no build/ or egg-info)."""
    src = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in listed:
        if name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE") or \
                name.startswith(("workbench/", "notebooks/")):
            if (ROOT / name).is_file():
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ROOT / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".",
                        "-w", str(tmp_path / "dist")], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for lesson in lesson_files():
        assert f"workbench/notebooks/{lesson.name}" in names
    for name in samples.names():
        p = samples.path(name)
        files = [f for f in p.iterdir()] if p.is_dir() else [p]
        for f in files:
            assert f"workbench/samples/{f.relative_to(ROOT / 'workbench' / 'samples').as_posix()}" in names
    for f in (ROOT / "workbench" / "samples" / "results").iterdir():
        assert f"workbench/samples/results/{f.name}" in names


def test_a_lesson_runs_from_a_copy_outside_the_checkout(tmp_path):
    """Lesson 14 read ``../tests/data/ranks``; from a copy it reads the shipped samples. Lessons 16 and 18
    read recordings that were test data first (the GPT and loader pairs, the ceilings), lesson 15 the compile
    pairs: shipped copies too; lesson 17 its own GPU recording and lesson 16's ceilings, lesson 37 its own. Lesson 19 reads a
    shipped folder (a flight recorder's) and runs ``workbench watch`` on it; lesson 21 the shipped OOM
    recordings with their fixes run (h100_oom_whatif)."""
    copy_lessons(tmp_path)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                        "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "notebooks" / "sanitize.cfg"),
                        "14_many_gpus.ipynb", "15_torch_compile.ipynb", "16_roofline_and_mfu.ipynb",
                        "17_attention_kernels.ipynb", "18_feeding_the_gpu.ipynb", "19_long_runs.ipynb",
                        "21_oom_postmortem.ipynb", "37_inference_latency.ipynb"],
                       cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc for the server's process")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_workbench_lab_stops_jupyterlab(tmp_path, sig):
    from jupyter_helpers import free_port

    log = open(tmp_path / "lab.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "lab", str(tmp_path / "w"), "--no-browser",
                             f"--port={free_port()}"], cwd=tmp_path, env=ENV, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "http://" not in (tmp_path / "lab.log").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "lab.log").read_text()
            time.sleep(0.2)
        server = _children(proc.pid)
        assert server and all(_alive(p) for p in server), (tmp_path / "lab.log").read_text()
        assert sorted(os.listdir(tmp_path / "w")) == sorted(p.name for p in lesson_files())
        os.kill(proc.pid, sig)  # only workbench lab gets it (a terminal's Ctrl-C reaches the group)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in server), "JupyterLab outlived workbench lab"
        assert "stopping JupyterLab" in (tmp_path / "lab.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in _children(proc.pid):
            os.kill(p, signal.SIGKILL)
        log.close()


def test_lab_says_it_keeps_existing_lessons(tmp_path):
    """The kept-files line, without starting a server (no jupyter on PATH)."""
    folder = tmp_path / "w"
    copy_lessons(folder)
    (folder / "00_tour.ipynb").write_text(json.dumps({"mine": True}))
    env = {**ENV, "PATH": str(tmp_path / "nothing")}
    r = subprocess.run([sys.executable, "-c", "import sys; sys.executable = '/nonexistent/python'; "
                        "from workbench.cli import main; raise SystemExit(main(['lab', 'w']))"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "kept 16 lesson(s) already in w" in r.stderr.replace(str(len(lesson_files())), "16"), r.stderr
    assert "your edits are not overwritten" in r.stderr
    assert json.loads((folder / "00_tour.ipynb").read_text()) == {"mine": True}
    assert r.returncode == 2 and "jupyterlab" in r.stderr  # MissingDependency: no jupyter found
