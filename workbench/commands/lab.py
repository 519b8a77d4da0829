"""``workbench lab``: JupyterLab on the guided notebooks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from workbench.errors import BadArgument, MissingDependency


def add_arguments(p):
    p.add_argument("directory", nargs="?", help="folder to open (default: ./notebooks if present, else .)")
    p.add_argument("--port", type=int, default=None, help="port for the server (default: JupyterLab's)")
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser")


def notebook_directory(directory: str | None) -> Path:
    if directory:
        path = Path(directory)
    elif Path("notebooks").is_dir():
        path = Path("notebooks")
    else:
        path = Path(".")
    if not path.is_dir():
        raise BadArgument(f"{path}: not a folder; give the folder that holds the notebooks")
    return path.resolve()


def run(args) -> int:
    path = notebook_directory(args.directory)
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
    print(f"workbench lab: opening JupyterLab on {path}", file=sys.stderr)
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
