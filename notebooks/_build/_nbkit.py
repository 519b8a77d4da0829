"""Cell and file helpers shared by every notebook builder (build_NN_*.py).

Each lesson's own setup cell and model live in `_diag_nb.py` (diagnosis, 00-22) or `_opt_nb.py`
(optimization, 30-34); this module only makes cells and writes/executes notebooks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(src: str, *tags: str):
    cell = new_code_cell(textwrap.dedent(src).strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def write(name: str, cells) -> Path:
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    out = NOTEBOOKS / f"{name}.ipynb"
    nbformat.validate(nb)
    nbformat.write(nb, out)
    return out


def execute(name: str) -> None:
    """Execute the notebook in place the way CI expects (outputs stored, no widget state)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", KINETO_LOG_LEVEL="6", TORCH_CPP_LOG_LEVEL="ERROR",
               PYTHONHASHSEED="0")
    jupyter = Path(sys.executable).with_name("jupyter")
    subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute", "--inplace",
                    "--ExecutePreprocessor.store_widget_state=False", "--ExecutePreprocessor.timeout=120",
                    str(NOTEBOOKS / f"{name}.ipynb")], check=True, env=env)
