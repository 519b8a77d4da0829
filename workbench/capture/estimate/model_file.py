"""The model files of ``workbench estimate FILE.py`` (and ``EstimatePanel(path)``): a Python file that
defines ``model()``, ``batch(batch_size)``, ``optimizer(parameters)`` and optionally ``loss(output)``."""

from __future__ import annotations

import runpy
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


def load_estimate_file(path) -> EstimateFile:
    """Run a model file and take its ``model()``, ``batch(batch_size)``, ``optimizer(parameters)``
    and optional ``loss(output)``. Raises :class:`BadArtifact` naming the file and what is missing.

    The file is Python and runs with your permissions: only pass files you trust.
    """
    from workbench.io._files import check_input

    p = check_input(path, "a model file", "give the path of a .py file that defines model(), batch(batch_size) "
                    "and optimizer(parameters)")
    try:
        ns = runpy.run_path(str(p), run_name="workbench_estimate_model")
    except SyntaxError as exc:
        raise BadArtifact(p, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the file and run again") from None
    except (Exception, SystemExit) as exc:  # the user's module failed (or exited) at import time
        msg = " ".join(str(exc).split())[:300]
        err = BadArtifact(p, f"running the file raised {type(exc).__name__}: {msg}",
                          "fix the file so that importing it succeeds (workbench --debug estimate ... shows the traceback)")
        err.user_exception = exc  # `workbench --debug` prints its traceback
        raise err from None
    missing = [n for n in ("model", "batch", "optimizer") if not callable(ns.get(n))]
    if missing:
        raise BadArtifact(p, f"does not define {', '.join(f'{m}()' for m in missing)}",
                          "define model() -> nn.Module, batch(batch_size) -> tuple of inputs, "
                          "optimizer(parameters) -> optimizer, and optionally loss(output)")
    loss = ns.get("loss")
    return EstimateFile(p, ns["model"], ns["batch"], ns["optimizer"], loss if callable(loss) else None)
