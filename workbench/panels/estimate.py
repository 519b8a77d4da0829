"""EstimatePanel: sliders for batch size and sequence length, precision and checkpointing; the
peak-memory estimate (fake tensors, on the CPU) redraws on every change.

    EstimatePanel(workload)                                    # the harness's Workload (fp32)
    EstimatePanel(workload, amp_bf16())                        # ... and a Configuration
    EstimatePanel("examples/estimate_mlp.py")                  # a model file, as for `workbench estimate`
    EstimatePanel.from_factories(model_fn, inputs_fn, optimizer_fn)  # the step's factories

The configuration gives the controls' first values (its precision, its checkpointing, its batch size,
else the workload's); a precision or checkpointing set in the controls replaces the configuration's
(``bf16``/``fp16``: autocast, as everywhere).

CSS classes for browser tests: ``wb-estimate``, ``wb-estimate-batch``, ``wb-estimate-seq``,
``wb-estimate-precision``, ``wb-estimate-checkpointing``, ``wb-estimate-summary``,
``wb-estimate-budget``.
"""

from __future__ import annotations

import html
import inspect
from typing import Callable, NamedTuple

from workbench.analysis.experiment import PRECISIONS
from workbench.capture.configurations import Configuration, Workload, check_precision
from workbench.errors import BadArgument
from workbench.panels._base import PanelBase, classify, table_html, widgets, wrong_kind
from workbench.panels._plot import PlotWidget

__all__ = ["EstimatePanel"]

# room for "sequence length": ipywidgets' default label width cuts it to "sequence ..."
_LABEL_STYLE = {"description_width": "120px"}

_GIB = 2**30
_TAKES = ("a Workload (and optionally a Configuration), a model file (.py defining model(), batch(batch_size), "
          "optimizer(parameters)) or what load_estimate_file returns; for model_fn, inputs_fn, optimizer_fn use "
          "EstimatePanel.from_factories")


class _Factories(NamedTuple):
    """A step given by its factories (:meth:`EstimatePanel.from_factories`)."""

    model_fn: Callable
    inputs_fn: Callable
    optimizer_fn: Callable | None
    loss_fn: Callable | None


def _estimator(name: str):
    """A name of workbench.capture.estimate (imported late: it imports torch)."""
    import importlib

    return getattr(importlib.import_module("workbench.capture.estimate"), name)


class EstimatePanel(PanelBase):
    """Live peak-memory estimate of a training step.

    ``source``: a :class:`~workbench.capture.configurations.Workload` (with ``configuration``, a
    :class:`~workbench.capture.configurations.Configuration`; None: fp32), a model file (path) or a loaded
    one (``load_estimate_file``); factories go through :meth:`from_factories`. ``batch_size`` and
    ``precision`` (None: the configuration's, else the workload's batch size) start the controls.
    A model file's ``batch(batch_size, seq_len)`` that takes a second argument gets the sequence-length
    slider. ``budget_gib`` draws the line to fit under. ``workspaces``: cuDNN convolution workspaces
    measured on the GPU (a ``ConvWorkspaces`` or the path of one, written by
    ``workbench estimate --calibrate --workspaces PATH``), used for the calls it holds.
    """

    def __init__(self, source, configuration: Configuration | None = None, *, batch_size: int | None = None,
                 max_batch_size: int = 256, seq_len: int = 512, max_seq_len: int = 4096,
                 precision: str | None = None, budget_gib: float = 141.0, workspaces=None,
                 strict_fp32: bool | None = None):
        if configuration is not None and not isinstance(configuration, Configuration):
            raise BadArgument(f"EstimatePanel: configuration is a Configuration (or None: fp32), not "
                              f"{type(configuration).__name__}")
        config = configuration if configuration is not None else Configuration("fp32")
        precision = config.precision if precision is None else check_precision(precision)
        if isinstance(source, _Factories):  # from_factories
            model_fn, inputs_fn, optimizer_fn, loss_fn = source
        elif isinstance(source, Workload):
            model_fn = inputs_fn = optimizer_fn = loss_fn = None
        elif callable(source):
            raise BadArgument("EstimatePanel(model_fn, ...): a step given by its factories goes through "
                              "EstimatePanel.from_factories(model_fn, inputs_fn, optimizer_fn)")
        else:
            kind, path = classify(source, "EstimatePanel", _TAKES)
            if kind == "model_file":
                source = _estimator("load_estimate_file")(path)
                kind = "estimate_file"
            if kind != "estimate_file":
                raise wrong_kind(source, kind, "EstimatePanel", _TAKES)
            model_fn, inputs_fn, optimizer_fn, loss_fn = source.model, source.batch, source.optimizer, source.loss
        if inputs_fn is not None:  # factories: the harness's Workload, its batch() asking the sliders
            self.takes_seq = len(inspect.signature(inputs_fn).parameters) >= 2
            self.inputs_fn = inputs_fn
            workload, _ = _estimator("step_description")(model_fn, self._inputs, optimizer_fn, loss_fn=loss_fn)
        else:
            self.takes_seq, self.inputs_fn, workload = False, None, source
        from workbench.analysis.memory.cudnn_model import ConvWorkspaces

        if workspaces is not None and not isinstance(workspaces, ConvWorkspaces):
            workspaces = ConvWorkspaces.load(workspaces)  # a path: the table of `workbench estimate --calibrate`
        self.workspaces = workspaces
        self.workload, self.configuration = workload, config
        if batch_size is None:
            batch_size = config.batch_size or (workload.batch_size if inputs_fn is None else None) or 8
        self.estimate = None
        self.batch = widgets.IntSlider(value=batch_size, min=1, max=max(max_batch_size, batch_size),
                                       description="batch size", continuous_update=False, style=_LABEL_STYLE)
        self.batch.add_class("wb-estimate-batch")
        self.seq = widgets.IntSlider(value=seq_len, min=16, max=max_seq_len, step=16, description="sequence length",
                                     continuous_update=False, style=_LABEL_STYLE)
        self.seq.add_class("wb-estimate-seq")
        self.seq.layout.display = None if self.takes_seq else "none"
        self.precision = widgets.Dropdown(options=list(PRECISIONS), value=precision,
                                          description="precision", style=_LABEL_STYLE)
        self.precision.add_class("wb-estimate-precision")
        self.strict_fp32 = widgets.Checkbox(value=bool(strict_fp32), description="strict fp32 (TF32 off)")
        self.strict_fp32.add_class("wb-estimate-strict-fp32")
        self.checkpointing = widgets.Checkbox(value=bool(config.checkpointing), description="activation checkpointing")
        self.checkpointing.add_class("wb-estimate-checkpointing")
        self.budget = widgets.FloatText(value=budget_gib, description="budget (GiB)", style=_LABEL_STYLE)
        self.budget.add_class("wb-estimate-budget")
        self.summary = widgets.HTML()
        self.summary.add_class("wb-estimate-summary")
        self.timeline = PlotWidget()
        self.categories = PlotWidget()
        controls = widgets.HBox([widgets.VBox([self.batch, self.seq]),
                                 widgets.VBox([self.precision, self.strict_fp32, self.checkpointing, self.budget])])
        super().__init__()
        self.children = [controls, self.status, self.summary, self.categories, self.timeline, self.errors]
        self.add_class("wb-estimate")
        for w in (self.batch, self.seq, self.precision, self.strict_fp32, self.checkpointing, self.budget):
            w.observe(self.guard(self._on_change), names="value")
        self.guard(self.update)()

    @classmethod
    def from_factories(cls, model_fn: Callable, inputs_fn: Callable, optimizer_fn: Callable | None = None, *,
                       loss_fn: Callable | None = None, configuration: Configuration | None = None,
                       **kwargs) -> "EstimatePanel":
        """The panel on a training step given by its factories (what ``workbench.estimate`` takes):
        ``model_fn()``, ``inputs_fn(batch_size)`` or ``inputs_fn(batch_size, seq_len)`` (the
        sequence-length slider shows only then), ``optimizer_fn(parameters)`` (None: no optimizer step),
        ``loss_fn(output)`` (default: the mean square of the output). Other keywords as the constructor's."""
        if not callable(model_fn) or not callable(inputs_fn):
            raise BadArgument("EstimatePanel.from_factories(model_fn, inputs_fn, optimizer_fn): model_fn() builds the "
                              "model and inputs_fn(batch_size[, seq_len]) returns the step's inputs")
        return cls(_Factories(model_fn, inputs_fn, optimizer_fn, loss_fn), configuration, **kwargs)

    def _inputs(self, bs):
        return self.inputs_fn(bs, self.seq.value) if self.takes_seq else self.inputs_fn(bs)

    def _on_change(self, _change) -> None:
        self.update()

    def update(self) -> None:
        """Re-run the estimate with the controls' values and redraw."""
        from workbench.analysis.memory.estimate import category_table
        from workbench.figures.estimate import estimate_category_figure, estimate_timeline_figure

        self.set_status("estimating on fake tensors…")
        self.clear_error()
        config = self.configuration
        if self.precision.value != config.precision:  # the control's precision (bf16/fp16: autocast)
            config = config.replace(precision=self.precision.value, autocast=None)
        if self.checkpointing.value != bool(config.checkpointing):
            config = config.replace(checkpointing=self.checkpointing.value)
        strict = True if self.strict_fp32.value and self.precision.value != "tf32" else None
        e = _estimator("estimate")(self.workload, config, batch_size=self.batch.value, conv_workspaces=self.workspaces,
                                   strict_fp32=strict)
        cw = e.meta.get("conv_workspaces") or {}
        self.estimate = e
        budget = self.budget.value * _GIB
        low, high = e.peak_reserved_range
        fits = high <= budget
        verdict = ("fits" if fits else ("may not fit" if e.peak_reserved_bytes <= budget else
                                        ("does not fit" if e.peak_allocated_bytes > budget
                                         else "fits only if the allocator frees its cache")))
        rr = e.meta.get("reserved_range") or {}
        fm = e.meta.get("float32_math") or {}
        colour = "#2e7d32" if fits else "#c62828"
        self.summary.value = (
            f"<b style='color:{colour}'>{html.escape(verdict)}</b> in {self.budget.value:.1f} GiB: "
            f"peak allocated <b>{e.peak_allocated_bytes / _GIB:.2f} GiB</b>, reserved "
            f"<b>{e.peak_reserved_bytes / _GIB:.2f} GiB</b> (in {html.escape(e.peak_phase)}; CUDA context not included)"
            f"<span class='wb-estimate-range'>; reserved between {low / _GIB:.2f} and {high / _GIB:.2f} GiB"
            f"{' (wide)' if rr.get('wide') else ''}: {html.escape(rr.get('why', ''))}</span>"
            + (f"<span class='wb-estimate-math'>; float32 math: convolutions {fm['convolutions'].upper()}, "
               f"matmuls {fm['matmuls'].upper()} ({html.escape(fm['source'])})</span>" if fm else "")
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
