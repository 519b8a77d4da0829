"""cuDNN convolutions as CUDA runs them, for the tracker: each call's workspace (the measured table's
bytes where it holds the call, else the rules of :mod:`workbench.analysis.memory.cudnn_model`, with an upper
bound where the size is not predictable) and the layout copies of operands that are not contiguous in
the call's memory format. Fake tensors see neither.

:class:`ConvolutionCalls` is a part of :class:`~workbench.capture.estimate.tracker.StorageTracker`
(it uses the tracker's ``note`` and scratch blocks); every distinct call is kept for calibration.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

from workbench.analysis.memory import cudnn_model
from workbench.capture.estimate.autocast import DTYPE_NAMES

__all__ = ["ConvolutionCalls", "shipped_table", "SHIPPED_TABLES"]

# Tables measured on a GPU with workbench.capture.cudnn_calibration and shipped in the package
# (workbench/capture/estimate/tables/*.json): each holds for the GPU, torch and cuDNN its meta names, with
# cudnn.benchmark off.
SHIPPED_TABLES = Path(__file__).resolve().parent / "tables"

# the channels-last memory format of a 4-d (NHWC) and a 5-d (NDHWC) tensor; 3-d tensors have none
_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _channels_last(t) -> bool:
    """Whether ``t`` is laid out channels-last (and not also plain contiguous, as a 1x1 image is)."""
    fmt = _LAST.get(t.dim())
    return fmt is not None and not t.is_contiguous() and t.is_contiguous(memory_format=fmt)


class ConvolutionCalls:
    """The convolution half of the storage tracker (``convolution`` and ``convolution_backward``)."""

    def _init_convolutions(self) -> None:
        self.cudnn = True  # model cuDNN's convolution workspaces (cudnn_model)
        self.conv_math = "fp32"  # fp32 convolutions: "fp32" (no TF32) or "tf32"
        # measured convolution workspaces (cudnn_model.ConvWorkspaces; None: the rules only), and every
        # distinct convolution call seen: key -> (direction, the call's geometry), for calibration
        self.conv_table = None
        self.conv_calls: dict[str, dict] = {}
        self.conv_measured = 0
        self.conv_ruled = 0

    def _conv_call(self, direction: str, x, w, y, stride, padding, dilation, transposed, output_padding,
                   groups) -> tuple[int, int | None]:
        """(bytes, upper bound or None) of one cuDNN convolution call's workspace: the measured table's
        entry when it holds the call, else the rule of cudnn_model (with its bound where unpredictable)."""
        dtype = DTYPE_NAMES.get(x.dtype, str(x.dtype))
        channels_last = _channels_last(x)
        key = cudnn_model.conv_call_key(direction, x.shape, w.shape, y.shape, stride, padding, dilation, transposed,
                                        output_padding, groups, dtype, self.conv_math, channels_last)
        if key not in self.conv_calls:
            self.conv_calls[key] = {
                "direction": direction, "x": list(x.shape), "x_stride": list(x.stride()), "w": list(w.shape),
                "y": list(y.shape), "stride": [int(v) for v in stride], "padding": [int(v) for v in padding],
                "dilation": [int(v) for v in dilation], "transposed": bool(transposed),
                "output_padding": [int(v) for v in output_padding], "groups": int(groups), "dtype": dtype,
                "math": self.conv_math if dtype == "fp32" else "tc"}
        measured = self.conv_table.get(key) if self.conv_table is not None else None
        if measured is not None:
            self.conv_measured += 1
            return int(measured), None
        self.conv_ruled += 1
        kw = dict(transposed=bool(transposed), groups=int(groups), math=self.conv_math)
        el = x.element_size()
        return (cudnn_model.conv_workspace_bytes(direction, x.shape, w.shape, y.shape, el, **kw),
                cudnn_model.conv_workspace_upper_bytes(direction, x.shape, w.shape, y.shape, el, **kw))

    def _layout_copies(self, x, w, *others) -> list:
        """cuDNN convolutions run on tensors contiguous in one memory format (channels-last when the input ``x``
        or the weight ``w`` is, else NCHW): Convolution.cpp copies any operand that is not (a slice of a
        concatenation's gradient, a transposed view) for the call's duration. Opens one scratch block per copy."""
        last = any(_channels_last(t) for t in (x, w))
        keys = []
        for t in (*others, w, x):
            if isinstance(t, torch.Tensor) and not t.is_contiguous(memory_format=_LAST.get(t.dim(), torch.contiguous_format) if last
                                                                    else torch.contiguous_format):
                keys.append(self.open_scratch(t.numel() * t.element_size(), "conv_operand_copy"))
        return keys

    def _conv_forward(self, args, out, name: str) -> None:
        """convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups): the
        operand copies, the output, the workspace (freed at return), the copies freed."""
        x, w = args[0], args[1]
        copies = self._layout_copies(x, w)
        self.note(out, name)
        nbytes, upper = self._conv_call("forward", x, w, out, *args[3:9])
        self.transient(nbytes, "cudnn_conv_workspace", upper)
        for k in copies:
            self.close_scratch(k)

    def _conv_backward(self, args, out, name: str) -> None:
        """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask) in the order cuDNN's backward allocates: the operand copies (a
        non-contiguous incoming gradient), the input gradient then its workspace, the weight gradient then its
        workspace, then the bias gradient; the copies are freed at return."""
        gy, x, w = args[0], args[1], args[2]
        geometry = args[4:10]
        mask = list(args[10])
        copies = self._layout_copies(x, w, gy)
        for i, t in enumerate(out):
            if isinstance(t, torch.Tensor):
                self.note(t, name)
            if i < 2 and mask[i]:
                direction = ("backward_data", "backward_weight")[i]
                nbytes, upper = self._conv_call(direction, x, w, gy, *geometry)
                self.transient(nbytes, "cudnn_conv_workspace", upper)
        for k in copies:
            self.close_scratch(k)


def _matches(meta: dict, env: dict) -> bool:
    return (str(meta.get("device")) == env["device"] and str(meta.get("torch")) == env["torch"]
            and str(meta.get("cudnn")) == str(env["cudnn"]) and not meta.get("cudnn_benchmark"))


def shipped_table(device: str = "cuda") -> "cudnn_model.ConvWorkspaces | None":
    """The shipped table measured on this machine's GPU with this torch and cuDNN (``meta["shipped"]`` set),
    or None: no CUDA device, ``torch.backends.cudnn.benchmark`` on (the heuristics' pick no longer holds), or no
    table for this GPU/torch/cuDNN. The estimate uses it when no table is given (``conv_workspaces=None``);
    read once per process (a batch search estimates many times)."""
    if not torch.cuda.is_available() or torch.backends.cudnn.benchmark or not SHIPPED_TABLES.is_dir():
        return None
    try:
        env = (torch.cuda.get_device_name(device), torch.__version__, str(torch.backends.cudnn.version()))
    except Exception:  # a device that does not answer: the rules
        return None
    return _shipped_for(env)


@functools.lru_cache(maxsize=4)
def _shipped_for(env: tuple) -> "cudnn_model.ConvWorkspaces | None":
    want = dict(zip(("device", "torch", "cudnn"), env))
    for path in sorted(SHIPPED_TABLES.glob("*.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and isinstance(d.get("meta"), dict) and _matches(d["meta"], want):
            table = cudnn_model.ConvWorkspaces.from_dict(d, path.name)
            table.meta["shipped"] = path.name
            return table
    return None
