"""EstimatePanel: sliders for batch size and sequence length, precision and checkpointing; the
peak-memory estimate (fake tensors, on the CPU) redraws on every change.

    EstimatePanel("examples/estimate_mlp.py")                  # a model file, as for `workbench estimate`
    EstimatePanel.from_step(model_fn, inputs_fn, optimizer_fn)  # the step's factories
    EstimatePanel(model_fn, inputs_fn, optimizer_fn)            # the same, positionally

CSS classes for browser tests: ``wb-estimate``, ``wb-estimate-batch``, ``wb-estimate-seq``,
``wb-estimate-precision``, ``wb-estimate-checkpointing``, ``wb-estimate-summary``,
``wb-estimate-budget``.
"""

from __future__ import annotations

import html
import inspect
from typing import Callable

from workbench.errors import WorkbenchError
from workbench.panels._base import PanelBase, classify, table_html, widgets, wrong_kind
from workbench.panels._plot import PlotWidget

__all__ = ["EstimatePanel"]

# room for "sequence length": ipywidgets' default label width cuts it to "sequence ..."
_LABEL_STYLE = {"description_width": "120px"}

_GIB = 2**30
_TAKES = ("a model file (.py defining model(), batch(batch_size), optimizer(parameters)), what "
          "load_estimate_file returns, or model_fn, inputs_fn[, optimizer_fn]")


def _estimator(name: str):
    """``estimate`` / ``load_estimate_file`` from workbench.capture.estimate (imported late: torch)."""
    import importlib

    return getattr(importlib.import_module("workbench.capture.estimate"), name)


def _factories(source, inputs_fn, optimizer_fn, loss_fn):
    """(model_fn, inputs_fn, optimizer_fn, loss_fn) for what the panel was given."""
    if callable(source):  # a model factory
        if inputs_fn is not None:
            return source, inputs_fn, optimizer_fn, loss_fn
        raise WorkbenchError("EstimatePanel(model_fn, inputs_fn, optimizer_fn): inputs_fn is missing; it takes the "
                             "batch size (and, optionally, the sequence length) and returns the step's inputs")
    kind, path = classify(source, "EstimatePanel", _TAKES)
    if kind == "model_file":
        source = _estimator("load_estimate_file")(path)
        kind = "estimate_file"
    if kind != "estimate_file":
        raise wrong_kind(source, kind, "EstimatePanel", _TAKES)
    return source.model, source.batch, source.optimizer, loss_fn or source.loss


class EstimatePanel(PanelBase):
    """Live peak-memory estimate of a training step.

    ``source``: a model file (path) or a loaded one, or ``model_fn`` followed by ``inputs_fn`` and
    ``optimizer_fn``. ``inputs_fn(batch_size)`` or, when it takes a second argument, ``inputs_fn(batch_size, seq_len)``
    (the sequence-length slider shows only then). ``budget_gib`` draws the line to fit under. ``workspaces``:
    cuDNN convolution workspaces measured on the GPU (a ``ConvWorkspaces`` or the path of one, written by
    ``workbench estimate --calibrate --workspaces PATH``), used for the calls it holds.
    """

    def __init__(self, source, inputs_fn: Callable | None = None, optimizer_fn: Callable | None = None, *,
                 loss_fn: Callable | None = None, batch_size: int = 8, max_batch_size: int = 256,
                 seq_len: int = 512, max_seq_len: int = 4096, precision: str = "fp32", budget_gib: float = 141.0,
                 workspaces=None):
        model_fn, inputs_fn, optimizer_fn, loss_fn = _factories(source, inputs_fn, optimizer_fn, loss_fn)
        from workbench.analysis.cudnn_model import ConvWorkspaces

        if workspaces is not None and not isinstance(workspaces, ConvWorkspaces):
            workspaces = ConvWorkspaces.load(workspaces)  # a path: the table of `workbench estimate --calibrate`
        self.workspaces = workspaces
        self.model_fn, self.inputs_fn, self.optimizer_fn, self.loss_fn = model_fn, inputs_fn, optimizer_fn, loss_fn
        self.estimate = None
        self.batch = widgets.IntSlider(value=batch_size, min=1, max=max_batch_size, description="batch size",
                                       continuous_update=False, style=_LABEL_STYLE)
        self.batch.add_class("wb-estimate-batch")
        self.seq = widgets.IntSlider(value=seq_len, min=16, max=max_seq_len, step=16, description="sequence length",
                                     continuous_update=False, style=_LABEL_STYLE)
        self.seq.add_class("wb-estimate-seq")
        self.takes_seq = len(inspect.signature(inputs_fn).parameters) >= 2
        self.seq.layout.display = None if self.takes_seq else "none"
        self.precision = widgets.Dropdown(options=["fp32", "tf32", "bf16", "fp16"], value=precision,
                                          description="precision", style=_LABEL_STYLE)
        self.precision.add_class("wb-estimate-precision")
        self.checkpointing = widgets.Checkbox(value=False, description="activation checkpointing")
        self.checkpointing.add_class("wb-estimate-checkpointing")
        self.budget = widgets.FloatText(value=budget_gib, description="budget (GiB)", style=_LABEL_STYLE)
        self.budget.add_class("wb-estimate-budget")
        self.summary = widgets.HTML()
        self.summary.add_class("wb-estimate-summary")
        self.timeline = PlotWidget()
        self.categories = PlotWidget()
        controls = widgets.HBox([widgets.VBox([self.batch, self.seq]),
                                 widgets.VBox([self.precision, self.checkpointing, self.budget])])
        super().__init__()
        self.children = [controls, self.status, self.summary, self.categories, self.timeline, self.errors]
        self.add_class("wb-estimate")
        for w in (self.batch, self.seq, self.precision, self.checkpointing, self.budget):
            w.observe(self.guard(self._on_change), names="value")
        self.guard(self.update)()

    @classmethod
    def from_step(cls, model_fn: Callable, inputs_fn: Callable, optimizer_fn: Callable | None = None,
                  **kwargs) -> "EstimatePanel":
        """The panel on a training step given by its factories (what ``workbench.estimate`` takes):
        ``model_fn()``, ``inputs_fn(batch_size[, seq_len])``, ``optimizer_fn(parameters)``."""
        return cls(model_fn, inputs_fn, optimizer_fn, **kwargs)

    def _inputs(self, bs):
        return self.inputs_fn(bs, self.seq.value) if self.takes_seq else self.inputs_fn(bs)

    def _on_change(self, _change) -> None:
        self.update()

    def update(self) -> None:
        """Re-run the estimate with the controls' values and redraw."""
        from workbench.analysis.estimate import category_table
        from workbench.figures.estimate import estimate_category_figure, estimate_timeline_figure

        self.set_status("estimating on fake tensors…")
        self.clear_error()
        e = _estimator("estimate")(self.model_fn, self._inputs, self.optimizer_fn, precision=self.precision.value,
                     batch_size=self.batch.value, loss_fn=self.loss_fn, checkpointing=self.checkpointing.value,
                     conv_workspaces=self.workspaces)
        cw = e.meta.get("conv_workspaces") or {}
        self.estimate = e
        budget = self.budget.value * _GIB
        fits = e.peak_reserved_bytes <= budget
        verdict = ("fits" if fits else ("does not fit" if e.peak_allocated_bytes > budget
                                        else "fits only if the allocator frees its cache"))
        colour = "#2e7d32" if fits else "#c62828"
        self.summary.value = (
            f"<b style='color:{colour}'>{html.escape(verdict)}</b> in {self.budget.value:.1f} GiB: "
            f"peak allocated <b>{e.peak_allocated_bytes / _GIB:.2f} GiB</b>, reserved "
            f"<b>{e.peak_reserved_bytes / _GIB:.2f} GiB</b> (in {html.escape(e.peak_phase)}; CUDA context not included)"
            + (f"; up to {e.peak_allocated_upper_bytes / _GIB:.2f} GiB allocated, {e.peak_reserved_upper_bytes / _GIB:.2f}"
               f" GiB reserved where cuDNN's workspaces are not predictable ({html.escape(e.meta['upper'].get('source', ''))})"
               if e.meta.get("upper") else "")
            + (f"; cuDNN convolution workspaces: {cw['measured']} of {cw['calls']} calls measured"
               + (f" on {html.escape(str(cw['table'].get('device', 'the GPU')))}" if cw.get("table") else "")
               if cw.get("calls") else "")
            + table_html(category_table(e).assign(GiB=lambda d: d["bytes"] / _GIB)[["category", "GiB", "percent"]],
                         float_format="{:,.3f}", formats={"percent": "{:.1f}"}, csv="estimate_categories.csv"))
        self.categories.show(estimate_category_figure(e))
        self.timeline.show(estimate_timeline_figure(e, max_points=2_000))
        self.set_status(f"{e.meta.get('parameters', 0):,} parameters; batch {self.batch.value}"
                        + (f", sequence {self.seq.value}" if self.takes_seq else ""))
