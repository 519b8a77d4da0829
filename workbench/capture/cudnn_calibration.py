"""Measure, on the GPU, the workspace cuDNN takes for each convolution call of a training step, so that
the estimate uses the measured bytes instead of the rules of :mod:`workbench.analysis.memory.cudnn_model`.

Why: with ``torch.backends.cudnn.benchmark=False`` cuDNN's heuristics pick one algorithm per call from
its shapes, and for fp32 convolutions (no TF32) the pick follows no rule an estimate can apply: the same
layer takes no workspace at one batch and the FFT's 0.6-1 GiB at another (benchmarks/RESULTS.md,
"Accuracy v4"). The pick *is* a function of the call, though, so measuring each distinct call once, in
isolation, with tensors of its shapes, gives the workspace the whole step will see. That costs one
forward and two backward convolutions per distinct layer (seconds), not a training step of the model:
the memory it needs is one layer's tensors plus the workspace.

    from workbench.capture.cudnn_calibration import calibrate
    table = calibrate(model_fn, inputs_fn, optimizer_fn, precision="fp32", batch_size=32)
    table.save("conv_workspaces.json")
    estimate(model_fn, inputs_fn, optimizer_fn, precision="fp32", batch_size=32, conv_workspaces=table)

``workbench estimate FILE.py --calibrate [--workspaces PATH]`` does the same from the command line.
A table holds for the GPU, torch and cuDNN it was measured with (its ``meta`` names them).
"""

from __future__ import annotations

import datetime as _dt
import sys
from typing import Callable

import torch

from workbench.analysis.memory.cudnn_model import DIRECTIONS, ConvWorkspaces
from workbench.capture.estimate.autocast import DTYPE_NAMES
from workbench.capture.estimate.fake_step import _describe, trace_workload_memory

__all__ = ["calibrate", "convolution_calls", "measure_call"]

_TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def convolution_calls(model_fn, inputs_fn=None, optimizer_fn: Callable | None = None, precision: str | None = None,
                      batch_size: int | None = None, loss_fn: Callable | None = None, checkpointing=None,
                      strict_fp32: bool | None = None) -> dict:
    """Every distinct cuDNN convolution call of one training step (key -> its geometry), found on fake
    tensors (no GPU): what :func:`calibrate` measures. Same arguments as
    :func:`workbench.capture.estimate.estimate`."""
    workload, config = _describe(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing)
    record = trace_workload_memory(workload, config, batch_size=batch_size, steps=1, cublas_workspace_bytes=0,
                                   strict_fp32=strict_fp32)
    return record["conv_calls"]


def _transient(fn) -> int:
    """Bytes the call took beyond what it returned: the peak during it minus what is allocated after
    (the output still alive), as torch's caching allocator handed them out."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    transient = torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()
    del out
    return int(transient)


def measure_call(call: dict, device: str = "cuda", repeats: int = 2) -> dict[str, int]:
    """The workspace of one convolution geometry (an entry of :func:`convolution_calls`) in all three
    directions: for each, the largest transient of ``repeats`` calls (the first builds cuDNN's plan). Tensors
    are made with the call's shapes, strides and dtype; fp32 calls run with ``torch.backends.cudnn.allow_tf32``
    set to the call's math, restored after."""
    aten = torch.ops.aten
    dtype = _TORCH_DTYPES[call["dtype"]]
    was = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = call["math"] == "tf32"
    try:
        x = torch.empty_strided(call["x"], call["x_stride"], dtype=dtype, device=device).normal_()
        w = torch.randn(call["w"], dtype=dtype, device=device)
        geo = (call["stride"], call["padding"], call["dilation"], call["transposed"], call["output_padding"],
               call["groups"])
        gy = torch.randn(call["y"], dtype=dtype, device=device)
        last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())  # 1-d: no channels-last format
        if last is not None and not x.is_contiguous() and x.is_contiguous(memory_format=last):
            gy = gy.contiguous(memory_format=last)
        fns = {
            "forward": lambda: aten.convolution(x, w, None, *geo),
            "backward_data": lambda: aten.convolution_backward(gy, x, w, None, *geo, [True, False, False]),
            "backward_weight": lambda: aten.convolution_backward(gy, x, w, None, *geo, [False, True, False]),
        }
        return {d: max(_transient(fns[d]) for _ in range(max(1, repeats))) for d in DIRECTIONS}
    finally:
        torch.backends.cudnn.allow_tf32 = was


def _environment(device: str) -> dict:
    return {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def calibrate(model_fn, inputs_fn=None, optimizer_fn: Callable | None = None, precision: str | None = None,
              batch_size: int | None = None, loss_fn: Callable | None = None, checkpointing=None, *,
              device: str = "cuda", table: ConvWorkspaces | None = None, progress: bool = True,
              strict_fp32: bool | None = None) -> ConvWorkspaces:
    """Measure the workspace of every distinct convolution call of the step on ``device`` (CUDA) and return
    them as a table for ``estimate(..., conv_workspaces=table)``. Calls already in ``table`` are not measured
    again (pass one to extend it: several batch sizes or precisions in one file). Progress goes to stderr
    (``tqdm.auto``: a bar in a notebook); an interrupt stops between calls (KeyboardInterrupt goes on up) and
    the ``table`` passed in keeps what was measured."""
    from workbench.errors import NoDevice

    if not torch.cuda.is_available():
        raise NoDevice("no CUDA device: calibrating cuDNN's workspaces needs the GPU the estimate is for")
    calls = convolution_calls(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing,
                              strict_fp32)
    out = table if table is not None else ConvWorkspaces()
    if not out.meta:
        out.meta.update(_environment(device))
    # one measurement per geometry: the three directions share it
    geometries: dict[str, dict] = {}
    for key, call in calls.items():
        if key not in out:
            geometries.setdefault(key.split("|", 1)[1], call)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(geometries), desc="cuDNN workspaces", unit="layer", file=sys.stderr, disable=not progress)
    try:
        for rest, call in geometries.items():
            for d, nbytes in measure_call(call, device).items():
                out.entries[f"{d}|{rest}"] = int(nbytes)
            bar.update(1)
    except KeyboardInterrupt:
        out.meta["interrupted"] = True
        print(f"calibration interrupted: the {len(out)} calls measured so far stay in the table", file=sys.stderr)
        raise
    finally:
        bar.close()
        torch.cuda.empty_cache()
    return out
