"""The model files of ``workbench estimate FILE.py`` (and ``EstimatePanel(path)``): a Python file that
defines ``model()``, ``batch(batch_size)``, ``optimizer(parameters)`` and optionally ``loss(output)``."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import runpy
import sys
from pathlib import Path

from workbench.capture.configurations import Configuration, Workload
from workbench.capture.estimate.fake_step import step_description
from workbench.errors import BadArtifact

__all__ = ["EstimateFile", "load_estimate_file"]


class EstimateFile:
    """The functions a model file for ``workbench estimate FILE.py`` defines."""

    def __init__(self, path: Path, model, batch, optimizer, loss):
        self.path, self.model, self.batch, self.optimizer, self.loss = path, model, batch, optimizer, loss

    def step(self, precision: str = "fp32", batch_size: int | None = None, checkpointing=False
             ) -> tuple[Workload, Configuration]:
        """The file's step as the harness's Workload and Configuration (see :func:`step_description`)."""
        return step_description(self.model, self.batch, self.optimizer, precision=precision,
                                batch_size=batch_size, loss_fn=self.loss, checkpointing=checkpointing)


_MODULE_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*)?")


@contextlib.contextmanager
def _on_sys_path(folder: str):
    """``folder`` first on ``sys.path`` for the block (as ``python FILE.py`` puts the file's folder), then
    ``sys.path`` as it was."""
    saved = list(sys.path)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path[:] = saved


def _with_path(fn, folder: str):
    """``fn`` run with ``folder`` on sys.path (a model() that imports from the module next to it when called)."""
    if not callable(fn):
        return fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _on_sys_path(folder):
            return fn(*args, **kwargs)

    return run


def _is_path(spec: str) -> bool:
    """Whether ``spec`` names something on disk; a name the OS refuses (too long, ...) is a path too, so
    that ``check_input`` refuses it in one line."""
    try:
        return Path(spec).exists()
    except OSError:
        return True


def load_estimate_file(path) -> EstimateFile:
    """Run a model file and take its ``model()``, ``batch(batch_size)``, ``optimizer(parameters)``
    and optional ``loss(output)``. Raises :class:`BadArtifact` naming the file and what is missing.

    ``path`` is a ``.py`` file, run as ``python FILE.py`` runs it (its folder first on ``sys.path``, so
    ``from model import Net`` finds the module next to it; ``sys.path`` is restored after, and put back while
    the file's functions run), or a module to import, ``package.module`` (found from the current folder, as
    ``python -m`` finds it) or ``package.module:function`` (``function`` is the model factory; the module's
    ``batch``, ``optimizer`` and ``loss`` go with it).

    The file is Python and runs with your permissions: only pass files you trust.
    """
    from workbench.io._files import check_input

    spec = str(path)
    if not spec.endswith(".py") and _MODULE_SPEC.fullmatch(spec) and not _is_path(spec):
        return _load_module(spec)
    p = check_input(path, "a model file", "give the path of a .py file that defines model(), batch(batch_size) "
                    "and optimizer(parameters), or a module: package.module[:function]")
    folder = str(Path(p).resolve().parent)
    try:
        with _on_sys_path(folder):
            ns = runpy.run_path(str(p), run_name="workbench_estimate_model")
    except SyntaxError as exc:
        raise BadArtifact(p, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the file and run again") from None
    except (Exception, SystemExit) as exc:  # the user's module failed (or exited) at import time
        msg = " ".join(str(exc).split())[:300]
        err = BadArtifact(p, f"running the file raised {type(exc).__name__}: {msg}",
                          "fix the file so that importing it succeeds (workbench --debug estimate ... shows the traceback)")
        err.user_exception = exc  # `workbench --debug` prints its traceback
        raise err from None
    return _from_namespace(p, ns, "model", folder)


def _from_namespace(p, ns: dict, model_name: str, folder: str) -> EstimateFile:
    missing = [n for n in (model_name, "batch", "optimizer") if not callable(ns.get(n))]
    if missing:
        raise BadArtifact(p, f"does not define {', '.join(f'{m}()' for m in missing)}",
                          "define model() -> nn.Module, batch(batch_size) -> tuple of inputs, "
                          "optimizer(parameters) -> optimizer, and optionally loss(output)")
    loss = ns.get("loss")
    fns = [_with_path(ns[n], folder) for n in (model_name, "batch", "optimizer")]
    return EstimateFile(p, *fns, _with_path(loss, folder) if callable(loss) else None)


def _load_module(spec: str) -> EstimateFile:
    """``package.module[:function]``, imported with the current folder first on sys.path (``python -m``)."""
    import importlib

    module, _, func = spec.partition(":")
    folder = os.getcwd()
    try:
        with _on_sys_path(folder):
            mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise BadArtifact(spec, f"no such file, and no module {exc.name!r} to import",
                              "give a .py file, or package.module[:function] importable from here") from None
        raise BadArtifact(spec, f"importing it raised ModuleNotFoundError: {exc}",
                          "fix the module so that importing it succeeds") from None
    except SyntaxError as exc:
        raise BadArtifact(spec, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the file and run again") \
            from None
    except (Exception, SystemExit) as exc:
        msg = " ".join(str(exc).split())[:300]
        raise BadArtifact(spec, f"importing it raised {type(exc).__name__}: {msg}",
                          "fix the module so that importing it succeeds") from None
    where = Path(getattr(mod, "__file__", None) or spec)
    return _from_namespace(where, vars(mod), func or "model", folder)
