"""The experiment harness: run one training (or inference) step under several configurations and
tabulate what each one buys; search the largest batch that fits.

A :class:`~workbench.capture.configurations.Workload` says how to build a fresh model, an optimizer and
a batch, and how to compute the loss; a :class:`~workbench.capture.configurations.Configuration` says
what to change (autocast, TF32, checkpointing, compile, memory format, batch size, or anything a user
writes as a function)::

    from workbench import Workload, configs, run_experiment

    work = Workload(model=lambda: Net(), batch=lambda n, dev: torch.randn(n, 512, device=dev),
                    loss=lambda m, x: m(x).square().mean(), batch_size=32)
    exp = run_experiment(work, [configs.fp32(), configs.tf32(), configs.amp_bf16(), configs.checkpointing(Block)])
    exp.ledger                      # one row per configuration (see workbench.io.ledger)

:func:`run_experiment` → :class:`~workbench.analysis.experiment.Experiment`. Each configuration is
isolated: the model and optimizer are built anew from the factories with the same seed (so every
configuration starts from identical weights and sees identical batches), allocator statistics are
reset, and warm-up steps are not timed. Per configuration it records the median step time with
quartiles (CUDA events on a GPU; wall time with a synchronise elsewhere), peak memory (the CUDA caching
allocator's peak; on CPU the live tensors plus the step's peak measured from ``torch.profiler``'s memory
events), throughput, energy per step from NVML's total-energy counter (missing when unavailable), and
optionally a light trace.

The first ``check_steps`` steps double as a numerical check against the fp32 reference: loss, outputs
and gradients are compared (max relative error) and parameter updates that vanish in low precision are
counted (see :class:`~workbench.analysis.experiment.NumericalCheck`).

:func:`find_max_batch_size` → :class:`~workbench.analysis.experiment.Headroom` searches the largest
batch that fits (out-of-memory caught, memory cleared between tries; on CPU against a memory budget you
give).

How one configuration runs (:func:`_run_one`): memory freed (gc, ``empty_cache``, peaks reset) ->
``setup`` entered -> ``torch.manual_seed(seed)`` -> a fresh model from the factory, moved to the device,
with ``transform`` applied (checkpointing included) -> a fresh optimizer (and ``GradScaler``) ->
``max(warmup, check_steps)`` untimed steps (each forward + loss under ``torch.autocast`` when the
configuration's ``autocast`` is set, then its ``context``; the first ``check_steps`` record loss, outputs,
unscaled gradients and parameter updates on a fixed sample of at most 64k elements per tensor) ->
``steps`` timed steps with the energy counter read around them -> peak memory -> the optional light
trace -> everything freed. The reference (``fp32`` unless told otherwise) runs first; a failing
configuration (OOM, exception) becomes a row with ``status`` and ``error``; Ctrl-C returns the rows done.

The harness is four modules: :mod:`workbench.capture.configurations` (what to run),
:mod:`workbench.capture.environment` (device, machine, energy, CPU memory), this one (running and the
batch-size search: what it measures) and :mod:`workbench.analysis.experiment` (what the numbers mean:
verdicts, statistics, the bisection and the result records; no torch). Each name is imported from the
module that defines it; the front-door names (``Workload``, ``run_experiment``, the built-in
configurations) also from ``workbench``.

torch is imported inside functions, never at module import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import sys
import time
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd

from workbench.analysis.experiment import (
    HEADROOM_COLUMNS,
    ConfigResult,
    Experiment,
    Headroom,
    numerical_check,
    precision_name,
    search_largest,
    step_time_stats,
)
from workbench.capture.configurations import Configuration, Workload, _split_loss, _torch, fp32, torch_dtype
from workbench.capture.environment import (
    _EnergyMeter,
    _free_memory,
    _is_oom,
    _resolve_device,
    _sync,
    _tensor_bytes,
    environment_info,
    measure_cpu_peak_bytes,
)
from workbench.errors import BadArgument, WorkbenchError

__all__ = ["run_experiment", "find_max_batch_size", "RunOptions"]


def _sample_index(name: str, n: int, k: int, device):
    """The same ``k`` well-spread element positions of a tensor called ``name`` with ``n`` elements, in
    every configuration: a golden-ratio sequence with a per-name offset (O(k), nothing cached, no
    aliasing with row lengths the way a fixed stride would)."""
    torch = _torch()
    offset = (zlib.crc32(name.encode()) % 10007) / 10007.0
    pos = torch.arange(k, dtype=torch.float64, device=device) * 0.6180339887498949 + offset
    return (torch.frac(pos) * n).long().clamp_(0, n - 1)


def _sample_flat(t, name: str, max_elements: int):
    """A float64 numpy copy of ``t`` flattened (logical order), or of a fixed sample of its elements."""
    torch = _torch()
    flat = t.detach().reshape(-1)
    n = flat.numel()
    if n > max_elements:
        flat = flat[_sample_index(name, n, max_elements, flat.device)]
    return flat.to(device="cpu", dtype=torch.float64).numpy()


def _clean_name(name: str) -> str:
    return name.replace("_orig_mod.", "")


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

    def _forward_context(self):
        """What is held around each forward + loss: autocast (the configuration's ``autocast`` and
        ``precision``), then its ``context`` hook."""
        config = self.config
        stack = contextlib.ExitStack()
        if config.autocast:
            stack.enter_context(self.torch.autocast(self.device.type, dtype=torch_dtype(config.precision)))
        if config.context is not None:
            stack.enter_context(config.context(self.device))
        return stack

    def step(self, batch, step_index: int, record: dict | None = None, max_elements: int = 65536):
        torch = self.torch
        torch.manual_seed(self.seed * 104729 + 7 + step_index)  # same dropout masks in every configuration
        ctx = self._forward_context()
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
            record["dtypes"] = {n: precision_name(p.dtype) for n, p in self.named}
            record["eps"] = {n: float(torch.finfo(p.dtype).eps) for n, p in self.named}
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


# --------------------------------------------------------------------------------------------------
# One configuration


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run_experiment` runs each configuration (one object instead of ~20 keywords).

    ``steps`` timed steps follow ``max(warmup, check_steps)`` untimed ones, the first ``check_steps``
    of which record the numerical-check samples (``max_elements`` per tensor). ``reference_records``
    (the reference's check records, or None), ``reference_name`` and ``reference_batch_size`` are what
    a configuration is compared with; ``record_reference`` marks the reference's own run (its records
    are returned). ``env`` and ``experiment`` go on every ledger row.
    """

    steps: int = 10
    warmup: int = 3
    check_steps: int = 2
    seed: int = 0
    trace: bool = False
    trace_detail: str = "light"
    energy: bool = True
    memory: bool = True
    tolerance: float | None = None
    vanish_threshold: float = 0.01
    max_elements: int = 65536
    env: dict = dataclasses.field(default_factory=dict)
    experiment: str = ""
    progress_bar: Any = None
    reference_records: list | None = None
    reference_name: str | None = None
    reference_batch_size: int | None = None
    record_reference: bool = False

    def replace(self, **changes) -> "RunOptions":
        return dataclasses.replace(self, **changes)


def _run_one(workload: Workload, config: Configuration, device, opts: RunOptions) -> tuple[ConfigResult, list | None]:
    torch = _torch()
    steps, warmup, check_steps = opts.steps, opts.warmup, opts.check_steps
    bar = opts.progress_bar
    bs = config.batch_size or workload.batch_size
    row = {"experiment": opts.experiment, "configuration": config.name, "batch_size": bs, **opts.env,
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
            runner = _Runner(workload, config, device, opts.seed, bs)
            n_pre = max(warmup, check_steps)
            t_first = None
            for i in range(n_pre):
                batch = runner.make_batch(i)
                rec = {} if i < check_steps else None
                t0 = time.perf_counter()
                runner.step(batch, i, rec, opts.max_elements)
                _sync(device)
                if t_first is None:
                    t_first = (time.perf_counter() - t0) * 1e3
                if rec is not None:
                    records.append(rec)
                if bar is not None:
                    bar.update(1)
            # timed steps, batches made outside the timed region
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            meter = _EnergyMeter(device) if opts.energy else None
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
                if bar is not None:
                    bar.update(1)
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
                if opts.memory:
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
            if opts.trace:
                trace_path = _light_trace(runner, device, opts.trace_detail, n_pre + steps + 1)
                row["trace_path"] = trace_path
        row.update(status="ok", first_step_ms=t_first,
                   **step_time_stats(step_ms, bs, workload.tokens_per_sample))
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
        if config.torch_compile:
            with contextlib.suppress(Exception):
                torch._dynamo.reset()
        _free_memory(device)
    own_records = records if opts.record_reference else None
    if failure is not None:
        row.update(status=failure[0], error=failure[1])
        return ConfigResult(config.name, failure[0], row, error=failure[1]), own_records
    check = None
    if check_steps and records:
        if opts.record_reference:  # the reference against itself: zero error, but its own update check
            refs, not_comparable = records, ""
        elif opts.reference_records is None:
            refs, not_comparable = [None] * len(records), "the reference did not run (see its status)"
        elif bs != opts.reference_batch_size:
            refs = [None] * len(records)
            not_comparable = f"batch size {bs} differs from the reference's {opts.reference_batch_size}"
        else:
            refs, not_comparable = opts.reference_records, ""
        check = numerical_check(records, refs, opts.reference_name or "none", config.precision, opts.tolerance,
                                opts.vanish_threshold, not_comparable)
        row.update(check.as_row())
    return ConfigResult(config.name, "ok", row, step_ms=step_ms, check=check, trace_path=trace_path), own_records


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
    opts = RunOptions(steps=steps, warmup=warmup, check_steps=check_steps, seed=seed, trace=trace,
                      trace_detail=trace_detail, energy=energy, memory=memory, tolerance=tolerance,
                      vanish_threshold=vanish_threshold, max_elements=max_check_elements, env=env,
                      experiment=exp_name, progress_bar=bar)
    try:
        if ref_config is not None and ref_config.name not in names:
            if bar is not None:
                bar.set_description(f"reference {ref_config.name}")
            # a check-only pass: one timed step, nothing else measured
            _, ref_records = _run_one(workload, ref_config, dev, opts.replace(
                steps=1, warmup=0, record_reference=True, trace=False, energy=False, memory=False,
                progress_bar=None))
            ref_bs = ref_config.batch_size or workload.batch_size
            if bar is not None:
                bar.update(check_steps)
        for config in ordered:
            if bar is not None:
                bar.set_description(config.name)
            is_ref = ref_config is not None and config.name == ref_config.name
            result, recs = _run_one(workload, config, dev, opts.replace(
                reference_records=ref_records, reference_name=ref_config.name if ref_config else None,
                reference_batch_size=ref_bs, record_reference=is_ref))
            if is_ref:
                # the reference against itself: errors are zero by construction; it keeps its underflow check
                ref_records = recs if result.status == "ok" else None
                ref_bs = config.batch_size or workload.batch_size
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
    workload's batch size) until a try fails, then bisecting
    (:func:`~workbench.analysis.experiment.search_largest`).

    On CUDA a try fails when it raises out-of-memory (caught; memory is freed before the next try) or,
    when ``memory_budget_bytes`` is given, when its peak allocated memory exceeds it. On CPU a budget is
    required and the peak is measured with :func:`measure_cpu_peak_bytes` (live tensors + the step's peak).
    Each try builds a fresh model and runs ``steps`` steps (the optimizer state appears in the first).
    The estimator's :func:`~workbench.capture.estimate.largest_batch_that_fits` answers the same
    question without running anything and returns the same :class:`Headroom`.
    """
    torch = _torch()
    dev = _resolve_device(device)
    config = configuration or fp32()
    if dev.type != "cuda" and memory_budget_bytes is None:
        raise WorkbenchError(
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
        best_bs = search_largest(attempt, max(1, int(start or workload.batch_size)), max_batch_size)
    finally:
        if bar is not None:
            bar.close()
    best = cache.get(best_bs, {})
    return Headroom(
        batch_size=best_bs,
        peak_allocated_bytes=best.get("peak_allocated_bytes"),
        peak_reserved_bytes=best.get("peak_reserved_bytes"),
        limit_bytes=int(limit) if limit is not None else None,
        limit_source=limit_source,
        tries=pd.DataFrame(tries, columns=HEADROOM_COLUMNS),
    )
