"""``workbench lab [DIRECTORY]``: JupyterLab on the guided notebooks (the lessons).

The lessons travel with the package: a wheel holds them as ``workbench/notebooks/*.ipynb`` (copied from the
repository's ``notebooks/`` at build time by ``setup.py``; the repository keeps the one source), and a
checkout reads ``notebooks/`` itself (:func:`lesson_source`). Everything they read comes from
``workbench.samples``. So ``workbench lab`` works the same outside a checkout: the first time, it copies the
lessons into a working folder (``./workbench-lessons`` unless DIRECTORY is given) and opens it; later runs
copy only lessons that are missing there, never over a file that exists (the user's edits are kept, and the
command says which). In a checkout, ``workbench lab`` (or ``workbench lab notebooks``) opens the sources.

JupyterLab runs in its own session, so stopping ``workbench lab`` (Ctrl-C, SIGTERM, SIGHUP) stops the
server with it (SIGTERM, then SIGKILL to its process group after :data:`STOP_TIMEOUT_S`): no server is left
running without the command.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from workbench.errors import BadArgument, MissingDependency, WorkbenchError

__all__ = ["add_arguments", "run", "lesson_source", "lesson_files", "copy_lessons", "DEFAULT_FOLDER",
           "STOP_TIMEOUT_S"]

DEFAULT_FOLDER = "workbench-lessons"
STOP_TIMEOUT_S = 10.0
_PACKAGE = Path(__file__).resolve().parent.parent  # workbench/


def add_arguments(p):
    p.add_argument("directory", nargs="?",
                   help=f"folder to open; the lessons are copied into it when missing there (default: "
                        f"./{DEFAULT_FOLDER}, or the lessons themselves in a gpu-workbench checkout)")
    p.add_argument("--no-lessons", action="store_true",
                   help="open DIRECTORY as it is, without copying the lessons into it")
    p.add_argument("--port", type=int, default=None, help="port for the server (default: JupyterLab's)")
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser")


def lesson_source() -> Path:
    """The folder the lessons are read from: ``workbench/notebooks`` in an installed wheel, else the
    checkout's ``notebooks/`` beside the package (an editable install or a ``PYTHONPATH`` checkout)."""
    for folder in (_PACKAGE / "notebooks", _PACKAGE.parent / "notebooks"):
        if folder.is_dir() and any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise WorkbenchError(f"the lessons (NN_name.ipynb) are missing from this installation ({_PACKAGE}); "
                         "reinstall gpu-workbench")


def lesson_files() -> list[Path]:
    """The lessons, in order (``00_tour.ipynb``, ``10_step_time.ipynb``, ...)."""
    return sorted(lesson_source().glob("[0-9][0-9]_*.ipynb"))


def copy_lessons(folder) -> tuple[list[str], list[str]]:
    """Copy the lessons missing from ``folder`` into it (created if needed); a file already there is never
    replaced. Returns ``(copied, kept)`` file names. Nothing is copied into the lesson source itself."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise BadArgument(f"{folder}: not a folder; give the folder to open the lessons in")
    source = lesson_source()
    if folder.exists() and folder.resolve() == source.resolve():
        return [], []
    folder.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for lesson in lesson_files():
        target = folder / lesson.name
        if os.path.lexists(target):
            kept.append(lesson.name)
            continue
        shutil.copyfile(lesson, target)
        copied.append(lesson.name)
    return copied, kept


def notebook_directory(directory: str | None) -> Path:
    """The folder to open: DIRECTORY, else the checkout's ``notebooks/`` when the current folder is a
    checkout, else ``./workbench-lessons``."""
    if directory:
        return Path(directory)
    here = Path("notebooks")
    try:
        if here.is_dir() and here.resolve() == lesson_source().resolve():
            return here
    except WorkbenchError:
        pass
    return Path(DEFAULT_FOLDER)


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(proc: subprocess.Popen) -> None:
    """Stop JupyterLab: SIGTERM (it shuts its kernels down), then SIGKILL to its process group."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass


def run(args) -> int:
    path = notebook_directory(args.directory)
    if args.no_lessons:
        if not path.is_dir():
            raise BadArgument(f"{path}: not a folder; give the folder to open")
    else:
        copied, kept = copy_lessons(path)
        if copied:
            print(f"workbench lab: copied {len(copied)} lesson(s) into {path}", file=sys.stderr)
        if kept:
            print(f"workbench lab: kept {len(kept)} lesson(s) already in {path} as they are (your edits are "
                  f"not overwritten; delete a file to get a fresh copy): {', '.join(kept)}", file=sys.stderr)
    path = path.resolve()
    jupyter = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or shutil.which("jupyter")
    if jupyter is None:
        raise MissingDependency("jupyterlab", "to open the notebooks")
    cmd = [jupyter, "lab", f"--ServerApp.root_dir={path}"]
    if args.port:
        cmd.append(f"--port={args.port}")
    if args.no_browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers, CI and Binder-like images often run as root
    print(f"workbench lab: opening JupyterLab on {path} (Ctrl-C stops it)", file=sys.stderr)

    def _on_signal(signum, frame):
        raise _Stop(signum)

    stops = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    previous = {s: signal.signal(s, _on_signal) for s in stops}
    proc = None
    try:
        # its own session: a terminal's Ctrl-C reaches this process only (JupyterLab's own handler would
        # ask "Shutdown this Jupyter server (y/[n])?" and keep running), and we stop it below
        proc = subprocess.Popen(cmd, start_new_session=True)
        return proc.wait()
    except (_Stop, KeyboardInterrupt):
        print("workbench lab: stopping JupyterLab", file=sys.stderr)
        return 0
    finally:
        if proc is not None:
            for s in stops:  # a second Ctrl-C while it stops does not leave it running
                signal.signal(s, signal.SIG_IGN)
            _stop(proc)
        for s, handler in previous.items():
            signal.signal(s, handler)
