"""gpu-workbench: profile and optimize PyTorch on NVIDIA GPUs, inside the notebook.

The package is layered (see docs/architecture.md)::

    capture  -> io -> analysis -> figures -> panels / report -> cli

Importing ``workbench`` is cheap: it loads no torch, pynvml, plotly or ipywidgets. Each layer is a
subpackage that loads on first use::

    >>> import workbench
    >>> workbench.__version__ >= "0.1"
    True
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = [
    "__version__",
    # layers, loaded on first attribute access
    "capture",
    "io",
    "analysis",
    "figures",
    "panels",
    "report",
    "samples",
    "errors",
]

_SUBPACKAGES = {"capture", "io", "analysis", "figures", "panels", "report", "samples", "errors"}


def __getattr__(name: str):
    # Lazy layers: `import workbench` must stay fast and must not pull torch or ipywidgets.
    if name in _SUBPACKAGES:
        return importlib.import_module(f"workbench.{name}")
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _SUBPACKAGES)
