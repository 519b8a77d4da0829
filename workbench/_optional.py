"""Import an optional package, or raise MissingDependency naming what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from workbench.errors import MissingDependency

# module name -> (distribution to pip install, extra of gpu-workbench that carries it or None)
_DISTRIBUTIONS = {
    "torch": ("torch", None),
    "pynvml": ("nvidia-ml-py", None),
    "ipywidgets": ("ipywidgets", None),
    "anywidget": ("anywidget", None),
    "plotly": ("plotly", None),
    "prometheus_client": ("prometheus_client", None),
    "hta": ("holistictraceanalysis", "bench"),
    "pyarrow": ("pyarrow", None),
    "dask": ("dask", "dask"),
    "distributed": ("distributed", "dask"),
}


def import_optional(module: str, purpose: str) -> ModuleType:
    """Return ``module`` imported, or raise :class:`MissingDependency` saying ``purpose`` and the fix.

    >>> import_optional("json", "to read JSON").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        dist, extra = _DISTRIBUTIONS.get(top, (top, None))
        raise MissingDependency(dist, purpose, extra) from exc
