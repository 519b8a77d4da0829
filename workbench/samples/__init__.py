"""Real recorded artifacts shipped with the package, for notebooks, docs and tests on machines without a GPU.

Provenance of each file is in ``README.md`` beside this module.

>>> from workbench import samples
>>> "h200_train_step" in samples.names()
True
>>> samples.path("h200_train_step").name
'h200_train_step.trace.json.gz'
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import BadArgument, WorkbenchError

__all__ = ["names", "path", "describe", "SAMPLES"]

_HERE = Path(__file__).resolve().parent

# name -> (file, kind, one line on what it is)
SAMPLES: dict[str, tuple[str, str, str]] = {
    "h200_train_step": (
        "h200_train_step.trace.json.gz",
        "trace",
        "H200, 3 profiled training steps of a 6-layer d=512 transformer, fp32 AdamW (torch 2.11, CUDA 13)",
    ),
    "h200_train_snapshot": (
        "h200_train.snapshot.pickle.gz",
        "snapshot",
        "H200, allocator snapshot with history after 3 training steps of the same transformer",
    ),
    "h200_oom_snapshot": (
        "h200_oom.snapshot.pickle.gz",
        "snapshot",
        "H200, snapshot written at a real OOM: 8-layer d=1024 transformer, batch 64x1024, 4.19 GiB cap",
    ),
    "h200_memory_timeline": (
        "h200_train.memory_timeline.json.gz",
        "memory_timeline",
        "H200, torch.profiler export_memory_timeline of the profiled training steps (bytes per category)",
    ),
    "h200_nvml_session": (
        "h200_nvml_session.jsonl.gz",
        "nvml",
        "H200, 25 s of NVML samples at 20 Hz: idle, CNN and transformer training, idle",
    ),
    "h200_gpm_session": (
        "h200_gpm_session.jsonl.gz",
        "nvml",
        "H200, 12 s of NVML + GPM counters at 10 Hz: idle, tiny kernels, bf16 GEMM, device copy, idle",
    ),
    "h200_monitoring_session": (
        "h200_monitoring_session.jsonl.gz",
        "nvml",
        "H200, 60 s of NVML at 20 Hz + GPM at 10 Hz over labelled phases (idle, tiny kernels eager and in a CUDA "
        "graph, bf16 GEMM, copy, memory 91.6% full, idle): notebook 13",
    ),
    "h200_timeline_trace": (
        "h200_timeline.trace.json.gz",
        "trace",
        "H200, one run on one clock (1/3): Kineto trace of 8 bf16 training steps, then GEMM, copy and idle phases",
    ),
    "h200_timeline_snapshot": (
        "h200_timeline.snapshot.pickle.gz",
        "snapshot",
        "H200, one run on one clock (2/3): allocator history of the same run",
    ),
    "h200_timeline_nvml": (
        "h200_timeline.gpm.jsonl.gz",
        "nvml",
        "H200, one run on one clock (3/3): NVML + GPM samples at 10 Hz of the same run, with time_ns",
    ),
    "a100_alexnet": (
        "a100_alexnet.trace.json.gz",
        "trace",
        "A100, AlexNet benchmark trace (from Holistic Trace Analysis' test data, MIT)",
    ),
    "v100_nccl_rank0": (
        "v100_nccl_rank0.trace.json.gz",
        "trace",
        "V100, rank 0 of a 1-rank NCCL process group: c10d all_reduce/broadcast calls on the host, "
        "no NCCL kernels on the GPU (from HTA's test data, MIT)",
    ),
    "mi250_rocm": (
        "mi250_rocm.trace.json.gz",
        "trace",
        "AMD MI250, ROCm 6.2 Kineto trace of a toy training loop (from HTA's test data, MIT)",
    ),
    "h200_streams_serial": (
        "h200_streams_serial.trace.json.gz",
        "trace",
        "H200, host-to-device copies then compute on one stream, pageable memory (light detail)",
    ),
    "h200_streams_overlap": (
        "h200_streams_overlap.trace.json.gz",
        "trace",
        "H200, the same work with pinned memory, non_blocking copies on a side stream overlapping compute",
    ),
    **{
        f"lesson11_{rung}_{detail}": (
            f"results/lesson11_{rung}.{detail}.trace.json.gz",
            "trace",
            f"H200, lesson 11: 3 profiled training steps of a 4-layer d=1024 transformer, {what} "
            f"({detail} detail, unprofiled step time stamped by profile_steps)",
        )
        for rung, detail, what in (
            ("fp32", "light", "fp32 without TF32"),
            ("tf32", "light", "TF32 matmuls"),
            ("bf16", "light", "bf16 autocast"),
            ("bf16", "full", "bf16 autocast"),
            ("compile", "light", "bf16 + torch.compile'd forward"),
            ("graph", "light", "the compiled step replayed as one CUDA graph"),
        )
    },
    **{
        f"h200_gpt_{v}": (
            f"results/gpt_{v}.standard.trace.json.gz",
            "trace",
            f"H200, lesson 16: 3 profiled training steps (standard detail, with shapes) of a 12-layer d=1024 "
            f"decoder-only transformer, batch 8x1024, {what}; FLOPs counted by hand in h200_pair('gpt')",
        )
        for v, what in (("fp32", "fp32 without TF32"), ("tf32", "TF32 matmuls"), ("bf16", "bf16 autocast"))
    },
    "h200_gemm_sdpa": (
        "results/gemm_sdpa.standard.trace.json.gz",
        "trace",
        "H200, lesson 16: 4 bf16 8192^3 matmuls and a causal SDPA forward+backward a step, FLOPs known exactly "
        "(recorded beside the measured ceilings, results/h200_ceilings.json)",
    ),
    **{
        f"h200_loader_{v}": (
            f"results/loader_{v}.light.trace.json.gz",
            "trace",
            f"H200, lesson 18: a small CNN fed by a DataLoader whose samples take 1 ms of CPU each, batch 16, {what} "
            "(light detail; unprofiled times in h200_pair('loader'))",
        )
        for v, what in (("workers0", "num_workers=0"), ("workers8_pinned", "8 workers + pin_memory"))
    },
    **{
        f"cpu_loader_{v}": (
            f"results/cpu_loader_{v}.light.trace.json.gz",
            "trace",
            f"2-core CPU, lesson 18: an MLP fed by a DataLoader whose samples sleep 1.5 ms, batch 16, {what} "
            "(light detail; unprofiled times in results/cpu_loader_pairs.json)",
        )
        for v, what in (("workers0", "num_workers=0"), ("workers2", "2 persistent workers, prefetch_factor=4"))
    },
    **{
        f"cpu_compile_{b}_{v}": (
            f"results/cpu_compile_{b}_{v}.standard.trace.json.gz",
            "trace",
            f"2-core CPU, lesson 15: 5 profiled steps of a small MLP compiled with backend={b!r}, {what} "
            "(standard detail; the workbench_compile stamp inside; unprofiled times in results/cpu_compile_pairs.json)",
        )
        for b in ("aot_eager", "inductor")
        for v, what in (("break", "a graph break at .item()"), ("fixed", "the same forward with torch.where: one graph"))
    },
    "cpu_only": (
        "cpu_only.trace.json.gz",
        "trace",
        "CPU-only Kineto trace, no GPU events (from HTA's test data, MIT)",
    ),
    **{
        f"ranks_{scenario}": (
            f"ranks/{scenario}",
            "rank_folder",
            f"4-process gloo DDP run on a CPU, one trace per rank + truth.json: {what} (lesson 14)",
        )
        for scenario, what in (
            ("healthy", "nobody late"),
            ("straggler", "rank 2 sleeps 30 ms before every forward"),
            ("slow_collective", "every rank all-reduces an extra 4M-float buffer each step"),
        )
    },
    "h100_oom_whatif": (
        "oom_whatif",
        "oom_whatif",
        "H100 80GB, lesson 21: three OOMs under a cap (a leak, AdamW's first step, activations in the first "
        "forward), each with every candidate fix run in a fresh process under the same cap (snapshot, "
        ".oom.json sidecar and <scenario>.json per scenario)",
    ),
    "watch_cpu_slow_data": (
        "watch/cpu_slow_data",
        "watch",
        "2-core CPU, lesson 19: a flight recorder's folder (watch(...)): an MLP whose DataLoader slows down at "
        "step 90; baseline, CAPTURE-file, SIGUSR2 and slow captures + recording.json (what was injected)",
    ),
}


def names(kind: str | None = None) -> list[str]:
    """Names of the shipped samples, optionally only those of one ``kind``
    (``trace``, ``snapshot``, ``memory_timeline``, ``nvml``, ``rank_folder``, ``watch``, ``oom_whatif``)."""
    return [n for n, (_, k, _) in SAMPLES.items() if kind is None or k == kind]


def path(name: str) -> Path:
    """Absolute path of a shipped sample (a file; a folder of per-rank traces for the ``rank_folder``
    ones, a flight recorder's folder for the ``watch`` one, a folder of OOM recordings with their fixes run for
    ``h100_oom_whatif``); a clear error lists the names when ``name`` is unknown."""
    try:
        filename = SAMPLES[name][0]
    except KeyError:
        raise BadArgument(
            f"no sample named {name!r}; choose one of: {', '.join(SAMPLES)}"
        ) from None
    p = _HERE / filename
    if not p.exists():
        raise WorkbenchError(f"{p}: sample file missing from the installed package; reinstall gpu-workbench")
    return p


def describe() -> str:
    """A short table of the samples (name, kind, what it is)."""
    width = max(map(len, SAMPLES))
    return "\n".join(f"{n:<{width}}  {k:<15}  {d}" for n, (_, k, d) in SAMPLES.items())
