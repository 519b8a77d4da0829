"""Small helpers shared by the diagnosis notebook builders (00, 10, 20, 21, 22).

A builder lists cells as ``md(...)`` / ``code(...)`` and calls ``write(name, cells)``; the notebook is
then executed in place by nbconvert (see notebooks/_build/README.md).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parent.parent

SETUP = '''\
# Setup: choose the data source, seed everything, keep the CPU quiet.
import os, random, sys, warnings
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
import numpy as np
import pandas as pd
import torch

GPU = torch.cuda.is_available()
random.seed(0); np.random.seed(0); torch.manual_seed(0)
if not GPU:
    torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=UserWarning)
pd.set_option("display.width", 160, "display.max_colwidth", 70)
print("mode:", "live CUDA capture on " + torch.cuda.get_device_name(0) if GPU
      else "recorded H200 samples (no CUDA device here)")
'''


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
    """Execute the notebook in place the way notebooks.md says (outputs stored, no widget state)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", KINETO_LOG_LEVEL="6", TORCH_CPP_LOG_LEVEL="ERROR",
               PYTHONHASHSEED="0")
    jupyter = Path(sys.executable).with_name("jupyter")
    subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute", "--inplace",
                    "--ExecutePreprocessor.store_widget_state=False", "--ExecutePreprocessor.timeout=120",
                    str(NOTEBOOKS / f"{name}.ipynb")], check=True, env=env)
