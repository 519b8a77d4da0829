"""Run one training (or inference) step under several configurations and tabulate what each one buys.

A :class:`Workload` says how to build a fresh model, an optimizer and a batch, and how to compute the
loss; a :class:`Configuration` says what to change (autocast, TF32, checkpointing, compile, memory
format, batch size, or anything a user writes as a function)::

    from workbench.capture.harness import Workload, run_experiment, fp32, tf32, amp_bf16, checkpointing

    work = Workload(model=lambda: Net(), batch=lambda n, dev: torch.randn(n, 512, device=dev),
                    loss=lambda m, x: m(x).square().mean(), batch_size=32)
    exp = run_experiment(work, [fp32(), tf32(), amp_bf16(), checkpointing(Block)])
    exp.ledger                      # one row per configuration (see workbench.io.ledger)

Each configuration is isolated: the model and optimizer are built anew from the factories with the same
seed (so every configuration starts from identical weights and sees identical batches), allocator
statistics are reset, and warm-up steps are not timed. Per configuration it records the median step
time with quartiles (CUDA events on a GPU; wall time with a synchronise elsewhere), peak memory
(the CUDA caching allocator's peak; on CPU the live tensors plus the step's peak measured from
``torch.profiler``'s memory events), throughput, energy per step from NVML's total-energy counter
(missing when unavailable), and optionally a light trace.

The first ``check_steps`` steps double as a numerical check against the fp32 reference: loss, outputs
and gradients are compared (max relative error) and parameter updates that vanish in low precision are
counted (see :class:`NumericalCheck`).

:func:`find_max_batch_size` searches the largest batch that fits (out-of-memory caught, memory cleared
between tries; on CPU against a memory budget you give).

torch is imported inside functions, never at module import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import functools
import gc
import math
import platform
import statistics
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Sequence

import pandas as pd

from workbench.errors import BadArgument, NoDevice
from workbench.io.ledger import ledger_frame

__all__ = [
    # what to run
    "Workload",
    "Configuration",
    "configuration",
    "combine",
    # built-in configurations
    "fp32",
    "tf32",
    "amp_bf16",
    "amp_fp16",
    "pure_fp16",
    "pure_bf16",
    "checkpointing",
    "compiled",
    "channels_last",
    "batch_size_sweep",
    "BUILTIN_CONFIGURATIONS",
    # run it
    "run_experiment",
    "Experiment",
    "ConfigResult",
    "NumericalCheck",
    "find_max_batch_size",
    "Headroom",
    "environment_info",
    "measure_cpu_peak_bytes",
]


def _torch():
    from workbench._optional import import_optional

    return import_optional("torch", "to run the experiment harness")


# --------------------------------------------------------------------------------------------------
# What to run


@dataclass(frozen=True)
class Workload:
    """How to build and run one step; every factory is called anew for each configuration.

    ``model()`` returns a fresh ``nn.Module`` (on any device; the harness moves it).
    ``batch(batch_size, device)`` returns the inputs (tensors, or tuples/dicts of them) for one step.
    ``loss(model, batch)`` runs the forward pass and returns the loss, or ``(loss, outputs)`` so that the
    numerical check can compare outputs too.
    ``optimizer(params)`` builds the optimizer (default: AdamW, lr 1e-3).
    ``tokens_per_sample`` (e.g. the sequence length) turns samples/s into tokens/s as well.
    ``train=False`` runs forward only, under ``torch.no_grad()``.
    """

    model: Callable[[], Any]
    batch: Callable[[int, Any], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Iterable[Any]], Any] | None = None
    batch_size: int = 8
    tokens_per_sample: int | None = None
    train: bool = True


@dataclass(frozen=True)
class Configuration:
    """One way of running the workload. All hooks are optional; each receives the ``torch.device``.

    ``setup(device)``      a context manager held around the whole configuration (backend flags).
    ``context(device)``    a context manager held around each forward + loss (``torch.autocast``).
    ``transform(model, device)``  returns the model to use, after it is on the device and before the
                           optimizer is built (``torch.compile``, checkpointing, ``.half()``).
    ``batch_transform(batch)``  returns the batch to use (memory format, dtype).
    ``grad_scaler``        scale the loss with ``torch.amp.GradScaler`` (fp16 autocast).
    ``batch_size``         overrides the workload's batch size.
    ``requires``           ``"cuda"`` when the configuration only means something on a CUDA device;
                           elsewhere it is skipped with the reason.
    ``compute_dtype``      the lowest precision the math runs in (``float32``, ``tf32``, ``bfloat16``,
                           ``float16``): sets the numerical check's tolerance.
    """

    name: str
    setup: Callable[[Any], ContextManager] | None = None
    context: Callable[[Any], ContextManager] | None = None
    transform: Callable[[Any, Any], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    grad_scaler: bool = False
    batch_size: int | None = None
    requires: str | None = None
    compute_dtype: str = "float32"
    description: str = ""

    def replace(self, **changes) -> "Configuration":
        return dataclasses.replace(self, **changes)


def configuration(name: str | None = None, *, scope: str = "step", description: str = "", **fields):
    """Decorator: turn a function of the device that returns a context manager (or a generator
    function that yields once) into a :class:`Configuration`.

    ``scope="step"`` holds it around each forward pass, ``scope="run"`` around the whole configuration.
    Other :class:`Configuration` fields (``transform=...``, ``compute_dtype=...``) pass through::

        @configuration("sdpa_math")
        def sdpa_math(device):
            return torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH)
    """
    if scope not in ("step", "run"):
        raise BadArgument(f"configuration scope must be 'step' or 'run', not {scope!r}")

    def wrap(fn):
        import inspect

        hook = contextlib.contextmanager(fn) if inspect.isgeneratorfunction(fn) else fn
        key = "context" if scope == "step" else "setup"
        return Configuration(
            name=name or fn.__name__, description=description or (fn.__doc__ or "").strip(),
            **{key: hook}, **fields,
        )

    return wrap


def _chain_contexts(hooks):
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    @contextlib.contextmanager
    def chained(device):
        with contextlib.ExitStack() as stack:
            for h in hooks:
                stack.enter_context(h(device))
            yield

    return chained


def _chain_calls(funcs):
    funcs = [f for f in funcs if f is not None]
    if not funcs:
        return None
    if len(funcs) == 1:
        return funcs[0]

    def chained(obj, *rest):
        for f in funcs:
            obj = f(obj, *rest)
        return obj

    return chained


_PRECISION_ORDER = ["float16", "bfloat16", "tf32", "float32"]


def combine(*configs: Configuration, name: str | None = None) -> Configuration:
    """One configuration doing all of ``configs`` (contexts nested in order, transforms chained):
    ``combine(amp_bf16(), checkpointing(Block))`` is named ``amp_bf16+checkpoint(Block)``."""
    if not configs:
        raise BadArgument("combine() needs at least one configuration")
    dtypes = [c.compute_dtype for c in configs]
    lowest = min(dtypes, key=lambda d: _PRECISION_ORDER.index(d) if d in _PRECISION_ORDER else 99)
    requires = next((c.requires for c in configs if c.requires), None)
    bs = [c.batch_size for c in configs if c.batch_size is not None]
    return Configuration(
        name=name or "+".join(c.name for c in configs),
        setup=_chain_contexts([c.setup for c in configs]),
        context=_chain_contexts([c.context for c in configs]),
        transform=_chain_calls([c.transform for c in configs]),
        batch_transform=_chain_calls([c.batch_transform for c in configs]),
        grad_scaler=any(c.grad_scaler for c in configs),
        batch_size=bs[-1] if bs else None,
        requires=requires,
        compute_dtype=lowest,
        description="; ".join(c.description for c in configs if c.description),
    )


# --------------------------------------------------------------------------------------------------
# Built-in configurations


@contextlib.contextmanager
def _float32_math(device, tf32_enabled: bool):
    """Set cuBLAS and cuDNN TF32 on or off for the block, restoring what was there."""
    torch = _torch()
    if getattr(device, "type", str(device)) != "cuda":
        yield
        return
    old_precision = torch.get_float32_matmul_precision()
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if tf32_enabled else "highest")
    torch.backends.cudnn.allow_tf32 = tf32_enabled
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.backends.cudnn.allow_tf32 = old_cudnn


def fp32() -> Configuration:
    """Plain float32, with TF32 off for matmuls and convolutions (the numerical reference)."""
    return Configuration(
        "fp32", setup=functools.partial(_float32_math, tf32_enabled=False),
        description="float32, TF32 off (reference)",
    )


def tf32() -> Configuration:
    """float32 tensors, matmuls and convolutions on TF32 tensor cores (CUDA, Ampere and newer)."""
    return Configuration(
        "tf32", setup=functools.partial(_float32_math, tf32_enabled=True), requires="cuda",
        compute_dtype="tf32", description="float32 with TF32 matmuls/convolutions",
    )


def _autocast(dtype_name):
    def hook(device):
        torch = _torch()
        return torch.autocast(device.type, dtype=getattr(torch, dtype_name))

    return hook


def amp_bf16() -> Configuration:
    """``torch.autocast`` to bfloat16 (fp32 weights and optimizer)."""
    return Configuration(
        "amp_bf16", context=_autocast("bfloat16"), compute_dtype="bfloat16",
        description="autocast bfloat16",
    )


def amp_fp16(grad_scaler: bool = True) -> Configuration:
    """``torch.autocast`` to float16 with a ``GradScaler`` (``grad_scaler=False`` shows why it is needed)."""
    return Configuration(
        "amp_fp16" if grad_scaler else "amp_fp16_noscaler", context=_autocast("float16"),
        grad_scaler=grad_scaler, compute_dtype="float16",
        description="autocast float16" + (" + GradScaler" if grad_scaler else ", no loss scaling"),
    )


def _map_tensors(obj, fn):
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _pure(dtype_name: str) -> Configuration:
    def transform(model, device):
        torch = _torch()
        return model.to(getattr(torch, dtype_name))

    def batch_transform(batch):
        torch = _torch()
        dt = getattr(torch, dtype_name)
        return _map_tensors(batch, lambda t: t.to(dt) if t.is_floating_point() else t)

    return Configuration(
        f"pure_{'fp16' if dtype_name == 'float16' else 'bf16'}", transform=transform,
        batch_transform=batch_transform, compute_dtype=dtype_name,
        description=f"parameters, optimizer state and inputs in {dtype_name} (no fp32 master weights)",
    )


def pure_fp16() -> Configuration:
    """Everything in float16, no master weights: small updates round away (the numerical check shows it)."""
    return _pure("float16")


def pure_bf16() -> Configuration:
    """Everything in bfloat16, no master weights."""
    return _pure("bfloat16")


def _type_label(module_types) -> str:
    return ",".join(t if isinstance(t, str) else t.__name__ for t in module_types)


def _matches(module, module_types) -> bool:
    for t in module_types:
        if isinstance(t, str):
            if type(module).__name__ == t:
                return True
        elif isinstance(module, t):
            return True
    return False


def checkpointing(*module_types, name: str | None = None) -> Configuration:
    """Activation checkpointing of every module of the given types (classes or class names):
    their activations are recomputed in the backward pass instead of kept
    (``torch.utils.checkpoint``, non-reentrant). Modules inside an already checkpointed one are left alone."""
    if not module_types:
        raise BadArgument(
            "checkpointing() needs the module type to checkpoint, e.g. checkpointing(MyBlock) or "
            "checkpointing('TransformerEncoderLayer')"
        )

    def transform(model, device):
        from torch.utils.checkpoint import checkpoint

        wrapped = []
        for mod_name, module in model.named_modules():
            if not _matches(module, module_types):
                continue
            if any(mod_name.startswith(w + ".") for w in wrapped):
                continue
            original = module.forward

            def forward(*args, _original=original, **kwargs):
                torch = _torch()
                if not torch.is_grad_enabled():
                    return _original(*args, **kwargs)
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)

            module.forward = forward
            wrapped.append(mod_name)
        if not wrapped:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise BadArgument(
                f"checkpointing: the model has no module of type {_type_label(module_types)}; "
                f"give one of its block types: {', '.join(present[:12])}"
            )
        return model

    return Configuration(
        name or f"checkpoint({_type_label(module_types)})", transform=transform,
        description=f"activation checkpointing per {_type_label(module_types)}",
    )


def compiled(**compile_kwargs) -> Configuration:
    """``torch.compile(model, **compile_kwargs)``; the first (compiling) step is a warm-up step."""

    def transform(model, device):
        torch = _torch()
        return torch.compile(model, **compile_kwargs)

    mode = compile_kwargs.get("mode")
    return Configuration(
        f"compile({mode})" if mode else "compile", transform=transform,
        description="torch.compile" + (f" mode={mode}" if mode else ""),
    )


def channels_last() -> Configuration:
    """Model and 4-D inputs in ``torch.channels_last`` memory format (convolution networks)."""

    def transform(model, device):
        torch = _torch()
        return model.to(memory_format=torch.channels_last)

    def batch_transform(batch):
        torch = _torch()
        return _map_tensors(
            batch, lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
        )

    return Configuration("channels_last", transform=transform, batch_transform=batch_transform,
                         description="channels_last memory format")


def batch_size_sweep(sizes: Sequence[int], base: Configuration | None = None) -> list[Configuration]:
    """One configuration per batch size (``bs=8``, ``bs=16``...; ``amp_bf16 bs=16`` with a base)."""
    out = []
    for n in sizes:
        if int(n) < 1:
            raise BadArgument(f"batch sizes must be >= 1, got {n}")
        if base is None:
            out.append(Configuration(f"bs={int(n)}", batch_size=int(n), description=f"batch size {int(n)}"))
        else:
            out.append(base.replace(name=f"{base.name} bs={int(n)}", batch_size=int(n)))
    return out


BUILTIN_CONFIGURATIONS: dict[str, Callable[..., Any]] = {
    "fp32": fp32,
    "tf32": tf32,
    "amp_bf16": amp_bf16,
    "amp_fp16": amp_fp16,
    "pure_fp16": pure_fp16,
    "pure_bf16": pure_bf16,
    "checkpointing": checkpointing,
    "compile": compiled,
    "channels_last": channels_last,
    "batch_size_sweep": batch_size_sweep,
}


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class NumericalCheck:
    """A configuration's first steps against the reference's.

    Relative errors are ``max|x - ref| / max|ref|`` (scaled by the reference's magnitude, so values
    near zero do not blow it up): ``loss_rel_err`` and ``output_max_rel_err`` over the checked steps,
    ``grad_max_rel_err`` over every parameter's gradient.

    ``grad_underflow_fraction``: of the gradient elements that are nonzero in the reference, the
    fraction that are exactly zero here (fp16 gradients flushed to zero without loss scaling).
    ``update_vanished_fraction``: of the parameter elements the reference's step moved, the fraction
    this configuration's step left unchanged.
    ``update_underflow_fraction``: of the parameter elements with a nonzero gradient, the fraction
    whose update is below the parameter dtype's resolution, ``|update| < eps(dtype) * |param|``
    (update rounded away: pure fp16/bf16 weights with small learning rates). Needs no reference.

    Large tensors are checked on a fixed sample of up to ``max_elements`` per tensor (the same
    elements in every configuration). Steps that a GradScaler skipped (inf/NaN at that scale) are
    left out of the update statistics.
    """

    reference: str
    steps: int
    loss_rel_err: float
    output_max_rel_err: float
    grad_max_rel_err: float
    grad_underflow_fraction: float
    update_vanished_fraction: float
    update_underflow_fraction: float
    param_dtype: str
    skipped_steps: int
    verdict: str
    message: str
    per_step: pd.DataFrame = field(repr=False, compare=False, default=None)

    def as_row(self) -> dict:
        return {
            "check_reference": self.reference,
            "check_steps": self.steps,
            "check_loss_rel_err": self.loss_rel_err,
            "check_output_max_rel_err": self.output_max_rel_err,
            "check_grad_max_rel_err": self.grad_max_rel_err,
            "check_grad_underflow_fraction": self.grad_underflow_fraction,
            "check_update_vanished_fraction": self.update_vanished_fraction,
            "check_update_underflow_fraction": self.update_underflow_fraction,
            "check_verdict": self.verdict,
            "check_message": self.message,
        }


@dataclass
class ConfigResult:
    """What one configuration measured (``row`` is its ledger row)."""

    name: str
    status: str
    row: dict
    step_ms: list[float] = field(default_factory=list)
    check: NumericalCheck | None = None
    trace_path: str | None = None
    error: str | None = None


@dataclass
class Experiment:
    """All configurations of one run; ``ledger`` is the DataFrame (one row each)."""

    name: str
    results: list[ConfigResult]
    reference: str | None
    interrupted: bool = False

    @property
    def ledger(self) -> pd.DataFrame:
        return ledger_frame([r.row for r in self.results])

    def result(self, name: str) -> ConfigResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no configuration named {name!r}; have {[r.name for r in self.results]}")

    def checks(self) -> pd.DataFrame:
        """Per-step numerical check of every configuration (configuration, step, loss, errors...)."""
        frames = [r.check.per_step.assign(configuration=r.name) for r in self.results
                  if r.check is not None and r.check.per_step is not None]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def save(self, path, append: bool = True):
        """Add this experiment's rows to a ledger file (``.json`` or ``.parquet``)."""
        from workbench.io.ledger import save_ledger

        return save_ledger(self.ledger, path, append=append)

    def __repr__(self) -> str:
        cols = ["configuration", "status", "step_ms_median", "peak_allocated_bytes", "check_verdict"]
        return f"Experiment({self.name!r}, reference={self.reference!r})\n" + self.ledger[cols].to_string()


@dataclass(frozen=True)
class Headroom:
    """The largest batch size that fitted, the memory it used, and every try."""

    batch_size: int
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    limit_bytes: int | None
    limit_source: str
    tries: pd.DataFrame = field(repr=False, compare=False)

    def __str__(self) -> str:
        peak = "" if self.peak_allocated_bytes is None else f", peak {self.peak_allocated_bytes / 2**30:.2f} GiB"
        limit = "" if self.limit_bytes is None else f" of {self.limit_bytes / 2**30:.2f} GiB ({self.limit_source})"
        return f"largest batch size that fits: {self.batch_size}{peak}{limit}"


# --------------------------------------------------------------------------------------------------
# Environment, energy, memory


def _resolve_device(device):
    torch = _torch()
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise NoDevice(f"device {device!r} asked for but torch sees no CUDA device; use device='cpu'")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_info(device=None) -> dict:
    """Where and when: machine, device, gpu (device name, ``none`` on CPU), torch/CUDA versions, date (UTC)."""
    torch = _torch()
    dev = _resolve_device(device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none"
    return {
        "machine": platform.node(),
        "device": str(dev),
        "gpu": gpu,
        "cpu": _cpu_name(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "none",
        "python_version": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


class _EnergyMeter:
    """NVML's total energy counter (millijoules since driver load) of the device, opened lazily."""

    def __init__(self, device):
        self.handle = None
        self.reason = None
        self._nvml = None
        if device.type != "cuda":
            self.reason = "energy needs an NVIDIA GPU (NVML)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # NVMLError_LibraryNotFound, ImportError
            self.reason = f"NVML unavailable: {exc}"
            return
        handle = None
        try:  # match by UUID: CUDA and NVML number devices differently under CUDA_VISIBLE_DEVICES
            handle = self._handle_by_uuid(pynvml, device)
        except Exception:
            handle = None
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception as exc:
                self.reason = f"NVML could not open the device: {exc}"
        if handle is not None:
            try:
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                self.handle = handle
            except Exception as exc:  # NotSupported on some boards and vGPUs
                self.reason = f"NVML total energy counter unavailable: {exc}"

    @staticmethod
    def _handle_by_uuid(pynvml, device):
        import re

        torch = _torch()

        def hex32(text):
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            m = re.search(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", str(text).lower())
            return m.group(0).replace("-", "") if m else None

        want = hex32(getattr(torch.cuda.get_device_properties(device), "uuid", ""))
        if not want:
            return None
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if hex32(pynvml.nvmlDeviceGetUUID(h)) == want:
                return h
        return None

    def read_mj(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except Exception:
            return None

    def close(self):
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _tensor_bytes(objs) -> int:
    """Bytes of the distinct storages behind the tensors in ``objs`` (nested containers allowed)."""
    torch = _torch()
    seen = set()
    total = 0

    def visit(o):
        nonlocal total
        if isinstance(o, torch.Tensor):
            try:
                st = o.untyped_storage()
                key = (st.data_ptr(), st.device)
                if key not in seen:
                    seen.add(key)
                    total += st.nbytes()
            except Exception:  # tensor subclasses without storage
                total += o.numel() * o.element_size()
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)

    visit(objs)
    return total


def _memory_event_bytes(prof) -> list[tuple[int, int]]:
    """(time_ns, bytes) of every CPU memory event (+alloc, -free) a ``torch.profiler`` session saw."""
    try:
        events = prof.profiler.kineto_results.events()
        out = []
        for e in events:
            if e.name() == "[memory]" and "CPU" in str(e.device_type()):
                out.append((e.start_ns(), int(e.nbytes())))
        return out
    except AttributeError:
        pass
    # Fallback through the public export: "[memory]" instant events with args.Bytes.
    import json
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, encoding="utf-8") as f:
            data = json.load(f)
    finally:
        os.unlink(tmp)
    out = []
    for e in data.get("traceEvents", []):
        if e.get("name") == "[memory]":
            args = e.get("args", {})
            if args.get("Device Type", 0) == 0:  # CPU
                out.append((int(float(e.get("ts", 0)) * 1000), int(args.get("Bytes", 0))))
    return out


def measure_cpu_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated on the CPU by ``fn()`` above what was live when it started, from
    ``torch.profiler``'s memory accounting (``profile_memory=True``): the running sum of its
    allocation (+) and free (-) events, at its highest."""
    _torch()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(_memory_event_bytes(prof))
    running = peak = 0
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return int(peak)


# --------------------------------------------------------------------------------------------------
# One configuration


_DEFAULT_TOLERANCE = {"float32": 1e-4, "tf32": 5e-3, "bfloat16": 5e-2, "float16": 1e-2}


def _sample_index(name: str, n: int, k: int, device):
    """The same ``k`` well-spread element positions of a tensor called ``name`` with ``n`` elements, in
    every configuration: a golden-ratio sequence with a per-name offset (O(k), nothing cached, no
    aliasing with row lengths the way a fixed stride would)."""
    torch = _torch()
    offset = (zlib.crc32(name.encode()) % 10007) / 10007.0
    pos = torch.arange(k, dtype=torch.float64, device=device) * 0.6180339887498949 + offset
    return (torch.frac(pos) * n).long().clamp_(0, n - 1)


def _sample_flat(t, name: str, max_elements: int):
    """A float64 CPU copy of ``t`` flattened (logical order), or of a fixed sample of its elements."""
    torch = _torch()
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if n > max_elements:
        flat = flat[_sample_index(name, n, max_elements, flat.device)]
    return flat.to(device="cpu", dtype=torch.float64)


def _clean_name(name: str) -> str:
    return name.replace("_orig_mod.", "")


def _split_loss(out):
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return out, None
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], (out[1] if len(out) > 1 else None)
    if isinstance(out, dict) and "loss" in out:
        return out["loss"], out.get("outputs", out.get("logits"))
    raise BadArgument(
        "the workload's loss(model, batch) must return a tensor, a (loss, outputs) tuple or "
        f"a dict with 'loss'; it returned {type(out).__name__}"
    )


def _rel_err(x, ref) -> float:
    scale = ref.abs().max().item() if ref.numel() else 0.0
    if ref.numel() == 0 or x.shape != ref.shape:
        return float("nan")
    diff = (x - ref).abs().max().item()
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale


def _sync(device):
    torch = _torch()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory(device):
    torch = _torch()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


class _Runner:
    """Builds the model for one configuration and runs steps; records check data on request."""

    def __init__(self, workload: Workload, config: Configuration, device, seed: int, batch_size: int):
        torch = _torch()
        self.torch = torch
        self.workload = workload
        self.config = config
        self.device = device
        self.seed = seed
        self.batch_size = batch_size
        torch.manual_seed(seed)
        model = workload.model()
        model = model.to(device)
        if config.transform is not None:
            model = config.transform(model, device)
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        if workload.train:
            if workload.optimizer is not None:
                self.optimizer = workload.optimizer(params)
            else:
                self.optimizer = torch.optim.AdamW(params, lr=1e-3)
        else:
            self.optimizer = None
        self.scaler = torch.amp.GradScaler(device.type) if (config.grad_scaler and workload.train) else None
        self.named = [(_clean_name(n), p) for n, p in model.named_parameters() if p.requires_grad]

    def make_batch(self, step: int):
        self.torch.manual_seed(self.seed * 7919 + 1 + step)
        batch = self.workload.batch(self.batch_size, self.device)
        if self.config.batch_transform is not None:
            batch = self.config.batch_transform(batch)
        return batch

    def step(self, batch, step_index: int, record: dict | None = None, max_elements: int = 65536):
        torch = self.torch
        torch.manual_seed(self.seed * 104729 + 7 + step_index)  # same dropout masks in every configuration
        ctx = self.config.context(self.device) if self.config.context is not None else contextlib.nullcontext()
        if not self.workload.train:
            with torch.no_grad(), ctx:
                loss, outputs = _split_loss(self.workload.loss(self.model, batch))
            if record is not None:
                record["loss"] = float(loss.detach().float().item())
                record["outputs"] = None if outputs is None else _sample_flat(outputs.float(), "outputs", 1 << 20)
            return loss
        with ctx:
            loss, outputs = _split_loss(self.workload.loss(self.model, batch))
        scaler, opt = self.scaler, self.optimizer
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if record is not None:
            record["loss"] = float(loss.detach().float().item())
            record["outputs"] = None if outputs is None else _sample_flat(outputs.float(), "outputs", 1 << 20)
            if scaler is not None:
                scaler.unscale_(opt)
            record["grads"] = {
                n: (_sample_flat(p.grad, n, max_elements) if p.grad is not None else None) for n, p in self.named
            }
            before = {n: _sample_flat(p, n, max_elements) for n, p in self.named}
            scale_before = scaler.get_scale() if scaler is not None else None
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if record is not None:
            after = {n: _sample_flat(p, n, max_elements) for n, p in self.named}
            record["params"] = before
            record["updates"] = {n: after[n] - before[n] for n in before}
            record["dtypes"] = {n: p.dtype for n, p in self.named}
            record["skipped"] = bool(scaler is not None and scaler.get_scale() < scale_before)
        opt.zero_grad(set_to_none=True)
        return loss

    def resident_bytes(self) -> int:
        objs = [list(self.model.parameters()), list(self.model.buffers())]
        if self.optimizer is not None:
            objs.append(list(self.optimizer.state.values()))
        return _tensor_bytes(objs)

    def close(self):
        self.model = self.optimizer = self.scaler = self.named = None


def _compare_step(rec: dict, ref: dict | None) -> dict:
    """Per-step numbers of the numerical check (see NumericalCheck)."""
    torch = _torch()
    out = {"loss": rec["loss"], "skipped": rec.get("skipped", False)}
    finite = math.isfinite(rec["loss"])
    if "grads" in rec:
        finite = finite and all(g is None or bool(torch.isfinite(g).all()) for g in rec["grads"].values())
    out["finite"] = finite
    # self-contained: updates below the parameter dtype's resolution, where the gradient asked for a move
    if "updates" in rec and not out["skipped"]:
        under = moved_total = 0
        for n, u in rec["updates"].items():
            g = rec["grads"].get(n)
            if g is None:
                continue
            eps = torch.finfo(rec["dtypes"][n]).eps
            want = g != 0
            under += int(((u.abs() < eps * rec["params"][n].abs()) & want).sum())
            moved_total += int(want.sum())
        out["update_underflow_fraction"] = under / moved_total if moved_total else float("nan")
    else:
        out["update_underflow_fraction"] = float("nan")
    nan = float("nan")
    out.update(loss_rel_err=nan, output_max_rel_err=nan, grad_max_rel_err=nan,
               grad_underflow_fraction=nan, update_vanished_fraction=nan)
    if ref is None:
        return out
    out["loss_rel_err"] = abs(rec["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    if rec.get("outputs") is not None and ref.get("outputs") is not None:
        out["output_max_rel_err"] = _rel_err(rec["outputs"], ref["outputs"])
    if "grads" in rec and "grads" in ref and not out["skipped"]:  # a skipped step's grads are inf by definition
        errs, zero, nonzero = [], 0, 0
        for n, g in rec["grads"].items():
            gr = ref["grads"].get(n)
            if g is None or gr is None or g.shape != gr.shape:
                continue
            errs.append(_rel_err(g, gr))
            nz = gr != 0
            zero += int(((g == 0) & nz).sum())
            nonzero += int(nz.sum())
        errs = [e for e in errs if not math.isnan(e)]
        out["grad_max_rel_err"] = max(errs) if errs else nan
        out["grad_underflow_fraction"] = zero / nonzero if nonzero else nan
    if "updates" in rec and "updates" in ref and not out["skipped"]:
        vanished = moved = 0
        for n, u in rec["updates"].items():
            ur = ref["updates"].get(n)
            if ur is None or u.shape != ur.shape:
                continue
            m = ur != 0
            vanished += int(((u == 0) & m).sum())
            moved += int(m.sum())
        out["update_vanished_fraction"] = vanished / moved if moved else nan
    return out


def _nanmax(values) -> float:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return max(vals) if vals else float("nan")


def _verdict(config: Configuration, stats: list[dict], reference: str, param_dtype: str,
             tolerance: float | None, vanish_threshold: float, not_comparable: str) -> NumericalCheck:
    per_step = pd.DataFrame(stats)
    per_step.insert(0, "step", range(len(stats)))
    loss_err = _nanmax(s["loss_rel_err"] for s in stats)
    out_err = _nanmax(s["output_max_rel_err"] for s in stats)
    grad_err = _nanmax(s["grad_max_rel_err"] for s in stats)
    g_under = _nanmax(s["grad_underflow_fraction"] for s in stats)
    vanished = _nanmax(s["update_vanished_fraction"] for s in stats)
    underflow = _nanmax(s["update_underflow_fraction"] for s in stats)
    skipped = sum(bool(s.get("skipped")) for s in stats)
    skip_note = (f" ({skipped} step(s) skipped by the GradScaler; steps after the first skip are not compared)"
                 if skipped else "")
    tol = tolerance if tolerance is not None else _DEFAULT_TOLERANCE.get(config.compute_dtype, 1e-2)
    worst_update = _nanmax([vanished, underflow])
    if not all(s["finite"] for s in stats if not s.get("skipped")):
        verdict, msg = "nonfinite", "loss or gradients became inf/NaN; use bf16, or fp16 with a GradScaler"
    elif not math.isnan(worst_update) and worst_update > vanish_threshold:
        verdict = "vanishing_updates"
        msg = (f"{worst_update:.1%} of parameter updates vanish in {param_dtype} "
               f"(|update| < eps*|param| or unchanged where fp32 moved); keep fp32 master weights "
               f"(autocast) or raise the update size")
    elif not math.isnan(g_under) and g_under > vanish_threshold:
        verdict = "grad_underflow"
        msg = (f"{g_under:.1%} of gradient elements are zero here but not in {reference}: "
               f"fp16 gradients underflow; scale the loss (torch.amp.GradScaler)")
    elif not_comparable:
        verdict, msg = "n/a", f"{not_comparable}: only update underflow was checked"
    elif (not math.isnan(loss_err) and loss_err > tol) or (not math.isnan(out_err) and out_err > tol) \
            or (not math.isnan(grad_err) and grad_err > 10 * tol):
        verdict = "large_error"
        msg = (f"error against {reference} above what {config.compute_dtype} explains: loss {loss_err:.2e}, "
               f"outputs {out_err:.2e} (tolerance {tol:.0e}), gradients {grad_err:.2e} (tolerance {10 * tol:.0e})")
    else:
        verdict = "ok"
        parts = [f"{what} {val:.2e}" for what, val in
                 (("loss", loss_err), ("outputs", out_err), ("gradients", grad_err)) if not math.isnan(val)]
        msg = f"within {config.compute_dtype} tolerance of {reference}: " + ", ".join(parts)
    msg += skip_note
    return NumericalCheck(
        reference=reference, steps=len(stats), loss_rel_err=loss_err, output_max_rel_err=out_err,
        grad_max_rel_err=grad_err, grad_underflow_fraction=g_under, update_vanished_fraction=vanished,
        update_underflow_fraction=underflow, param_dtype=param_dtype, skipped_steps=skipped,
        verdict=verdict, message=msg, per_step=per_step,
    )


def _is_oom(exc: BaseException) -> bool:
    torch = _torch()
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _run_one(workload, config, device, *, steps, warmup, check_steps, reference_records, reference_name,
             reference_bs, seed, trace, trace_detail, energy, memory, tolerance, vanish_threshold,
             max_elements, env, experiment, record_reference, progress_bar) -> tuple[ConfigResult, list | None]:
    torch = _torch()
    bs = config.batch_size or workload.batch_size
    row = {"experiment": experiment, "configuration": config.name, "batch_size": bs, **env,
           "steps": steps, "warmup": warmup, "description": config.description}
    if config.requires == "cuda" and device.type != "cuda":
        row.update(status="skipped", error=f"{config.name} needs a CUDA device ({config.description})")
        return ConfigResult(config.name, "skipped", row, error=row["error"]), None
    runner = None
    records: list[dict] = []
    step_ms: list[float] = []
    trace_path = None
    meter = None
    failure: tuple[str, str] | None = None
    try:
        _free_memory(device)
        with (config.setup(device) if config.setup is not None else contextlib.nullcontext()):
            runner = _Runner(workload, config, device, seed, bs)
            n_pre = max(warmup, check_steps)
            t_first = None
            for i in range(n_pre):
                batch = runner.make_batch(i)
                rec = {} if i < check_steps else None
                t0 = time.perf_counter()
                runner.step(batch, i, rec, max_elements)
                _sync(device)
                if t_first is None:
                    t_first = (time.perf_counter() - t0) * 1e3
                if rec is not None:
                    records.append(rec)
                if progress_bar is not None:
                    progress_bar.update(1)
            # timed steps, batches made outside the timed region
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            meter = _EnergyMeter(device) if energy else None
            _sync(device)
            e0 = meter.read_mj() if meter else None
            wall0 = time.perf_counter()
            events = []
            for j in range(steps):
                i = n_pre + j
                batch = runner.make_batch(i)
                if device.type == "cuda":
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    runner.step(batch, i)
                    end.record()
                    events.append((start, end))
                else:
                    t0 = time.perf_counter()
                    runner.step(batch, i)
                    step_ms.append((time.perf_counter() - t0) * 1e3)
                if progress_bar is not None:
                    progress_bar.update(1)
            _sync(device)
            wall_s = time.perf_counter() - wall0
            e1 = meter.read_mj() if meter else None
            if events:
                step_ms = [s.elapsed_time(e) for s, e in events]
            if device.type == "cuda":
                row.update(memory_source="cuda_allocator",
                           peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
                           peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
                           timer="cuda_events")
            else:
                row["timer"] = "wall_clock"
                if memory:
                    resident = runner.resident_bytes()
                    k = n_pre + steps
                    batch = runner.make_batch(k)
                    peak_step = measure_cpu_peak_bytes(lambda: runner.step(batch, k))
                    row.update(memory_source="cpu_profiler", peak_allocated_bytes=resident + peak_step,
                               step_peak_bytes=peak_step, resident_bytes=resident)
            if e0 is not None and e1 is not None and e1 >= e0 and steps:
                row["energy_j_per_step"] = (e1 - e0) / 1e3 / steps
                row["power_w"] = (e1 - e0) / 1e3 / wall_s if wall_s > 0 else float("nan")
            elif meter is not None and meter.reason:
                row["energy_note"] = meter.reason
            if trace:
                trace_path = _light_trace(runner, device, trace_detail, n_pre + steps + 1)
                row["trace_path"] = trace_path
        med = statistics.median(step_ms)
        q1, q3 = _quartiles(step_ms)
        row.update(status="ok", first_step_ms=t_first, step_ms_median=med, step_ms_q1=q1, step_ms_q3=q3,
                   step_ms_min=min(step_ms), step_ms_max=max(step_ms),
                   samples_per_s=bs / (med / 1e3) if med > 0 else float("nan"))
        if workload.tokens_per_sample:
            row["tokens_per_s"] = row["samples_per_s"] * workload.tokens_per_sample
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one configuration failing must not lose the others
        failure = ("oom" if _is_oom(exc) else "error", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        # (the exception and its frames, which hold tensors, are dropped at the end of this block)
    finally:
        if meter is not None:
            meter.close()
        if runner is not None:
            runner.close()
        runner = None
        if config.transform is not None and "compile" in config.name:
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
        _free_memory(device)
    if failure is not None:
        row.update(status=failure[0], error=failure[1])
        return ConfigResult(config.name, failure[0], row, error=failure[1]), (records if record_reference else None)
    check = None
    if check_steps and records:
        if record_reference:  # the reference against itself: zero error, but its own update check
            refs, not_comparable = records, ""
        elif reference_records is None:
            refs, not_comparable = [None] * len(records), "the reference did not run (see its status)"
        elif bs != reference_bs:
            refs = [None] * len(records)
            not_comparable = f"batch size {bs} differs from the reference's {reference_bs}"
        else:
            refs, not_comparable = reference_records, ""
        stats, diverged = [], False
        for rec, ref in zip(records, refs):
            # after a step the GradScaler skipped, this run is one update behind the reference:
            # later steps are no longer comparable (their own update check still runs)
            stats.append(_compare_step(rec, None if diverged else ref))
            diverged = diverged or bool(rec.get("skipped"))
        dtypes = records[0].get("dtypes") or {}
        param_dtype = str(next(iter(dtypes.values()))).replace("torch.", "") if dtypes else "n/a"
        check = _verdict(config, stats, reference_name or "none", param_dtype, tolerance, vanish_threshold,
                         not_comparable)
        row.update(check.as_row())
    return ConfigResult(config.name, "ok", row, step_ms=step_ms, check=check, trace_path=trace_path), \
        (records if record_reference else None)


def _light_trace(runner, device, detail, first_index) -> str | None:
    try:
        from workbench.capture.profiler import profile_steps
    except ImportError:  # pragma: no cover - the profiler module ships with the package
        return None
    counter = [first_index]

    def step():
        i = counter[0]
        counter[0] += 1
        runner.step(runner.make_batch(i), i)

    result = profile_steps(step, steps=2, wait=0, warmup=1, detail=detail, device=str(device),
                           progress=False, verbose=False)
    return str(result.path)


# --------------------------------------------------------------------------------------------------
# Public entry points


def _default_experiment_name() -> str:
    return "exp-" + _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def run_experiment(
    workload: Workload,
    configurations: Sequence[Configuration],
    *,
    device=None,
    steps: int = 10,
    warmup: int = 3,
    check_steps: int = 2,
    reference: Configuration | str | None = "fp32",
    seed: int = 0,
    trace: bool = False,
    trace_detail: str = "light",
    energy: bool = True,
    memory: bool = True,
    tolerance: float | None = None,
    vanish_threshold: float = 0.01,
    max_check_elements: int = 65536,
    name: str | None = None,
    ledger=None,
    progress: bool = True,
) -> Experiment:
    """Run ``workload`` under each configuration (in order, each isolated) and return an :class:`Experiment`.

    ``steps`` timed steps follow ``max(warmup, check_steps)`` untimed ones. ``reference`` (default the
    configuration named ``fp32``; an fp32 check-only pass runs first if no configuration has that name;
    ``None`` turns the comparison off) is what the first ``check_steps`` steps are compared with.
    ``trace=True`` also records a light Kineto trace per configuration (``trace_path`` column).
    ``ledger`` (a ``.json``/``.parquet`` path) appends the rows to that file. Ctrl-C stops after
    cleaning up and returns the configurations finished so far (``interrupted=True``).
    """
    _torch()  # a clear MissingDependency before anything else
    if steps < 1 or warmup < 0 or check_steps < 0:
        raise BadArgument(f"need steps >= 1, warmup >= 0, check_steps >= 0 (got {steps}, {warmup}, {check_steps})")
    configs = list(configurations)
    if not configs:
        raise BadArgument("run_experiment needs at least one configuration, e.g. [fp32(), amp_bf16()]")
    names = [c.name for c in configs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise BadArgument(f"configuration names must be unique; repeated: {sorted(dup)} (use .replace(name=...))")
    dev = _resolve_device(device)
    env = environment_info(dev)
    exp_name = name or _default_experiment_name()

    # the reference runs first (timed too, if it is one of the configurations)
    ref_config = None
    if check_steps and reference is not None:
        if isinstance(reference, Configuration):
            ref_config = reference
        else:
            ref_config = next((c for c in configs if c.name == reference), None)
            if ref_config is None and reference == "fp32":
                ref_config = fp32()
            elif ref_config is None:
                raise BadArgument(f"reference {reference!r} is not one of the configurations {names}")
    ordered = configs
    if ref_config is not None and ref_config.name in names:
        ordered = [ref_config] + [c for c in configs if c.name != ref_config.name]

    per_config_steps = max(warmup, check_steps) + steps
    total = per_config_steps * len(ordered) + (check_steps if ref_config is not None and ref_config.name not in names else 0)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="experiment", unit="step", leave=False)
    results: list[ConfigResult] = []
    interrupted = False
    ref_records = None
    ref_bs = None
    kwargs = dict(seed=seed, trace=trace, trace_detail=trace_detail, energy=energy, memory=memory,
                  tolerance=tolerance, vanish_threshold=vanish_threshold, max_elements=max_check_elements,
                  env=env, experiment=exp_name, progress_bar=bar)
    try:
        if ref_config is not None and ref_config.name not in names:
            if bar is not None:
                bar.set_description(f"reference {ref_config.name}")
            _, ref_records = _run_one(
                workload, ref_config, dev, steps=1, warmup=0, check_steps=check_steps, reference_records=None,
                reference_name=None, reference_bs=None, record_reference=True,
                **{**kwargs, "trace": False, "energy": False, "memory": False, "progress_bar": None})
            ref_bs = ref_config.batch_size or workload.batch_size
            if bar is not None:
                bar.update(check_steps)
        for config in ordered:
            if bar is not None:
                bar.set_description(config.name)
            is_ref = ref_config is not None and config.name == ref_config.name
            result, recs = _run_one(
                workload, config, dev, steps=steps, warmup=warmup, check_steps=check_steps,
                reference_records=ref_records, reference_name=ref_config.name if ref_config else None,
                reference_bs=ref_bs, record_reference=is_ref, **kwargs)
            if is_ref:
                ref_records = recs if result.status == "ok" else None
                ref_bs = config.batch_size or workload.batch_size
                if result.check is not None:
                    # the reference against itself: errors are zero by construction; keep its underflow check
                    pass
            if result.status not in ("ok", "skipped"):
                warnings.warn(f"configuration {config.name}: {result.status}: {result.error}", stacklevel=2)
            results.append(result)
    except KeyboardInterrupt:
        interrupted = True
        print(f"experiment interrupted; returning the {len(results)} configuration(s) finished", file=sys.stderr)
    finally:
        if bar is not None:
            bar.close()
        _free_memory(dev)
    # keep the user's order in the ledger
    order = {n: i for i, n in enumerate(names)}
    results.sort(key=lambda r: order.get(r.name, -1))
    exp = Experiment(exp_name, results, ref_config.name if ref_config is not None else None, interrupted)
    if ledger is not None and results:
        exp.save(ledger, append=True)
    return exp


def find_max_batch_size(
    workload: Workload,
    configuration: Configuration | None = None,
    *,
    device=None,
    start: int | None = None,
    max_batch_size: int = 65536,
    memory_budget_bytes: int | None = None,
    steps: int = 2,
    seed: int = 0,
    progress: bool = True,
) -> Headroom:
    """The largest batch size whose training step fits, by doubling from ``start`` (default the
    workload's batch size) until a try fails, then bisecting.

    On CUDA a try fails when it raises out-of-memory (caught; memory is freed before the next try) or,
    when ``memory_budget_bytes`` is given, when its peak allocated memory exceeds it. On CPU a budget is
    required and the peak is measured with :func:`measure_cpu_peak_bytes` (live tensors + the step's peak).
    Each try builds a fresh model and runs ``steps`` steps (the optimizer state appears in the first).
    """
    torch = _torch()
    dev = _resolve_device(device)
    config = configuration or fp32()
    if dev.type != "cuda" and memory_budget_bytes is None:
        raise BadArgument(
            "find_max_batch_size on CPU needs memory_budget_bytes (a CPU run would only stop when the "
            "machine swaps); give e.g. memory_budget_bytes=2 * 2**30"
        )
    if steps < 1:
        raise BadArgument("find_max_batch_size needs steps >= 1")
    limit = memory_budget_bytes
    limit_source = "budget"
    if limit is None:
        limit = torch.cuda.get_device_properties(dev).total_memory
        limit_source = "device total"
    tries: list[dict] = []
    cache: dict[int, dict] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc="headroom", unit="try", leave=False)

    def attempt(bs: int) -> bool:
        if bs in cache:
            return cache[bs]["fits"]
        runner = None
        rec = {"batch_size": bs, "fits": False, "peak_allocated_bytes": None, "peak_reserved_bytes": None,
               "reason": ""}
        failed = None
        try:
            _free_memory(dev)
            with (config.setup(dev) if config.setup is not None else contextlib.nullcontext()):
                runner = _Runner(workload, config.replace(batch_size=bs), dev, seed, bs)
                for i in range(steps - (0 if dev.type == "cuda" else 1)):
                    runner.step(runner.make_batch(i), i)
                _sync(dev)
                if dev.type == "cuda":
                    rec["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(dev))
                    rec["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(dev))
                else:
                    k = steps - 1
                    batch = runner.make_batch(k)
                    peak = measure_cpu_peak_bytes(lambda: runner.step(batch, k))
                    rec["peak_allocated_bytes"] = runner.resident_bytes() + peak
            over = memory_budget_bytes is not None and rec["peak_allocated_bytes"] > memory_budget_bytes
            rec["fits"] = not over
            rec["reason"] = "over budget" if over else "fits"
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            if not _is_oom(exc):
                failed = exc
            else:
                rec["reason"] = "out of memory"
        finally:
            if runner is not None:
                runner.close()
            runner = None
            _free_memory(dev)
        if failed is not None:
            raise failed
        cache[bs] = rec
        tries.append(rec)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(batch_size=bs, fits=rec["fits"])
        return rec["fits"]

    try:
        lo_ok, hi_bad = 0, None
        bs = max(1, int(start or workload.batch_size))
        if attempt(bs):
            lo_ok = bs
            while bs < max_batch_size:
                bs = min(bs * 2, max_batch_size)
                if attempt(bs):
                    lo_ok = bs
                else:
                    hi_bad = bs
                    break
        else:
            hi_bad = bs
        if hi_bad is not None:
            while hi_bad - lo_ok > 1:
                mid = (lo_ok + hi_bad) // 2
                if attempt(mid):
                    lo_ok = mid
                else:
                    hi_bad = mid
    finally:
        if bar is not None:
            bar.close()
    best = cache.get(lo_ok, {})
    return Headroom(
        batch_size=lo_ok,
        peak_allocated_bytes=best.get("peak_allocated_bytes"),
        peak_reserved_bytes=best.get("peak_reserved_bytes"),
        limit_bytes=int(limit) if limit is not None else None,
        limit_source=limit_source,
        tries=pd.DataFrame(tries, columns=["batch_size", "fits", "peak_allocated_bytes", "peak_reserved_bytes", "reason"]),
    )
