"""What to run and how: :class:`Workload` (one training or inference step) and :class:`Configuration`
(one way of running it), the ``configuration`` decorator, ``combine``, and the built-in configurations.

The same two objects describe a step to the experiment harness (:mod:`workbench.capture.runner`, which
runs it) and to the estimator (:mod:`workbench.capture.estimate`, which runs it on fake tensors). What
matters for memory and numerics is in fields both read: ``precision`` (one spelling: ``fp32``,
``tf32``, ``bf16``, ``fp16``), ``autocast``, ``checkpointing``, ``batch_size``, ``grad_scaler``.

torch is imported inside functions, never at module import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Sequence

from workbench.analysis.experiment import PRECISIONS, lowest_precision, precision_name
from workbench.errors import BadArgument, WorkbenchError

__all__ = [
    "Workload",
    "Configuration",
    "configuration",
    "combine",
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
    "BuiltinConfigurations",
    "configs",
    "checkpointed_modules",
    "apply_checkpointing",
    "torch_dtype",
    "check_precision",
    "tf32_setting",
    "AUTOCAST_PRECISIONS",
]


def _torch():
    from workbench._optional import import_optional

    return import_optional("torch", "to run the experiment harness")


# the precisions autocast runs at; a Configuration at one of them runs under autocast unless it says otherwise
AUTOCAST_PRECISIONS: tuple[str, ...] = ("bf16", "fp16")


def check_precision(value: Any) -> str:
    """The one spelling of ``value`` as a precision (``fp32``, ``tf32``, ``bf16``, ``fp16``; ``bfloat16``,
    ``float16``, ``float32`` and torch dtypes are read as those), or :class:`~workbench.errors.BadArgument`.

    The one check of a precision: :class:`Configuration`, the estimator, ``workbench estimate --precision``
    and the panels all call it, so a bad value gets the same one line everywhere.

    >>> check_precision("bfloat16")
    'bf16'
    """
    p = precision_name(value)
    if p not in PRECISIONS:
        raise BadArgument(f"precision {value!r} is not one of {', '.join(PRECISIONS)} "
                          "(bfloat16, float16 and float32 are read as bf16, fp16 and fp32)")
    return p


def torch_dtype(precision: str):
    """The torch dtype tensors hold at ``precision`` (``tf32`` is float32 storage)."""
    torch = _torch()
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[precision_name(precision)]


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

    The estimator takes the same object: it calls ``batch(batch_size, torch.device("cpu"))`` (its
    fake tensors live on the CPU device) and ``loss(model, batch)`` on fake tensors.
    """

    model: Callable[[], Any]
    batch: Callable[[int, Any], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Iterable[Any]], Any] | None = None
    batch_size: int = 8
    tokens_per_sample: int | None = None
    train: bool = True


def _split_loss(out):
    """``(loss, outputs)`` from what a workload's ``loss(model, batch)`` returned: a tensor, a
    ``(loss, outputs)`` tuple or a dict with ``loss`` (and ``outputs`` or ``logits``)."""
    torch = _torch()
    if isinstance(out, torch.Tensor):
        return out, None
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], (out[1] if len(out) > 1 else None)
    if isinstance(out, dict) and "loss" in out:
        return out["loss"], out.get("outputs", out.get("logits"))
    raise WorkbenchError(
        "the workload's loss(model, batch) must return a tensor, a (loss, outputs) tuple or "
        f"a dict with 'loss'; it returned {type(out).__name__}"
    )


@dataclass(frozen=True)
class Configuration:
    """One way of running the workload. All hooks are optional; each receives the ``torch.device``.

    ``setup(device)``      a context manager held around the whole configuration (backend flags).
    ``context(device)``    a context manager held around each forward + loss.
    ``transform(model, device)``  returns the model to use, after it is on the device and before the
                           optimizer is built (``torch.compile``, checkpointing, ``.half()``).
    ``batch_transform(batch)``  returns the batch to use (memory format, dtype).
    ``grad_scaler``        scale the loss with ``torch.amp.GradScaler`` (fp16 autocast).
    ``batch_size``         overrides the workload's batch size.
    ``requires``           ``"cuda"`` when the configuration only means something on a CUDA device;
                           elsewhere it is skipped with the reason.
    ``precision``          the lowest precision the math runs in: ``fp32``, ``tf32``, ``bf16`` or
                           ``fp16`` (other spellings such as ``bfloat16`` are normalised; anything else
                           raises :class:`~workbench.errors.BadArgument`, see :func:`check_precision`).
                           Sets the numerical check's tolerance and, with ``autocast``, the autocast dtype.
    ``autocast``           run each forward + loss under ``torch.autocast`` to ``precision``. Left out
                           (None), it follows the precision: on for ``bf16``/``fp16``, off for
                           ``fp32``/``tf32``; so ``Configuration("x", precision="bf16")`` runs autocast
                           bf16, as the estimator does. ``autocast=False`` at bf16/fp16 is for a
                           configuration that casts by itself (``pure_bf16``: a ``transform``).
    ``checkpointing``      activation checkpointing: module classes or class names (a tuple), or True
                           (each element of every ``nn.ModuleList``; else each child of a top-level
                           ``nn.Sequential``). A configuration given only this field gets the
                           transform that applies it (see :func:`apply_checkpointing`).
    ``torch_compile``      the transform compiles the model (the compiler's caches are reset after).
    """

    name: str
    setup: Callable[[Any], ContextManager] | None = None
    context: Callable[[Any], ContextManager] | None = None
    transform: Callable[[Any, Any], Any] | None = None
    batch_transform: Callable[[Any], Any] | None = None
    grad_scaler: bool = False
    batch_size: int | None = None
    requires: str | None = None
    precision: str = "fp32"
    autocast: bool | None = None
    checkpointing: Any = ()
    torch_compile: bool = False
    description: str = ""

    def __post_init__(self):
        p = check_precision(self.precision)
        object.__setattr__(self, "precision", p)
        autocast = p in AUTOCAST_PRECISIONS if self.autocast is None else bool(self.autocast)
        if autocast and p not in AUTOCAST_PRECISIONS:
            raise BadArgument(f"autocast needs precision 'bf16' or 'fp16', not {p!r}")
        object.__setattr__(self, "autocast", autocast)
        spec = self.checkpointing
        if spec is None or spec is False:
            spec = ()
        elif spec is not True and not isinstance(spec, (tuple, list)):
            spec = (spec,)
        elif isinstance(spec, list) and not all(isinstance(s, (type, str)) for s in spec):
            spec = tuple(spec)  # explicit modules
        elif isinstance(spec, list):
            spec = tuple(spec)
        object.__setattr__(self, "checkpointing", spec)
        t = self.transform
        if isinstance(t, functools.partial) and t.func is _checkpoint_transform and t.keywords["spec"] != spec:
            # .replace(checkpointing=...) of a checkpointing configuration: its transform follows the field
            t = functools.partial(_checkpoint_transform, spec=spec, require=t.keywords["require"]) if spec else None
        elif spec and t is None:
            t = functools.partial(_checkpoint_transform, spec=spec, require=False)
        object.__setattr__(self, "transform", t)

    def replace(self, **changes) -> "Configuration":
        """A copy with ``changes``. A new ``precision`` without ``autocast`` keeps autocast following the
        precision where it did here (``fp32().replace(precision="bf16")`` runs autocast bf16); a
        configuration that set autocast against its precision (``pure_bf16``) keeps it."""
        if "precision" in changes and "autocast" not in changes \
                and self.autocast == (self.precision in AUTOCAST_PRECISIONS):
            changes["autocast"] = None
        return dataclasses.replace(self, **changes)


def configuration(name: str | None = None, *, scope: str = "step", description: str = "", **fields):
    """Decorator: turn a function of the device that returns a context manager (or a generator
    function that yields once) into a :class:`Configuration`.

    ``scope="step"`` holds it around each forward pass, ``scope="run"`` around the whole configuration.
    Other :class:`Configuration` fields (``transform=...``, ``precision=...``) pass through;
    ``precision="bf16"`` also turns autocast on (pass ``autocast=False`` if the hook sets the precision
    itself)::

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

    chained.hooks = hooks  # what tf32_setting reads
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


def _combined_checkpointing(configs):
    specs = [c.checkpointing for c in configs if c.checkpointing]
    if any(s is True for s in specs):
        if any(s is not True for s in specs):
            raise WorkbenchError("combine(): checkpointing=True (every block) and checkpointing by module "
                                 "type do not combine; give the module types")
        return True
    return tuple(x for s in specs for x in s)


def combine(*configs: Configuration, name: str | None = None) -> Configuration:
    """One configuration doing all of ``configs`` (contexts nested in order, transforms chained):
    ``combine(amp_bf16(), checkpointing(Block))`` is named ``amp_bf16+checkpoint(Block)``."""
    if not configs:
        raise BadArgument("combine() needs at least one configuration")
    lowest = lowest_precision(c.precision for c in configs)
    # a component at bf16/fp16 without autocast opted out (pure_bf16 casts by itself): any() is the rule
    autocast = any(c.autocast for c in configs)
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
        precision=lowest,
        autocast=autocast,
        checkpointing=_combined_checkpointing(configs),
        torch_compile=any(c.torch_compile for c in configs),
        description="; ".join(c.description for c in configs if c.description),
    )


# --------------------------------------------------------------------------------------------------
# Activation checkpointing: one selection and one wrapper, for the harness and the estimator


def _matches(module, module_types) -> bool:
    for t in module_types:
        if isinstance(t, str):
            if type(module).__name__ == t:
                return True
        elif isinstance(t, type) and isinstance(module, t):
            return True
    return False


def _type_label(module_types) -> str:
    return ",".join(t if isinstance(t, str) else t.__name__ for t in module_types)


def checkpointed_modules(model, spec) -> list:
    """Modules ``spec`` selects for activation checkpointing.

    ``spec`` is False/None/() (none), True (each element of every ``nn.ModuleList`` in the model, i.e.
    the usual "per block"; for a model without one, each child of a top-level ``nn.Sequential``), a
    module class or class name, a tuple of them (every instance; modules inside one already selected are
    left alone), or an explicit list of modules.
    """
    torch = _torch()
    if spec is None or spec is False or (isinstance(spec, (tuple, list)) and not spec):
        return []
    if spec is True:
        found = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
        if not found and isinstance(model, torch.nn.Sequential):
            found = list(model.children())
        return found
    if isinstance(spec, (type, str)):
        spec = (spec,)
    if all(isinstance(s, (type, str)) for s in spec):
        chosen, names = [], []
        for mod_name, module in model.named_modules():
            if module is model or not _matches(module, spec):
                continue
            if any(mod_name.startswith(w + ".") for w in names):
                continue
            chosen.append(module)
            names.append(mod_name)
        return chosen
    return list(spec)


def apply_checkpointing(model, spec, *, require: bool = False) -> int:
    """Wrap the forward of the modules ``spec`` selects (:func:`checkpointed_modules`) in
    ``torch.utils.checkpoint`` (non-reentrant; a forward without grad runs plain); returns how many.

    The harness, the estimator and the estimator's GPU check all go through it, so they checkpoint the
    same modules. ``require=True`` raises when the spec selects nothing.
    """
    from torch.utils.checkpoint import checkpoint

    torch = _torch()
    mods = checkpointed_modules(model, spec)
    if require and not mods:
        present = sorted({type(m).__name__ for m in model.modules()})
        label = "every block" if spec is True else _type_label(spec if isinstance(spec, (tuple, list)) else (spec,))
        raise WorkbenchError(
            f"checkpointing: the model has no module of type {label}; "
            f"give one of its block types: {', '.join(present[:12])}"
        )
    for m in mods:
        original = m.forward

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        m.forward = forward
    return len(mods)


def _checkpoint_transform(model, device, *, spec, require: bool):
    apply_checkpointing(model, spec, require=require)
    return model


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


def tf32_setting(config: "Configuration") -> bool | None:
    """Whether ``config``'s setup turns TF32 on (True: :func:`tf32`) or off (False: :func:`fp32`, the strict
    reference) for matmuls and convolutions, also inside a :func:`combine`; None where it leaves torch's flags
    as they are (then what they say at run time holds). The estimator reads it to know the math of fp32 ops."""
    hooks = [config.setup]
    found = None
    while hooks:
        h = hooks.pop(0)
        if isinstance(h, functools.partial) and h.func is _float32_math:
            found = bool(h.keywords.get("tf32_enabled"))
        hooks.extend(getattr(h, "hooks", ()))
    return found


def fp32() -> Configuration:
    """Plain float32, with TF32 off for matmuls and convolutions (the numerical reference)."""
    return Configuration(
        "fp32", setup=functools.partial(_float32_math, tf32_enabled=False),
        description="fp32, TF32 off (reference)",
    )


def tf32() -> Configuration:
    """float32 tensors, matmuls and convolutions on TF32 tensor cores (CUDA, Ampere and newer)."""
    return Configuration(
        "tf32", setup=functools.partial(_float32_math, tf32_enabled=True), requires="cuda",
        precision="tf32", description="fp32 with TF32 matmuls/convolutions",
    )


def amp_bf16() -> Configuration:
    """``torch.autocast`` to bfloat16 (fp32 weights and optimizer)."""
    return Configuration("amp_bf16", precision="bf16", description="autocast bf16")


def amp_fp16(grad_scaler: bool = True) -> Configuration:
    """``torch.autocast`` to float16 with a ``GradScaler`` (``grad_scaler=False`` shows why it is needed)."""
    return Configuration(
        "amp_fp16" if grad_scaler else "amp_fp16_noscaler", precision="fp16",
        grad_scaler=grad_scaler,
        description="autocast fp16" + (" + GradScaler" if grad_scaler else ", no loss scaling"),
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


def _pure(precision: str) -> Configuration:
    def transform(model, device):
        return model.to(torch_dtype(precision))

    def batch_transform(batch):
        dt = torch_dtype(precision)
        return _map_tensors(batch, lambda t: t.to(dt) if t.is_floating_point() else t)

    return Configuration(
        f"pure_{precision}", transform=transform, batch_transform=batch_transform, precision=precision,
        autocast=False,
        description=f"parameters, optimizer state and inputs in {precision} (no fp32 master weights)",
    )


def pure_fp16() -> Configuration:
    """Everything in float16, no master weights: small updates round away (the numerical check shows it)."""
    return _pure("fp16")


def pure_bf16() -> Configuration:
    """Everything in bfloat16, no master weights."""
    return _pure("bf16")


def checkpointing(*module_types, name: str | None = None) -> Configuration:
    """Activation checkpointing of every module of the given types (classes or class names):
    their activations are recomputed in the backward pass instead of kept
    (``torch.utils.checkpoint``, non-reentrant). Modules inside an already checkpointed one are left alone."""
    if not module_types:
        raise WorkbenchError(
            "checkpointing() needs the module type to checkpoint, e.g. checkpointing(MyBlock) or "
            "checkpointing('TransformerEncoderLayer')"
        )
    return Configuration(
        name or f"checkpoint({_type_label(module_types)})",
        transform=functools.partial(_checkpoint_transform, spec=tuple(module_types), require=True),
        checkpointing=tuple(module_types),
        description=f"activation checkpointing per {_type_label(module_types)}",
    )


def compiled(**compile_kwargs) -> Configuration:
    """``torch.compile(model, **compile_kwargs)``; the first (compiling) step is a warm-up step."""

    def transform(model, device):
        torch = _torch()
        return torch.compile(model, **compile_kwargs)

    mode = compile_kwargs.get("mode")
    return Configuration(
        f"compile({mode})" if mode else "compile", transform=transform, torch_compile=True,
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


class BuiltinConfigurations:
    """The built-in configurations behind one name (``from workbench import configs``)::

        run_experiment(work, [configs.fp32(), configs.tf32(), configs.amp_bf16(), configs.checkpointing(Block)])

    Each attribute is the function of this module of the same name; ``list(configs)`` names them."""

    fp32 = staticmethod(fp32)
    tf32 = staticmethod(tf32)
    amp_bf16 = staticmethod(amp_bf16)
    amp_fp16 = staticmethod(amp_fp16)
    pure_fp16 = staticmethod(pure_fp16)
    pure_bf16 = staticmethod(pure_bf16)
    checkpointing = staticmethod(checkpointing)
    compiled = staticmethod(compiled)
    channels_last = staticmethod(channels_last)
    batch_size_sweep = staticmethod(batch_size_sweep)

    def __iter__(self):
        return iter(k for k in vars(BuiltinConfigurations) if not k.startswith("_"))

    def __repr__(self) -> str:
        return f"configs: {', '.join(self)}"


#: the built-in configurations, one name on the front door
configs = BuiltinConfigurations()
