"""The fake step: the harness's Workload and Configuration run on fake tensors under the tracker.

:func:`trace_workload_memory` builds the model on the ``meta`` device, makes its parameters fake CPU
tensors, and runs inputs, forward + loss (under CUDA's autocast policy, :mod:`.autocast`, and cuDNN's
LSTM, :mod:`.lstm`), backward and the optimizer step under ``FakeTensorMode`` with the
:class:`~workbench.capture.estimate.tracker.StorageTracker`; it returns the plain record that
:func:`workbench.analysis.memory.estimate.estimate_from_record` replays through the allocator model.
:func:`step_description` turns a step given as functions into a Workload and a Configuration.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_leaves

from workbench.analysis.memory import cudnn_model
from workbench.capture.configurations import (
    Configuration,
    Workload,
    _split_loss,
    check_precision,
    checkpointed_modules,
    tf32_setting,
)
from workbench.capture.estimate.autocast import AUTOCAST_DTYPES, _CudaAutocastOnCpu
from workbench.capture.estimate.lstm import cudnn_rnn
from workbench.capture.estimate.tracker import CUBLAS_WORKSPACE_BYTES, StorageTracker

__all__ = ["float32_math", "step_description", "trace_step_memory", "trace_workload_memory"]


def float32_math(precision: str = "fp32", strict_fp32: bool | None = None, configuration=None) -> dict:
    """The math CUDA runs float32 convolutions and matmuls in (``"tf32"`` or ``"fp32"``), and where that comes
    from: ``{"convolutions": ..., "matmuls": ..., "source": ...}``.

    ``precision="tf32"``: both TF32. ``strict_fp32=True``: both fp32 (TF32 off, as the harness's ``fp32()``
    reference). A ``configuration`` whose setup sets TF32 on or off (:func:`tf32_setting`): what it sets.
    Otherwise what an untouched script gets: torch's flags as they are now, read at estimate time
    (``torch.backends.cudnn.allow_tf32``, True by default: cuDNN convolutions in TF32;
    ``torch.backends.cuda.matmul.allow_tf32`` / ``torch.get_float32_matmul_precision()``, off by default).
    Under bf16/fp16 autocast it is the math of the float32 ops autocast leaves."""
    p = check_precision(precision)
    if p == "tf32" and strict_fp32:
        from workbench.errors import BadArgument

        raise BadArgument("precision tf32 and strict fp32 contradict each other: give one")
    setting = tf32_setting(configuration) if configuration is not None and strict_fp32 is None else None
    if p == "tf32":
        conv = mm = True
        source = "precision tf32"
    elif strict_fp32:
        conv = mm = False
        source = "strict fp32 (TF32 off)"
    elif setting is not None:
        conv = mm = setting
        source = f"configuration {configuration.name!r} sets TF32 {'on' if setting else 'off'}"
    else:
        conv = bool(torch.backends.cudnn.allow_tf32)
        mm = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
        source = (f"torch's flags at estimate time (torch.backends.cudnn.allow_tf32={conv}, "
                  f"torch.backends.cuda.matmul.allow_tf32={mm})")
    return {"convolutions": "tf32" if conv else "fp32", "matmuls": "tf32" if mm else "fp32", "source": source}


def _to_fake(model: torch.nn.Module, mode, tracker: StorageTracker) -> dict[int, str]:
    """Replace meta parameters and buffers by fake CPU tensors (ties kept); returns storage key -> name."""
    memo: dict[int, torch.Tensor] = {}
    keys: dict[int, str] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            table = getattr(mod, kind)
            for n, t in list(table.items()):
                if t is None:
                    continue
                fake = memo.get(id(t))
                if fake is None:
                    with mode:
                        data = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                    fake = torch.nn.Parameter(data, requires_grad=t.requires_grad) if kind == "_parameters" else data
                    memo[id(t)] = fake
                    key = tracker.note(fake, "parameter" if kind == "_parameters" else "buffer")
                    keys[key] = f"{mod_name}.{n}" if mod_name else n
                table[n] = fake
    return keys


def _own_structure(model: torch.nn.Module) -> torch.nn.Module:
    """The module to trace: ``model`` itself when ``model_fn`` built it here (its tensors are on the meta
    device), else a copy of its structure whose parameters and buffers are meta tensors of the same shapes
    (no data copied), so that an existing model handed in (``lambda: model``) is left as it was: the
    estimate replaces the tensors of the module it traces."""
    import copy

    from torch.nn.parameter import is_lazy

    tensors = [*model.parameters(), *model.buffers()]
    if all(t.is_meta or is_lazy(t) for t in tensors):
        return model
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for kind in ("_parameters", "_buffers"):
            for t in getattr(mod, kind).values():
                if t is None or id(t) in memo or is_lazy(t):  # a lazy tensor holds no data: copied as it is
                    continue
                meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                memo[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(
                    t, torch.nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def _materialize_lazy(model, workload, config, batch_size) -> None:
    """Lazy modules (``nn.LazyLinear``, ``nn.LazyBatchNorm1d``...) get their shapes from a first forward, as
    a script's dry run gives them before the optimizer is built: one forward without gradients on the meta
    device (where the model is built), untracked."""
    from torch.nn.parameter import is_lazy

    if not any(is_lazy(t) for t in (*model.parameters(), *model.buffers())):
        return
    meta = torch.device("meta")
    with meta, torch.no_grad():
        inputs = workload.batch(batch_size, meta)
        if config.batch_transform is not None:
            inputs = config.batch_transform(inputs)
        workload.loss(model, inputs)


def _forward_loss(model, inputs, loss_fn):
    """The model run on ``inputs`` as they come (a dict of keyword arguments, a sequence of positional
    ones, or one tensor) and the loss of its output: ``loss_fn(out)``, or the mean square of its first
    tensor. The output is dropped on return, as a training step drops it before backward."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    return loss_fn(out) if loss_fn is not None else _first_tensor(out).float().pow(2).mean()


def _first_tensor(out):
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    raise TypeError("the model's output holds no floating-point tensor to take a loss from; pass loss_fn")


def _call(fn: Callable, batch_size):
    return fn(batch_size) if batch_size is not None else fn()


def _no_optimizer(params):
    return None


def step_description(
    model_fn: Callable[[], torch.nn.Module],
    inputs_fn: Callable[..., Any],
    optimizer_fn: Callable | None = None,
    *,
    precision: str = "fp32",
    batch_size: int | None = None,
    loss_fn: Callable | None = None,
    checkpointing=False,
) -> tuple[Workload, Configuration]:
    """The harness's :class:`Workload` and :class:`Configuration` for a step given as functions:
    ``inputs_fn(batch_size)`` (or ``inputs_fn()`` when ``batch_size`` is None) gives the model's inputs,
    ``loss_fn(output)`` the loss (default: the mean square of the output's first floating tensor, in
    float32), ``optimizer_fn=None`` means no optimizer step. ``precision`` ``bf16``/``fp16`` is CUDA
    autocast around forward and loss (the Configuration's rule: autocast follows the precision)."""
    p = check_precision(precision)
    workload = Workload(
        model=model_fn,
        batch=lambda n, device: _call(inputs_fn, n),
        loss=lambda model, inputs: _forward_loss(model, inputs, loss_fn),
        optimizer=optimizer_fn if optimizer_fn is not None else _no_optimizer,
        batch_size=batch_size,
    )
    name = p + ("+checkpointing" if checkpointing else "")
    config = Configuration(name, precision=p, checkpointing=checkpointing)
    return workload, config


def trace_step_memory(
    model_fn: Callable[[], torch.nn.Module],
    inputs_fn: Callable[..., Any],
    optimizer_fn: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    *,
    precision: str = "fp32",
    batch_size: int | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    checkpointing=False,
    steps: int = 2,
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_BYTES,
    conv_workspaces=None,
    strict_fp32: bool | None = None,
) -> dict:
    """Run ``steps`` training steps on fake tensors; return the record of storage births and deaths.

    ``model_fn()`` builds the ``nn.Module`` (it runs under ``torch.device("meta")``, so build on the
    default device); ``inputs_fn(batch_size)`` (or ``inputs_fn()`` when ``batch_size`` is None)
    returns a tensor, a tuple of positional inputs or a dict of keyword inputs; ``optimizer_fn``
    gets the parameters (None: no optimizer step); ``loss_fn(output)`` defaults to the mean of the
    output's squares in float32. ``precision``: ``fp32``/``tf32`` (same memory) or ``bf16``/``fp16``
    (CUDA autocast around forward and loss). The functions become a Workload and a Configuration
    (:func:`step_description`) and go through :func:`trace_workload_memory`.
    """
    workload, config = step_description(model_fn, inputs_fn, optimizer_fn, precision=precision,
                                        batch_size=batch_size, loss_fn=loss_fn, checkpointing=checkpointing)
    return trace_workload_memory(workload, config, batch_size=batch_size, steps=steps,
                                 cublas_workspace_bytes=cublas_workspace_bytes, conv_workspaces=conv_workspaces,
                                 strict_fp32=strict_fp32)


def trace_workload_memory(
    workload: Workload,
    configuration: Configuration | None = None,
    *,
    batch_size: int | None = None,
    steps: int = 2,
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_BYTES,
    conv_workspaces=None,
    strict_fp32: bool | None = None,
) -> dict:
    """Run ``steps`` steps of the harness's ``workload`` under ``configuration`` on fake tensors; return
    the record of storage births and deaths (:func:`workbench.analysis.memory.estimate.estimate_from_record`
    turns it into peaks).

    As in the harness: the model comes from ``workload.model()`` (here under ``torch.device("meta")``),
    then ``configuration.transform`` (checkpointing, a dtype cast, a memory format; a ``torch_compile``
    configuration is estimated eager), inputs from ``workload.batch(batch_size, torch.device("cpu"))``
    then ``batch_transform``, the loss from ``workload.loss(model, batch)`` under the configuration's
    ``context`` and, with ``autocast``, CUDA's autocast policy at its ``precision``; the optimizer from
    ``workload.optimizer`` (AdamW at lr 1e-3 when None; a factory returning None means no optimizer
    step). ``workload.train=False`` runs forward only, under ``torch.no_grad()``. ``batch_size``
    defaults to the configuration's, then the workload's. ``conv_workspaces``: a
    :class:`~workbench.analysis.memory.cudnn_model.ConvWorkspaces` measured on the GPU
    (:func:`workbench.capture.cudnn_calibration.calibrate`); the calls it holds take its bytes instead of
    the rules'. The record's ``conv_calls`` lists every distinct convolution call (what a calibration measures).
    ``strict_fp32``: float32 convolutions and matmuls without TF32; None: the configuration's setting, else
    torch's flags read now (:func:`float32_math`, the record's ``meta["float32_math"]``).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    # The step collects its reference cycles (gc.collect) twice a step so that storages die where the GPU's
    # would. A full collection walks every object of the process (~0.1 s with torch loaded, 90% of a small
    # model's estimate): what exists before the step is frozen out of the walk (gc.freeze) and thawed after.
    frozen = gc.get_freeze_count() == 0
    if frozen:
        gc.freeze()
    try:
        return _trace(workload, configuration, batch_size, steps, cublas_workspace_bytes, conv_workspaces,
                      strict_fp32)
    finally:
        if frozen:
            gc.unfreeze()


def _trace(workload, configuration, batch_size, steps, cublas_workspace_bytes, conv_workspaces, strict_fp32) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = configuration if configuration is not None else Configuration("fp32")
    if batch_size is None:
        batch_size = config.batch_size or workload.batch_size
    device = torch.device("cpu")  # the fake tensors' device (see the module's docstring)
    with torch.device("meta"):
        model = workload.model()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return a torch.nn.Module, not {type(model).__name__}")
    model = _own_structure(model)
    model.train(workload.train)
    n_ckpt = len(checkpointed_modules(model, config.checkpointing))
    if config.transform is not None and not config.torch_compile:
        model = config.transform(model, device)
    _materialize_lazy(model, workload, config, batch_size)
    names = {id(m): (n or type(m).__name__) for n, m in model.named_modules()}

    mode = FakeTensorMode()
    tracker = StorageTracker()
    tracker.workspace_bytes = int(cublas_workspace_bytes)
    math = float32_math(config.precision, strict_fp32, config)  # read after model(): a file may set the flags
    tracker.conv_math = math["convolutions"]
    if conv_workspaces is None:  # a table shipped for this GPU, torch and cuDNN, where one is (False: none)
        from workbench.capture.estimate.convolution import shipped_table

        conv_workspaces = shipped_table()
    conv_workspaces = conv_workspaces or None
    tracker.conv_table = conv_workspaces
    param_keys = _to_fake(model, mode, tracker)
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)
    param_bytes = sum(p.untyped_storage().nbytes() for p in params)

    def pre_hook(module, args):
        tracker.module_stack.append(names.get(id(module), type(module).__name__))

    def post_hook(module, args, output):
        if tracker.module_stack:
            tracker.module_stack.pop()

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    h2 = torch.nn.modules.module.register_module_forward_hook(post_hook, always_call=True)
    autocast = _CudaAutocastOnCpu(AUTOCAST_DTYPES.get(config.precision) if config.autocast else None)
    categories: dict[int, str] = {k: "parameters" for k in param_keys}
    grad_keys: set[int] = set()
    state_keys: set[int] = set()
    host_keys: set[int] = set()
    input_keys: set[int] = set()
    optimizer_name = None
    phase_marks: list[tuple[int, str, int]] = []  # (event index, phase, step)
    try:
        with mode, tracker, autocast, cudnn_rnn(tracker, autocast.lower):
            opt = None
            if workload.train:
                trainable = [p for p in params if p.requires_grad]
                opt = (workload.optimizer(trainable) if workload.optimizer is not None
                       else torch.optim.AdamW(trainable, lr=1e-3))
            if opt is not None:
                optimizer_name = type(opt).__name__
                for group in opt.param_groups:
                    # CUDA default for foreach=None (the tensors here are on the fake CPU device)
                    if group.get("foreach", "absent") is None and not group.get("fused"):
                        group["foreach"] = True
            for step in range(steps):
                tracker.step = step
                tracker.phase = "inputs"
                phase_marks.append((len(tracker.events), "inputs", step))
                start = len(tracker.events)
                inputs = workload.batch(batch_size, device)
                if config.batch_transform is not None:
                    inputs = config.batch_transform(inputs)
                input_keys |= {e[1] for e in tracker.events[start:] if e is not None and e[0] == "alloc"}
                tracker.phase = "forward"
                phase_marks.append((len(tracker.events), "forward", step))
                with contextlib.ExitStack() as forward:
                    if not workload.train:
                        forward.enter_context(torch.no_grad())
                    forward.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
                    if config.context is not None:
                        forward.enter_context(config.context(device))
                    loss = _split_loss(workload.loss(model, inputs))[0]
                del inputs
                if workload.train:
                    tracker.phase = "backward"
                    phase_marks.append((len(tracker.events), "backward", step))
                    loss.backward()
                    tracker.settle_accumulation()
                del loss
                gc.collect()
                for p in params:
                    if p.grad is not None:
                        grad_keys.add(tracker.uid_of(p.grad))
                if opt is not None:
                    tracker.phase = "optimizer"
                    phase_marks.append((len(tracker.events), "optimizer", step))
                    opt.step()
                    for p, state in opt.state.items():
                        for name, v in state.items():
                            if isinstance(v, torch.Tensor):
                                k = tracker.uid_of(v)
                                fused = opt.defaults.get("fused") or opt.defaults.get("capturable")
                                if name == "step" and v.dim() == 0 and not fused:
                                    host_keys.add(k)  # a host-side counter on CUDA
                                else:
                                    state_keys.add(k)
                    opt.zero_grad(set_to_none=True)
                gc.collect()
            tracker.phase = "end"
            del opt
    finally:
        h1.remove()
        h2.remove()
    for k in grad_keys:
        categories.setdefault(k, "gradients")
    for k in state_keys:
        categories.setdefault(k, "optimizer_state")
    events = [e for e in tracker.events if e is not None and e[1] not in host_keys]
    # Host tensors that an inputs function builds and then copies to the device (x.cuda()) die
    # inside the inputs phase: they were never device memory.
    born_in_inputs = {e[1] for e in events if e[0] == "alloc" and e[3] == "inputs"}
    died_in_inputs = {e[1] for e in events if e[0] == "free" and e[3] == "inputs"} & born_in_inputs
    events = [e for e in events if e[1] not in died_in_inputs]
    for k in input_keys - died_in_inputs:
        categories.setdefault(k, "activations")
    for e in events:
        if e[1] < 0:
            categories[e[1]] = "workspace"
    return {
        "meta": {
            "precision": config.precision,
            "batch_size": batch_size,
            "checkpointing": bool(config.checkpointing),
            "checkpointed_modules": n_ckpt,
            "configuration": config.name,
            "optimizer": optimizer_name,
            "parameters": int(n_params),
            "parameter_bytes": int(param_bytes),
            "model": type(model).__name__,
            "steps": steps,
            "train": bool(workload.train),
            "cublas_workspace_bytes": int(cublas_workspace_bytes),
            "workspace_bound_source": cudnn_model.CONV_BOUND_SOURCE if tracker.upper else "",
            # where each convolution call's workspace came from: measured (a calibration table) or the rules
            "conv_workspaces": {"calls": tracker.conv_measured + tracker.conv_ruled,
                                "measured": tracker.conv_measured, "ruled": tracker.conv_ruled,
                                "table": dict(conv_workspaces.meta) if conv_workspaces is not None else None},
            # the math of float32 convolutions (their cuDNN workspaces) and matmuls, and where it comes from
            "float32_math": math,
            # values the data decides and fake tensors do not hold, and what was assumed for them
            "data_dependent": dict(tracker.data_dependent),
            "torch_version": torch.__version__,
            "fake_device": "cpu",
            **_flops_meta(tracker.flops, steps),
        },
        "events": {
            "action": [e[0] for e in events],
            "key": [e[1] for e in events],
            "nbytes": [e[2] for e in events],
            "phase": [e[3] for e in events],
            "module": [e[4] for e in events],
            "op": [e[5] for e in events],
            # where a workspace is not predictable (fp32 cuDNN convolutions): the most each may take
            **({"nbytes_upper": [tracker.upper.get(e[1], e[2]) if e[0] == "alloc" else e[2] for e in events]}
               if tracker.upper else {}),
        },
        "categories": categories,
        "step_of_event": _steps_of(events, tracker.events, phase_marks),
        "conv_calls": {k: tracker.conv_calls[k] for k in sorted(tracker.conv_calls)},
    }


def _flops_meta(flops: dict[int, dict[str, float]], steps: int) -> dict:
    """Model FLOPs a step (GEMMs, convolutions, attention; causal attention halved) from the last step
    traced (the first may differ: lazily built optimizer state)."""
    last = flops.get(max(flops)) if flops else {}
    model = sum(v for k, v in last.items() if k in ("gemm", "conv", "attention"))
    return {"model_flops_per_step": float(model), "flops_by_kind": {k: float(v) for k, v in sorted(last.items())}}


def _steps_of(kept, all_events, marks) -> list[int]:
    """Training-step index of each kept event (events are filtered, so map through identity)."""
    order = {id(e): i for i, e in enumerate(all_events)}
    starts = [(i, s) for i, ph, s in marks if ph == "inputs"]
    out = []
    j = 0
    for e in kept:
        i = order[id(e)]
        while j + 1 < len(starts) and starts[j + 1][0] <= i:
            j += 1
        out.append(starts[j][1] if starts and i >= starts[0][0] else 0)
    return out


def _describe(step, configuration, optimizer_fn, precision, batch_size, loss_fn, checkpointing):
    """(Workload, Configuration) from either form of the estimator's arguments."""
    if isinstance(step, Workload):
        if not (configuration is None or isinstance(configuration, Configuration)):
            raise TypeError("with a Workload, the second argument is a Configuration (or None: fp32)")
        if optimizer_fn is not None or loss_fn is not None:
            raise TypeError("with a Workload, the optimizer and the loss come from it; "
                            "do not pass optimizer_fn or loss_fn")
        config = configuration if configuration is not None else Configuration("fp32")
        changes = {}
        if precision is not None:  # checked by the Configuration; autocast follows it (bf16: autocast bf16)
            changes.update(precision=precision, autocast=None)
        if checkpointing is not None:
            changes["checkpointing"] = checkpointing
        return step, (config.replace(**changes) if changes else config)
    if configuration is None:
        raise TypeError("estimate(model_fn, inputs_fn, ...) needs inputs_fn, or pass a Workload")
    return step_description(step, configuration, optimizer_fn, precision=precision or "fp32",
                            batch_size=batch_size, loss_fn=loss_fn, checkpointing=checkpointing or False)
