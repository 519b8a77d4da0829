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

This module is the front of four: :mod:`workbench.capture.configurations` (what to run),
:mod:`workbench.capture.environment` (device, machine, energy, CPU memory),
:mod:`workbench.capture.runner` (running and the batch-size search) and
:mod:`workbench.analysis.experiment` (verdicts, statistics and the result records, no torch). Every
name it had is still importable from here.

torch is imported inside functions, never at module import.
"""

from __future__ import annotations

from workbench.analysis.experiment import ConfigResult, Experiment, Headroom, NumericalCheck
from workbench.capture.configurations import (
    BUILTIN_CONFIGURATIONS,
    Configuration,
    Workload,
    amp_bf16,
    amp_fp16,
    batch_size_sweep,
    channels_last,
    checkpointing,
    combine,
    compiled,
    configuration,
    fp32,
    pure_bf16,
    pure_fp16,
    tf32,
)
from workbench.capture.environment import environment_info, measure_cpu_peak_bytes
from workbench.capture.runner import RunOptions, find_max_batch_size, run_experiment

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
    "RunOptions",
    "Experiment",
    "ConfigResult",
    "NumericalCheck",
    "find_max_batch_size",
    "Headroom",
    "environment_info",
    "measure_cpu_peak_bytes",
]
