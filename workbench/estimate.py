"""Predict a training step's peak GPU memory without a GPU: the one-call entry points.

    >>> from workbench.estimate import estimate
    >>> e = estimate(lambda: torch.nn.Linear(1024, 1024), lambda bs: torch.randn(bs, 1024),
    ...              lambda p: torch.optim.AdamW(p), batch_size=64)          # doctest: +SKIP
    >>> e.peak_allocated_bytes, e.by_category                                # doctest: +SKIP

This module sits outside the layers on purpose: the step runs on fake tensors in
``workbench.capture.estimate`` (torch), and the caching-allocator replay and tables are in
``workbench.analysis`` (no torch); capture may not import analysis, so the function that chains
them lives here. torch is imported on first call, not at import.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any, Callable, Iterable

from workbench.errors import BadArgument, BadArtifact

__all__ = [
    "estimate",
    "largest_batch_that_fits",
    "compare_configurations",
    "load_estimate_file",
    "EstimateFile",
]


def estimate(
    model_fn: Callable,
    inputs_fn: Callable,
    optimizer_fn: Callable | None = None,
    precision: str = "fp32",
    batch_size: int | None = None,
    loss_fn: Callable | None = None,
    checkpointing=False,
    device: str = "cuda",
    steps: int = 2,
    cublas_workspace_bytes: int | None = None,
):
    """Peak GPU memory of ``steps`` training steps, predicted on fake tensors.

    Returns :class:`workbench.analysis.estimate.Estimate`: ``peak_allocated_bytes`` (what
    ``torch.cuda.max_memory_allocated()`` would report), ``peak_reserved_bytes``
    (``max_memory_reserved()``), ``by_phase``, ``by_category``, ``by_module`` and a ``timeline``.
    Neither includes the CUDA context (~0.5 GiB on an H200, outside the caching allocator).
    ``device`` must be ``"cuda"``: the allocator modelled is CUDA's.
    """
    if device not in ("cuda", "cuda:0"):
        raise BadArgument(f"device={device!r}: only the CUDA caching allocator is modelled; use device='cuda'")
    from workbench.analysis.estimate import estimate_from_record
    from workbench.capture.estimate import CUBLAS_WORKSPACE_BYTES, trace_step_memory

    record = trace_step_memory(
        model_fn, inputs_fn, optimizer_fn, precision=precision, batch_size=batch_size, loss_fn=loss_fn,
        checkpointing=checkpointing, steps=steps,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_BYTES if cublas_workspace_bytes is None else cublas_workspace_bytes,
    )
    return estimate_from_record(record)


def largest_batch_that_fits(
    model_fn: Callable,
    inputs_fn: Callable,
    optimizer_fn: Callable | None = None,
    budget_bytes: int = 80 * 2**30,
    *,
    low: int = 1,
    high: int = 1 << 16,
    use: str = "reserved",
    progress: bool = False,
    **kwargs,
) -> tuple[int, Any]:
    """Largest batch size in ``[low, high]`` whose estimated peak fits ``budget_bytes`` (binary search).

    ``use`` is ``"reserved"`` (default, what the process holds) or ``"allocated"``. Returns
    ``(batch_size, estimate)``, or ``(0, estimate at low)`` when even ``low`` does not fit. Assumes the
    peak grows with the batch size (checked by the tests on the model families of the benchmark).
    """
    if use not in ("reserved", "allocated"):
        raise BadArgument("use must be 'reserved' or 'allocated'")
    attr = f"peak_{use}_bytes"
    cache: dict[int, Any] = {}

    def at(bs: int):
        if bs not in cache:
            cache[bs] = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=bs, **kwargs)
            if progress:
                import sys

                print(f"estimate: batch {bs}: {getattr(cache[bs], attr) / 2**30:.2f} GiB {use}", file=sys.stderr)
        return cache[bs]

    if getattr(at(low), attr) > budget_bytes:
        return 0, cache[low]
    # grow geometrically first (cheap when the answer is small), then bisect
    lo, hi = low, low
    while hi < high:
        nxt = min(high, hi * 2)
        if getattr(at(nxt), attr) > budget_bytes:
            hi = nxt
            break
        lo = hi = nxt
    else:
        return lo, cache[lo]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if getattr(at(mid), attr) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo, cache[lo]


def compare_configurations(
    model_fn: Callable,
    inputs_fn: Callable,
    optimizer_fn: Callable | None = None,
    budget_bytes: int | None = None,
    *,
    batch_size: int | None = None,
    precisions: Iterable[str] = ("fp32", "bf16"),
    checkpointing: Iterable = (False, True),
    **kwargs,
):
    """Estimate every precision x checkpointing combination; a DataFrame, with ``fits`` columns if
    ``budget_bytes`` is given (see :func:`workbench.analysis.estimate.fits_table`)."""
    from workbench.analysis.estimate import estimate_table, fits_table

    ests = [
        estimate(model_fn, inputs_fn, optimizer_fn, precision=p, batch_size=batch_size, checkpointing=c, **kwargs)
        for p in precisions
        for c in checkpointing
    ]
    return fits_table(ests, budget_bytes) if budget_bytes is not None else estimate_table(ests)


class EstimateFile:
    """The functions a model file for ``workbench estimate FILE.py`` defines."""

    def __init__(self, path: Path, model, batch, optimizer, loss):
        self.path, self.model, self.batch, self.optimizer, self.loss = path, model, batch, optimizer, loss


def load_estimate_file(path) -> EstimateFile:
    """Run a model file and take its ``model()``, ``batch(batch_size)``, ``optimizer(parameters)``
    and optional ``loss(output)``. Raises :class:`BadArtifact` naming the file and what is missing.

    The file is Python and runs with your permissions: only pass files you trust.
    """
    p = Path(path)
    if not p.is_file():
        raise BadArtifact(p, "no such file", "give the path of a .py file that defines model(), batch(batch_size) "
                          "and optimizer(parameters)")
    try:
        ns = runpy.run_path(str(p), run_name="workbench_estimate_model")
    except SyntaxError as exc:
        raise BadArtifact(p, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the file and run again") from None
    except Exception as exc:  # the user's module failed at import time
        raise BadArtifact(p, f"running the file raised {type(exc).__name__}: {exc}",
                          "fix the file so that importing it succeeds") from None
    missing = [n for n in ("model", "batch", "optimizer") if not callable(ns.get(n))]
    if missing:
        raise BadArtifact(p, f"does not define {', '.join(f'{m}()' for m in missing)}",
                          "define model() -> nn.Module, batch(batch_size) -> tuple of inputs, "
                          "optimizer(parameters) -> optimizer, and optionally loss(output)")
    loss = ns.get("loss")
    return EstimateFile(p, ns["model"], ns["batch"], ns["optimizer"], loss if callable(loss) else None)
