"""Builds notebooks/00_tour.ipynb: the three data sources of the workbench, one panel each.

Run: .venv/bin/python notebooks/_build/build_00_tour.py, then execute it in place with nbconvert
(notebooks/_build/README.md).
"""

from _diag_nb import SETUP, code, md, write

cells = [
    md("""
    # 00 · A tour of the workbench

    The workbench looks at a PyTorch program through **three data sources**:

    | source | question it answers | panel |
    |---|---|---|
    | a **profile** (torch.profiler / Kineto trace) | where does the step's time go? | `ProfilerPanel` |
    | an **allocator snapshot** (CUDA caching allocator history) | where does the memory go, why did it OOM? | `MemoryPanel` |
    | **NVML** samples (the driver's counters) | is the GPU busy, hot, throttled right now? | `LiveGpuPanel` |

    On a machine with a CUDA GPU this notebook records each of them live. Everywhere else (a laptop,
    Binder, CI) it opens the **real recordings from an NVIDIA H200** that ship with the package in
    `workbench.samples`, so every number below is a measured one.
    """),
    code(SETUP),
    md("""
    ## The shipped recordings

    `workbench.samples` lists them; `samples.path(name)` finds the file. Provenance of each is in
    `workbench/samples/README.md`.
    """),
    code("""
    from workbench import samples
    print(samples.describe())
    """),
    md("""
    ## 1 · A profile: where does the time go?

    `workbench.io.load_trace` reads any Kineto trace (`.json` or `.json.gz`, ours or one copied off a
    cluster) into columns; the functions of `workbench.analysis` turn it into tables. The top GPU
    kernels of three training steps of a 6-layer transformer (fp32, AdamW) on the H200:
    """),
    code("""
    from workbench.io import load_trace
    from workbench.analysis import kernel_summary, gpu_busy, findings

    trace = load_trace(samples.path("h200_train_step"))
    kernels = kernel_summary(trace)
    top = kernels.head(8)
    top[["name", "count", "total_us", "mean_us", "percent"]].round(1)
    """),
    code("""
    # NBVAL_CHECK_OUTPUT
    busy = gpu_busy(trace)
    print(f"{trace.device}: {busy.kernel_count} kernels, GPU busy {busy.busy_us / 1e3:.1f} ms "
          f"of a {busy.window_us / 1e3:.1f} ms window (idle {busy.idle_fraction:.0%})")
    print("findings:", [f.id for f in findings(trace)])
    """),
]

if __name__ == "__main__":
    print(write("00_tour", cells))
