"""Predict a training step's peak GPU memory without a GPU: run it on fake tensors and record when
each tensor storage is born and dies.

    >>> from workbench.capture.estimate import estimate
    >>> e = estimate(lambda: torch.nn.Linear(1024, 1024), lambda bs: torch.randn(bs, 1024),
    ...              lambda p: torch.optim.AdamW(p), batch_size=64)          # doctest: +SKIP
    >>> e = estimate(workload, amp_bf16(), batch_size=64)   # the harness's Workload/Configuration  # doctest: +SKIP
    >>> e.peak_allocated_bytes, e.by_category                                # doctest: +SKIP

The one-call API (:func:`estimate`, :func:`largest_batch_that_fits`, :func:`compare_configurations`,
:func:`load_estimate_file`) chains the fake step with the caching-allocator replay and tables of
:mod:`workbench.analysis.memory.estimate` (no torch); the first three are defined here. The step is
described by the harness's :class:`~workbench.capture.configurations.Workload` and
:class:`~workbench.capture.configurations.Configuration` (:func:`step_description` turns the function
form into them).

The package, one module a part:

* :mod:`.fake_step`: the Workload and Configuration run on fake tensors (``trace_workload_memory``,
  ``trace_step_memory``, ``step_description``), the record it returns.
* :mod:`.tracker`: the dispatch mode that notes storages born and dying, the gradient sums the engine
  does in place, the cuBLAS workspaces (``CUBLAS_WORKSPACE_BYTES``) and the model FLOPs.
* :mod:`.convolution`: cuDNN convolutions' workspaces (measured table or rules) and layout copies.
* :mod:`.autocast`: CUDA's autocast policy on the CPU device (and CUDA's dropout and attention kernels).
* :mod:`.lstm`: cuDNN's fused LSTM, as CUDA runs ``nn.LSTM``.
* :mod:`.measure`: the same steps on a real GPU (``measure_step_memory``, ``warm_up_cublas``).
* :mod:`.model_file`: the model files of ``workbench estimate FILE.py`` (``load_estimate_file``).

No device and no real memory are touched: the model is built on the ``meta`` device, its
parameters become :class:`torch._subclasses.fake_tensor.FakeTensor`\\ s, and forward, loss,
backward, ``optimizer.step()`` and ``zero_grad()`` run under ``FakeTensorMode``. A
``TorchDispatchMode`` sees every ATen op and notes each *new* storage in its outputs (views and
in-place results share an old one); a weak reference on the storage notes when it is released.
The result is a plain record (lists and dicts, no torch objects) that
:func:`workbench.analysis.memory.estimate.estimate_from_record` turns into peaks with the caching
allocator model.

Why the fake tensors live on the CPU device, and what is done so that the step still behaves as
it would on CUDA:

* A CPU-only torch build cannot run autograd on fake *CUDA* tensors (the engine asks for the CUDA
  device guard, which such a build does not have), so the fake device is ``cpu`` and sizes are
  accounted exactly the same way.
* Autocast: CUDA's autocast policy (which ops run in bf16/fp16, which in fp32, which promote,
  the cache of weight casts) differs from the CPU one (e.g. ``layer_norm`` and ``softmax`` run in
  fp32 on CUDA). While the step is traced, the ``AutocastCPU`` kernels are replaced by Python
  kernels that follow the CUDA lists of aten/src/ATen/autocast_mode.h; they are removed afterwards.
* Dropout: on CUDA ``dropout`` runs the fused ``native_dropout`` and keeps a 1-byte mask; the CPU
  path keeps a full-precision noise tensor. The same replaced kernel routes ``dropout`` to
  ``native_dropout``.
* Optimizers: on CUDA an optimizer left at ``foreach=None`` picks the foreach implementation,
  whose temporaries (e.g. one ``sqrt`` per parameter for Adam) count; it is set explicitly here.
* Host-side step counters of non-fused optimizers are not device memory and are dropped.

Not seen by fake tensors (docs/memory.md, "How the estimate is made"): workspaces that kernels take
internally (cuDNN convolution, flash attention), and the CUDA context. The cuBLAS workspace is added as a
modelled constant (:data:`CUBLAS_WORKSPACE_BYTES` per cuBLAS handle: one for the forward thread,
one for the autograd engine's device thread).
"""

from __future__ import annotations

from typing import Callable, Iterable

import pandas as pd

from workbench.analysis.memory.estimate import Estimate, estimate_from_record, estimate_table, fits_table
from workbench.analysis.experiment import HEADROOM_COLUMNS, PRECISIONS, Headroom, search_largest
from workbench.capture.configurations import Configuration, Workload, apply_checkpointing, checkpointed_modules
from workbench.capture.estimate.autocast import DTYPE_NAMES
from workbench.capture.estimate.fake_step import (
    _describe,
    float32_math,
    step_description,
    trace_step_memory,
    trace_workload_memory,
)
from workbench.capture.estimate.measure import measure_step_memory, warm_up_cublas
from workbench.capture.estimate.model_file import EstimateFile, load_estimate_file
from workbench.capture.estimate.tracker import CUBLAS_WORKSPACE_BYTES
from workbench.errors import BadArgument

__all__ = [
    # the one-call API
    "estimate",
    "largest_batch_that_fits",
    "compare_configurations",
    "load_estimate_file",
    "EstimateFile",
    # the fake step and its parts
    "CUBLAS_WORKSPACE_BYTES",
    "DTYPE_NAMES",
    "float32_math",
    "trace_step_memory",
    "trace_workload_memory",
    "step_description",
    "measure_step_memory",
    "warm_up_cublas",
]


def estimate(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    precision: str | None = None,
    batch_size: int | None = None,
    loss_fn: Callable | None = None,
    checkpointing=None,
    device: str = "cuda",
    steps: int = 2,
    cublas_workspace_bytes: int | None = None,
    conv_workspaces=None,
    strict_fp32: bool | None = None,
) -> Estimate:
    """Peak GPU memory of ``steps`` training steps, predicted on fake tensors.

    Two ways to say what the step is::

        estimate(workload, configuration, batch_size=64)    # the harness's Workload and Configuration
        estimate(model_fn, inputs_fn, optimizer_fn, precision="bf16", batch_size=64, checkpointing=True)

    The second is turned into the first by :func:`step_description`. With a Workload, ``precision``
    and ``checkpointing`` (when given) replace the configuration's.

    Returns :class:`workbench.analysis.memory.estimate.Estimate`: ``peak_allocated_bytes`` (what
    ``torch.cuda.max_memory_allocated()`` would report), ``peak_reserved_bytes``
    (``max_memory_reserved()``), ``by_phase``, ``by_category``, ``by_module`` and a ``timeline``.
    Neither includes the CUDA context (~0.5 GiB on an H200, outside the caching allocator).
    ``device`` must be ``"cuda"``: the allocator modelled is CUDA's. ``conv_workspaces``: cuDNN
    convolution workspaces measured on the GPU (:func:`workbench.capture.cudnn_calibration.calibrate`, or
    ``ConvWorkspaces.load(path)``), used for the calls they hold; ``meta["conv_workspaces"]`` says how many.

    The math of float32 convolutions and matmuls (``meta["float32_math"]``, :func:`float32_math`): at
    ``fp32``, what an untouched script runs, read from torch's flags now (by default cuDNN convolutions in TF32,
    matmuls in fp32), or what the configuration's setup sets (the harness's ``fp32()``: TF32 off);
    ``strict_fp32=True`` turns TF32 off for both, ``precision="tf32"`` on for both.
    """
    if device not in ("cuda", "cuda:0"):
        raise BadArgument(f"device={device!r}: only the CUDA caching allocator is modelled; use device='cuda'")
    workload, config = _describe(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing)
    record = trace_workload_memory(
        workload, config, batch_size=batch_size, steps=steps,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_BYTES if cublas_workspace_bytes is None else cublas_workspace_bytes,
        conv_workspaces=conv_workspaces, strict_fp32=strict_fp32,
    )
    return estimate_from_record(record)


def largest_batch_that_fits(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    budget_bytes: int = 80 * 2**30,
    *,
    low: int = 1,
    high: int = 1 << 16,
    use: str = "reserved",
    progress: bool = False,
    **kwargs,
) -> Headroom:
    """Largest batch size in ``[low, high]`` whose estimated peak fits ``budget_bytes``: doubling from
    ``low``, then bisecting (:func:`~workbench.analysis.experiment.search_largest`, the harness's search).

    ``model_fn, inputs_fn, optimizer_fn`` or ``workload, configuration`` as in :func:`estimate`; other
    keyword arguments go to it. ``use`` is ``"reserved"`` (default, what the process holds: the high end of
    :attr:`~workbench.analysis.memory.estimate.Estimate.peak_reserved_range`, so that a batch said to fit
    does), ``"reserved_point"`` (the interval's point: the search before the interval existed, which the
    H200 recordings of lesson 35 used) or ``"allocated"``. Returns a :class:`~workbench.analysis.experiment.Headroom` (the type
    :func:`~workbench.capture.runner.find_max_batch_size` returns) whose ``estimate`` is the estimate at
    ``batch_size``; it unpacks as ``batch_size, estimate``. When even ``low`` does not fit:
    ``batch_size`` 0 and the estimate at ``low``. Assumes the peak grows with the batch size (checked by
    the tests on the model families of the benchmark).
    """
    if use not in ("reserved", "reserved_point", "allocated"):
        raise BadArgument("use must be 'reserved', 'reserved_point' or 'allocated'")
    if isinstance(model_fn, Workload) and isinstance(optimizer_fn, (int, float)) and budget_bytes == 80 * 2**30:
        optimizer_fn, budget_bytes = None, optimizer_fn  # largest_batch_that_fits(workload, config, budget)
    def peak(e: Estimate) -> int:  # reserved: the high end of its interval (what may be needed)
        if use == "reserved":
            return int(e.peak_reserved_range[1])
        return int(e.peak_reserved_bytes) if use == "reserved_point" else int(e.peak_allocated_bytes)

    cache: dict[int, Estimate] = {}
    tries: list[dict] = []

    def fits(bs: int) -> bool:
        if bs not in cache:
            e = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=bs, **kwargs)
            cache[bs] = e
            ok = peak(e) <= budget_bytes
            tries.append({"batch_size": bs, "fits": ok, "peak_allocated_bytes": int(e.peak_allocated_bytes),
                          "peak_reserved_bytes": int(e.peak_reserved_bytes),
                          "reason": "fits" if ok else
                          ("reserved (high end) over budget" if use == "reserved" else "allocated over budget")})
            if progress:
                import sys

                print(f"estimate: batch {bs}: {peak(e) / 2**30:.2f} GiB {use}"
                      + (" (high end)" if use == "reserved" else ""), file=sys.stderr)
        return peak(cache[bs]) <= budget_bytes

    best = search_largest(fits, low, high, below_start=False)
    est = cache[best] if best else cache[low]
    return Headroom(
        batch_size=best,
        peak_allocated_bytes=int(est.peak_allocated_bytes) if best else None,
        peak_reserved_bytes=int(est.peak_reserved_bytes) if best else None,
        limit_bytes=int(budget_bytes),
        limit_source=f"budget ({use}, estimated)",
        tries=pd.DataFrame(tries, columns=HEADROOM_COLUMNS),
        estimate=est,
    )


def compare_configurations(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    budget_bytes: int | None = None,
    *,
    batch_size: int | None = None,
    precisions: Iterable[str] = ("fp32", "bf16"),
    checkpointing: Iterable = (False, True),
    **kwargs,
):
    """Estimate several configurations; a DataFrame (one row each, see
    :func:`workbench.analysis.memory.estimate.estimate_table`), with ``fits`` columns if ``budget_bytes`` is
    given (:func:`workbench.analysis.memory.estimate.fits_table`).

    ``compare_configurations(workload, [config, ...], budget_bytes=...)`` estimates those
    configurations; ``compare_configurations(model_fn, inputs_fn, optimizer_fn, ...)`` every
    ``precisions`` × ``checkpointing`` combination.
    """
    if isinstance(model_fn, Workload):
        configs = list(inputs_fn) if inputs_fn is not None else [Configuration("fp32")]
        if isinstance(optimizer_fn, (int, float)) and budget_bytes is None:
            budget_bytes = optimizer_fn  # compare_configurations(workload, configs, budget)
        ests = [estimate(model_fn, c, batch_size=batch_size, **kwargs) for c in configs]
    else:
        ests = [
            estimate(model_fn, inputs_fn, optimizer_fn, precision=p, batch_size=batch_size, checkpointing=c,
                     **kwargs)
            for p in precisions
            for c in checkpointing
        ]
    return fits_table(ests, budget_bytes) if budget_bytes is not None else estimate_table(ests)
