"""The real thing, for checking the estimate on a GPU: the same steps run on CUDA and the caching
allocator's peaks read back (``benchmarks/estimate_accuracy.py``, ``tests/gpu``)."""

from __future__ import annotations

import gc

import torch

from workbench.capture.configurations import apply_checkpointing, check_precision
from workbench.capture.estimate.autocast import AUTOCAST_DTYPES
from workbench.capture.estimate.fake_step import _call, _forward_loss, float32_math

__all__ = ["warm_up_cublas", "measure_step_memory"]


def warm_up_cublas(device: str = "cuda") -> int:
    """Run a tiny forward and backward GEMM so cuBLAS takes its workspaces (forward thread and
    autograd thread); returns the bytes the caching allocator then holds (the workspaces)."""
    from workbench.errors import NoDevice

    if not torch.cuda.is_available():
        raise NoDevice("no CUDA device: measuring a real step needs one; the estimate itself runs without")
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    lin(x).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x)
    y.float().sum().backward()
    del lin, x, y
    gc.collect()
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def measure_step_memory(model_fn, inputs_fn, optimizer_fn=None, *, precision="fp32", batch_size=None, loss_fn=None,
                        checkpointing=False, steps: int = 2, device: str = "cuda", strict_fp32: bool | None = None
                        ) -> dict:
    """Run the same steps as :func:`trace_step_memory` for real on CUDA; return the allocator's peaks.

    Keys: ``max_allocated_bytes`` / ``max_reserved_bytes`` (``torch.cuda.max_memory_*`` over the
    whole run, model creation included), ``base_allocated_bytes`` / ``base_reserved_bytes`` (what
    was held before: the cuBLAS workspaces after :func:`warm_up_cublas`). Memory is released after.
    TF32 as the estimate assumes it (:func:`~workbench.capture.estimate.fake_step.float32_math`: ``tf32`` on,
    ``strict_fp32`` off, else torch's flags as they are); the flags are restored after.
    """
    from workbench.errors import NoDevice

    precision = check_precision(precision)
    if not torch.cuda.is_available():
        raise NoDevice("no CUDA device: measuring a real step needs one; the estimate itself runs without")
    math = float32_math(precision, strict_fp32)
    was = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = math["matmuls"] == "tf32"
    torch.backends.cudnn.allow_tf32 = math["convolutions"] == "tf32"
    try:
        return _measure(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing, steps,
                        device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = was


def _measure(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing, steps, device):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_alloc = torch.cuda.memory_allocated()
    base_res = torch.cuda.memory_reserved()
    dtype = AUTOCAST_DTYPES.get(precision)
    with torch.device(device):
        model = model_fn()
    model.train()
    apply_checkpointing(model, checkpointing)
    opt = optimizer_fn(list(model.parameters())) if optimizer_fn is not None else None
    for _ in range(steps):
        with torch.device(device):
            inputs = _call(inputs_fn, batch_size)
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = _forward_loss(model, inputs, loss_fn)
        del inputs
        loss.backward()
        del loss
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    result = {
        "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "base_allocated_bytes": int(base_alloc),
        "base_reserved_bytes": int(base_res),
    }
    del model, opt
    gc.collect()
    torch.cuda.empty_cache()
    return result
