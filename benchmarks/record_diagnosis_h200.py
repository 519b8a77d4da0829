"""Record on a GPU the before/after pairs that the diagnosis' what-if predictions are checked against.

Run on the H200 from the repository root (about 5 minutes)::

    python benchmarks/record_diagnosis_h200.py --out OUTDIR          # every case, one subprocess each
    python benchmarks/record_diagnosis_h200.py --out OUTDIR --case sync

Each case runs one step function in several variants (before and after a fix). Every variant is timed
WITHOUT the profiler with CUDA events (one event before each step, median of the per-step deltas after
warm-up steps), and the variants named in the case are also recorded as Kineto traces (CPU + CUDA) at
a detail level (light: no shapes/memory/stacks; standard: + record_shapes; full: + profile_memory +
with_stack). Everything lands in OUTDIR/<case>/: ``<variant>.<detail>.trace.json.gz`` and
``truth.json`` (the measured per-step times, the case parameters, GPU, driver, torch, date).

Cases:

- ``overhead_fp32`` / ``overhead_bf16``: transformer training steps (nn.TransformerEncoder + AdamW),
  unprofiled and profiled at light / standard / full detail: what the profiler's own host work costs.
- ``loader``: a DataLoader whose samples take 1 ms of CPU each (batch 16) feeding a small CNN:
  num_workers=0 vs 8 pinned workers.
- ``sync``: host work H ms, GPU work G ms per step, with and without ``loss.item()`` at the end, for
  (H, G) = (3, 1.2), (3, 0.3), (5.9, 6.5).
- ``launch``: 600 tiny kernels per step, eager vs the same work replayed as one CUDA graph.
- ``copies``: a 64 MiB batch copied to the GPU each step before ~3 ms of matmuls: pageable, pinned
  (non_blocking), already on the device.
- ``gpt``: a decoder-only transformer (causal scaled_dot_product_attention) whose FLOPs can be counted
  by hand: bf16 autocast (GPU-bound), fp32 without TF32, TF32; traces with shapes (standard detail).
- ``compiled_mlp``: a torch.compile'd bf16 MLP, no data loading at all.
- ``gpu_bound_bf16``: a bf16 MLP of large GEMMs whose step the GPU limits (a light trace on which no
  finding should fire).
- ``stamped``: the ``overhead_fp32`` step captured with ``workbench.capture.profiler.profile_steps`` at
  each detail level, so each trace carries the unprofiled step time the capture measured.
- ``heldout_cnn``: a convolutional net (fp32, eager) never used to set any constant: unprofiled vs light
  and standard traces, to check the profiler-cost estimate on a workload it was not derived from.
- ``fused_optimizer``: a deep MLP of small layers (240 parameters) stepped by AdamW with foreach=False,
  foreach=True and fused=True: the launch-bound optimizer loop and the fix people make.
- ``conv_precision``: a plain conv net in strict fp32, TF32, bf16 NCHW and bf16 channels_last (standard
  traces of strict fp32 and bf16 NCHW): the TF32 and bf16/channels_last what-ifs of convolutions.
- ``tour_fixes``: the ``overhead_fp32`` step (the tour's model) without the profiler in strict fp32, with TF32
  matmuls and with bf16 autocast, and light traces of each: which first fix pays on the tour's model.
- ``three_artifacts``: one run recorded three ways at once on the Unix clock: a Kineto trace, the
  allocator history (snapshot) and NVML + Hopper GPM counters at 10 Hz, over phases: training steps,
  bf16 GEMMs, a device-to-device copy, idle.

Local paths are stripped from every recording (the repository root becomes ``.``, site-packages and
temporary directories their bare names).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DETAILS = {
    "light": {"record_shapes": False, "profile_memory": False, "with_stack": False},
    "standard": {"record_shapes": True, "profile_memory": False, "with_stack": False},
    "full": {"record_shapes": True, "profile_memory": True, "with_stack": True},
}
CASES = ["tour_fixes", "overhead_fp32", "overhead_bf16", "loader", "sync", "launch", "copies", "gpt", "three_artifacts",
         "compiled_mlp", "gpu_bound_bf16", "stamped", "heldout_cnn", "fused_optimizer", "conv_precision"]


# ----------------------------------------------------------------------------------------------- helpers
def _path_patterns() -> list[tuple[re.Pattern, str]]:
    pats = []
    for p, rep in ((str(ROOT), "."), (tempfile.gettempdir(), "tmp"), (str(Path.home()), "~")):
        if p and p != "/":
            pats.append((re.compile(re.escape(p)), rep))
    # anything up to a site-packages / dist-packages folder, and python's own lib folder
    pats.append((re.compile(r"/[^\s\"']*?/(site-packages|dist-packages)/"), r"\1/"))
    pats.append((re.compile(r"/[^\s\"']*?/lib/python3\.\d+/"), "python3/"))
    return pats


_PATS = None


def strip_paths(text: str) -> str:
    global _PATS
    if _PATS is None:
        _PATS = _path_patterns()
    for pat, rep in _PATS[-2:] + _PATS[:-2]:
        text = pat.sub(rep, text)
    return text


def _strip_obj(obj):
    if isinstance(obj, str):
        return strip_paths(obj) if "/" in obj else obj
    if isinstance(obj, dict):
        return {k: _strip_obj(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strip_obj(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_strip_obj(v) for v in obj)
    return obj


def env_info() -> dict:
    import torch

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "python": sys.version.split()[0],
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info["power_limit_w"] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000
        info["sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception as exc:  # recorded, never fatal
        info["nvml_error"] = repr(exc)
    return info


def time_steps(step, n: int = 40, warm: int = 8) -> dict:
    """Per-step time without the profiler: a CUDA event before each step, median of the deltas."""
    import torch

    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    t0 = time.perf_counter()
    for i in range(n):
        evs[i].record()
        step()
    evs[n].record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / n * 1e3
    d = sorted(evs[i].elapsed_time(evs[i + 1]) for i in range(n))
    return {
        "median_ms": statistics.median(d),
        "mean_ms": sum(d) / n,
        "p10_ms": d[n // 10],
        "p90_ms": d[(9 * n) // 10],
        "wall_ms_per_step": wall,
        "steps": n,
    }


def trace_steps(step, detail: str, path: Path, active: int = 5, wait: int = 1, warmup: int = 2) -> dict:
    """Profile ``active`` steps (ProfilerStep#N marks) at a detail level; gzip, strip local paths."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    tmp = path.with_name(path.name + ".tmp.json")
    total = wait + warmup + active
    t_prof = []

    def ready(p):
        p.export_chrome_trace(str(tmp))

    step()
    torch.cuda.synchronize()
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=ready,
        **DETAILS[detail],
    ) as prof:
        for i in range(total):
            t = time.perf_counter()
            step()
            if i == total - 1:
                torch.cuda.synchronize()  # the last step's kernels end before the profiler stops
            t_prof.append((time.perf_counter() - t) * 1e3)
            prof.step()
    text = strip_paths(tmp.read_text())
    tmp.unlink()
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write(text)
    active_ms = t_prof[wait + warmup: -1] or t_prof[-1:]
    return {"file": path.name, "detail": detail, "active_steps": active,
            "host_ms_per_step_profiled_median": statistics.median(active_ms),
            "bytes": path.stat().st_size}


def busy_ms(ms: float) -> None:
    """Python work on the host that takes ``ms`` (stands for data preparation, logging, metrics)."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def write_truth(out: Path, case: str, truth: dict) -> None:
    truth = {"case": case, "env": env_info(), **truth}
    (out / "truth.json").write_text(json.dumps(_strip_obj(truth), indent=1, sort_keys=True) + "\n")
    print(json.dumps({"case": case, "variants": {k: v.get("median_ms") for k, v in truth.get("measured", {}).items()}}),
          flush=True)


# ------------------------------------------------------------------------------------------------- cases
def _transformer(d, layers, heads, batch, seq, dtype_autocast):
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), nn.Linear(d, d)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, d, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype_autocast):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def case_overhead(out: Path, bf16: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    if bf16:
        params = dict(d=768, layers=6, heads=12, batch=8, seq=128, dtype_autocast=True)
    else:
        params = dict(d=512, layers=6, heads=8, batch=16, seq=256, dtype_autocast=False)
    step = _transformer(**params)
    measured = {"unprofiled": time_steps(step)}
    traces = {}
    for detail in DETAILS:
        traces[detail] = trace_steps(step, detail, out / f"profiled.{detail}.trace.json.gz")
    measured["unprofiled_again"] = time_steps(step)
    write_truth(out, out.name, {"params": params, "measured": measured, "traces": traces,
                                "fix": "no profiler: the unprofiled step is the truth for every detail level"})


def case_tour_fixes(out: Path) -> None:
    """The tour's model (``overhead_fp32``'s parameters): the fixes its diagnosis could name, unprofiled."""
    import torch

    params = dict(d=512, layers=6, heads=8, batch=16, seq=256)
    measured, traces = {}, {}
    for variant, tf32, bf16 in (("fp32", False, False), ("tf32", True, False), ("bf16", False, True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        step = _transformer(**params, dtype_autocast=bf16)
        measured[variant] = time_steps(step)
        traces[variant] = trace_steps(step, "light", out / f"{variant}.light.trace.json.gz")
        measured[variant + "_again"] = time_steps(step)
        del step
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    write_truth(out, "tour_fixes", {"params": {**params, "optimizer": "AdamW", "cudnn_allow_tf32": True},
                                    "measured": measured, "traces": traces,
                                    "fix": "fp32 -> TF32 matmuls (allow_tf32) and fp32 -> bf16 autocast, no profiler"})


class _SlowDataset:
    """Samples that take ``ms`` of CPU each (a decode/augment stand-in), 3x64x64 images + a label."""

    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        busy_ms(self.ms)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 64, 64, generator=g), i % 10


def case_loader(out: Path) -> None:
    import torch
    from torch import nn

    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    params = {"batch": 16, "sample_cpu_ms": 1.0, "workers_after": 8}

    def make_step(workers, pin):
        ds = _SlowDataset(100000, params["sample_cpu_ms"])
        dl = torch.utils.data.DataLoader(ds, batch_size=params["batch"], shuffle=False, num_workers=workers,
                                         pin_memory=pin, persistent_workers=workers > 0,
                                         prefetch_factor=4 if workers else None)
        it = iter(dl)

        def step():
            x, y = next(it)
            x = x.cuda(non_blocking=pin)
            y = y.cuda(non_blocking=pin)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    measured, traces = {}, {}
    for name, workers, pin in (("workers0", 0, False), ("workers8_pinned", 8, True)):
        step = make_step(workers, pin)
        measured[name] = time_steps(step, n=30, warm=10)
        traces[name] = trace_steps(step, "light", out / f"{name}.light.trace.json.gz")
    # GPU work alone (the batch already on the device): what no input pipeline at all would cost
    x = torch.randn(params["batch"], 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (params["batch"],), device="cuda")

    def gpu_only():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    measured["on_device"] = time_steps(gpu_only)
    write_truth(out, "loader", {"params": params, "measured": measured, "traces": traces,
                                "pairs": [["workers0", "workers8_pinned", "more DataLoader workers (8, pinned)"]]})


def _calibrated_matmuls(target_ms):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(2048, 2048, device="cuda")
    w = torch.randn(2048, 2048, device="cuda") / 45.0
    for _ in range(3):
        a @ w
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        a @ w
    e.record()
    torch.cuda.synchronize()
    per = s.elapsed_time(e) / 20
    k = max(1, round(target_ms / per))
    return a, w, k, per


def case_sync(out: Path) -> None:
    import torch

    measured, traces, variants = {}, {}, []
    for host_ms, gpu_ms in ((3.0, 1.2), (3.0, 0.3), (5.9, 6.5)):
        a, w, k, per = _calibrated_matmuls(gpu_ms)
        tag = f"h{host_ms:g}_g{gpu_ms:g}"
        variants.append({"tag": tag, "host_ms": host_ms, "gpu_ms_target": gpu_ms, "matmuls": k,
                         "matmul_ms": per})
        for item in (True, False):

            def step(item=item):
                busy_ms(host_ms)
                x = a
                for _ in range(k):
                    x = torch.relu(x @ w)
                loss = x.mean()
                if item:
                    loss.item()

            name = f"{tag}_{'item' if item else 'noitem'}"
            measured[name] = time_steps(step)
            traces[name] = trace_steps(step, "light", out / f"{name}.light.trace.json.gz")
    pairs = [[f"{v['tag']}_item", f"{v['tag']}_noitem", "drop the loss.item() synchronisation"] for v in variants]
    write_truth(out, "sync", {"variants": variants, "measured": measured, "traces": traces, "pairs": pairs})


def case_launch(out: Path) -> None:
    import torch

    n_ops = 300
    x = torch.zeros(4096, device="cuda")

    def eager():
        for _ in range(n_ops):
            x.mul_(0.999)
            x.add_(0.001)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            eager()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        eager()

    def graphed():
        g.replay()

    measured = {"eager": time_steps(eager), "cuda_graph": time_steps(graphed)}
    traces = {"eager": trace_steps(eager, "light", out / "eager.light.trace.json.gz"),
              "cuda_graph": trace_steps(graphed, "light", out / "cuda_graph.light.trace.json.gz")}
    write_truth(out, "launch", {"params": {"kernels_per_step": 2 * n_ops, "elements": 4096},
                                "measured": measured, "traces": traces,
                                "pairs": [["eager", "cuda_graph", "capture the step in a CUDA graph"]]})


def case_copies(out: Path) -> None:
    import torch

    a, w, k, per = _calibrated_matmuls(3.0)
    n = 16 * 2**20  # floats: 64 MiB
    pageable = torch.randn(n)
    pinned = pageable.pin_memory()
    on_dev = pageable.cuda()

    def work(xb):
        x = a
        for _ in range(k):
            x = torch.relu(x @ w)
        return x.mean() + xb[:16].sum()

    def step_pageable():
        work(pageable.to("cuda"))

    def step_pinned():
        work(pinned.to("cuda", non_blocking=True))

    def step_on_device():
        work(on_dev)

    measured = {"pageable": time_steps(step_pageable), "pinned": time_steps(step_pinned),
                "on_device": time_steps(step_on_device)}
    traces = {"pageable": trace_steps(step_pageable, "light", out / "pageable.light.trace.json.gz"),
              "pinned": trace_steps(step_pinned, "light", out / "pinned.light.trace.json.gz")}
    write_truth(out, "copies", {"params": {"batch_bytes": 4 * n, "matmuls": k, "matmul_ms": per},
                                "measured": measured, "traces": traces,
                                "pairs": [["pageable", "pinned", "pin the host batch (non_blocking copy)"],
                                          ["pageable", "on_device", "keep the data on the GPU"],
                                          ["pinned", "on_device", "keep the data on the GPU"]]})


def _gpt(vocab, d, layers, heads, seq):
    """Decoder-only transformer (workbench/capture/models.py): causal SDPA, pre-norm blocks, learned
    positions, untied LM head without bias (FLOPs countable by hand)."""
    import torch

    from workbench.capture.models import LM

    torch.manual_seed(0)
    return LM(layers=layers, d=d, heads=heads, vocab=vocab, max_seq=seq, head_bias=False)


def _gpt_step(cfg, mode):
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    model = _gpt(cfg["vocab"], cfg["d"], cfg["layers"], cfg["heads"], cfg["seq"]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), device="cuda", generator=g)
    tgt = torch.roll(idx, -1, 1)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            logits = model(idx)
        loss = F.cross_entropy(logits.float().view(-1, cfg["vocab"]), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    n_params = sum(p.numel() for p in model.parameters())
    n_emb = model.emb.weight.numel() + model.pos.weight.numel()
    return step, n_params, n_emb, model


def hand_flops(cfg, n_params, n_emb) -> dict:
    """The usual count: 6 * (non-embedding parameters) * tokens for the GEMMs (forward 2, backward 4),
    plus attention scores and values: forward 4 * b * t^2 * d per layer, halved by the causal mask,
    times 3 for forward + backward. Embedding lookups carry no FLOPs."""
    tokens = cfg["batch"] * cfg["seq"]
    dense = 6 * (n_params - n_emb) * tokens
    attn_fwd_full = 4 * cfg["batch"] * cfg["seq"] ** 2 * cfg["d"] * cfg["layers"]
    attn = 3 * attn_fwd_full / 2
    return {"tokens": tokens, "dense_flops": dense, "attention_flops_causal": attn, "total_flops": dense + attn,
            "non_embedding_params": n_params - n_emb, "params": n_params}


def case_gpt(out: Path) -> None:
    import torch

    cfg = {"vocab": 32768, "d": 1024, "layers": 12, "heads": 16, "seq": 1024, "batch": 8}
    measured, traces, flops = {}, {}, None
    for mode in ("bf16", "fp32", "tf32"):
        step, n_params, n_emb, model = _gpt_step(cfg, mode)
        flops = hand_flops(cfg, n_params, n_emb)
        n = 20 if mode != "bf16" else 30
        measured[mode] = time_steps(step, n=n, warm=5)
        measured[mode]["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        measured[mode]["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        measured[mode]["achieved_tflops_hand"] = flops["total_flops"] / (measured[mode]["median_ms"] / 1e3) / 1e12
        traces[mode] = trace_steps(step, "standard", out / f"{mode}.standard.trace.json.gz", active=3, wait=1,
                                   warmup=1)
        del step, model
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    write_truth(out, "gpt", {"params": cfg, "hand_count": flops, "measured": measured, "traces": traces,
                             "pairs": [["fp32", "tf32", "allow TF32 for fp32 matmuls"],
                                       ["fp32", "bf16", "bf16 autocast"]]})


def case_compiled_mlp(out: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(2048, 2048), nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 2048, device="cuda")
    cmodel = torch.compile(model)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t
    measured = {"unprofiled": time_steps(step)}
    traces = {"light": trace_steps(step, "light", out / "compiled.light.trace.json.gz"),
              "standard": trace_steps(step, "standard", out / "compiled.standard.trace.json.gz")}
    write_truth(out, "compiled_mlp", {"params": {"layers": 4, "width": 2048, "batch": 256, "compile_s": compile_s},
                                      "measured": measured, "traces": traces})


GPM_METRICS = {
    "gpm_sm_util": "NVML_GPM_METRIC_SM_UTIL",
    "gpm_sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "gpm_any_tensor_util": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "gpm_hmma_tensor_util": "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
    "gpm_dram_bw_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "gpm_fp32_util": "NVML_GPM_METRIC_FP32_UTIL",
    "gpm_fp16_util": "NVML_GPM_METRIC_FP16_UTIL",
    "gpm_fp64_util": "NVML_GPM_METRIC_FP64_UTIL",
    "gpm_pcie_tx_per_sec": "NVML_GPM_METRIC_PCIE_TX_PER_SEC",
    "gpm_pcie_rx_per_sec": "NVML_GPM_METRIC_PCIE_RX_PER_SEC",
    "gpm_nvlink_total_rx_per_sec": "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC",
    "gpm_nvlink_total_tx_per_sec": "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC",
}


class _GpmRecorder(threading.Thread):
    """NVML + GPM rows every ``interval`` s with Unix time (time_ns); GPM metrics between consecutive
    samples. The phase label is read from ``self.phase``."""

    def __init__(self, interval=0.1):
        super().__init__(daemon=True)
        self.interval, self.rows, self.phase, self.error = interval, [], "start", None
        self._stop_ev = threading.Event()
        self.cost_us = []

    def stop(self):
        self._stop_ev.set()
        self.join(5)

    def run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            ids = {k: getattr(pynvml, v) for k, v in GPM_METRICS.items() if hasattr(pynvml, v)}
            supported = bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            prev = pynvml.nvmlGpmSampleAlloc() if supported else None
            cur = pynvml.nvmlGpmSampleAlloc() if supported else None
            if supported:
                pynvml.nvmlGpmSampleGet(h, prev)
            t0 = time.perf_counter()
            while not self._stop_ev.wait(self.interval):
                c0 = time.perf_counter()
                row = {"t": round(time.perf_counter() - t0, 4), "time_ns": time.time_ns(), "gpu": 0,
                       "phase": self.phase}
                u = pynvml.nvmlDeviceGetUtilizationRates(h)
                m = pynvml.nvmlDeviceGetMemoryInfo(h)
                row.update(util_gpu=u.gpu, util_mem=u.memory, mem_used=m.used, mem_total=m.total,
                           power_mw=pynvml.nvmlDeviceGetPowerUsage(h),
                           sm_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
                if supported:
                    pynvml.nvmlGpmSampleGet(h, cur)
                    mg = pynvml.c_nvmlGpmMetricsGet_t()
                    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
                    mg.numMetrics = len(ids)
                    mg.sample1, mg.sample2 = prev, cur
                    names = list(ids)
                    for i, k in enumerate(names):
                        mg.metrics[i].metricId = ids[k]
                    pynvml.nvmlGpmMetricsGet(mg)
                    for i, k in enumerate(names):
                        row[k] = round(mg.metrics[i].value, 3) if mg.metrics[i].nvmlReturn == 0 else None
                    prev, cur = cur, prev
                self.rows.append(row)
                self.cost_us.append((time.perf_counter() - c0) * 1e6)
        except Exception as exc:
            self.error = repr(exc)


def case_three_artifacts(out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cfg = {"vocab": 8192, "d": 768, "layers": 6, "heads": 12, "seq": 512, "batch": 8}
    step, n_params, n_emb, model = _gpt_step(cfg, "bf16")
    step()
    torch.cuda.synchronize()
    rec = _GpmRecorder(0.1)
    rec.start()
    time.sleep(0.6)
    torch.cuda.memory._record_memory_history(max_entries=200000)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(2**28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    tmp = out / "trace.tmp.json"
    marks = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for phase, fn, dur_s in (("train", None, None), ("gemm", lambda: a @ b, 1.2), ("copy", lambda: dst.copy_(src), 1.2),
                                 ("idle", None, 0.6)):
            rec.phase = phase
            t0 = time.time_ns()
            with record_function(f"phase:{phase}"):
                if phase == "train":
                    for i in range(8):
                        with record_function(f"train_step#{i}"):
                            step()
                        prof.step()
                    torch.cuda.synchronize()
                elif fn is None:
                    time.sleep(dur_s)
                else:
                    end = time.perf_counter() + dur_s
                    while time.perf_counter() < end:
                        for _ in range(20):
                            fn()
                        torch.cuda.synchronize()
            marks.append({"phase": phase, "start_ns": t0, "end_ns": time.time_ns()})
    prof.export_chrome_trace(str(tmp))
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    rec.phase = "end"
    time.sleep(0.3)
    rec.stop()
    text = strip_paths(tmp.read_text())
    tmp.unlink()
    with gzip.open(out / "three.trace.json.gz", "wt") as f:
        f.write(text)
    with gzip.open(out / "three.snapshot.pickle.gz", "wb") as f:
        pickle.dump(_strip_obj(snap), f, protocol=4)
    with gzip.open(out / "three.gpm.jsonl.gz", "wt") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    cost = sorted(rec.cost_us)
    write_truth(out, "three_artifacts", {
        "params": cfg, "marks": marks, "gpm_rows": len(rec.rows), "gpm_error": rec.error,
        "gpm_tick_cost_us_median": cost[len(cost) // 2] if cost else None,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "files": ["three.trace.json.gz", "three.snapshot.pickle.gz", "three.gpm.jsonl.gz"],
        "measured": {}})


def case_gpu_bound_bf16(out: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    width = 8192
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(width, width), nn.GELU())]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(8192, width, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    measured = {"unprofiled": time_steps(step, n=20, warm=4)}
    traces = {"light": trace_steps(step, "light", out / "mlp.light.trace.json.gz")}
    write_truth(out, "gpu_bound_bf16", {"params": {"width": width, "layers": 4, "batch": 8192},
                                        "measured": measured, "traces": traces})


def case_stamped(out: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT))
    from workbench.capture.profiler import profile_steps

    torch.backends.cuda.matmul.allow_tf32 = False
    params = dict(d=512, layers=6, heads=8, batch=16, seq=256, dtype_autocast=False)
    step = _transformer(**params)
    measured = {"unprofiled": time_steps(step)}
    traces = {}
    for detail in DETAILS:
        path = out / f"stamped.{detail}.trace.json.gz"
        res = profile_steps(step, steps=5, detail=detail, path=str(path), verbose=False, progress=False)
        raw = json.loads(gzip.open(path, "rt").read())
        text = strip_paths(json.dumps(raw))
        with gzip.open(path, "wt", compresslevel=6) as f:
            f.write(text)
        traces[detail] = {"file": path.name, "detail": detail, "active_steps": 5,
                          "profiled_step_ms": list(res.step_ms),
                          "stamped_unprofiled_step_ms": raw.get("workbench_unprofiled_step_ms"),
                          "bytes": path.stat().st_size}
    measured["unprofiled_again"] = time_steps(step)
    write_truth(out, "stamped", {"params": params, "measured": measured, "traces": traces})


def case_heldout_cnn(out: Path) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    blocks = []
    c = 3
    for w in (32, 64, 64, 128, 128, 256):
        blocks += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
        c = w
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (16,), device="cuda")

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    measured = {"unprofiled": time_steps(step)}
    traces = {d: trace_steps(step, d, out / f"cnn.{d}.trace.json.gz") for d in ("light", "standard")}
    measured["unprofiled_again"] = time_steps(step)
    write_truth(out, "heldout_cnn", {"params": {"widths": [32, 64, 64, 128, 128, 256], "batch": 16, "hw": 64},
                                     "measured": measured, "traces": traces})


def case_fused_optimizer(out: Path) -> None:
    """Many small parameters (a deep MLP of 128-wide layers) stepped by AdamW three ways: a Python loop
    over parameters (foreach=False: several tiny kernels per parameter), foreach (a few kernels per group
    of tensors) and fused (one kernel per group)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers, width, batch = 120, 128, 64
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())]).cuda()
    x = torch.randn(batch, width, device="cuda")
    n_params = sum(1 for _ in model.parameters())

    def make(kind):
        kw = {"foreach_false": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kind]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    steps = {k: make(k) for k in ("foreach_false", "foreach", "fused")}
    measured = {k: time_steps(f) for k, f in steps.items()}
    traces = {k: trace_steps(steps[k], "light", out / f"{k}.light.trace.json.gz") for k in ("foreach_false", "fused")}
    measured["foreach_false_again"] = time_steps(steps["foreach_false"])
    write_truth(out, "fused_optimizer", {
        "params": {"layers": layers, "width": width, "batch": batch, "parameters": n_params, "optimizer": "AdamW"},
        "measured": measured, "traces": traces,
        "pairs": [["foreach_false", "fused", "AdamW(fused=True)"], ["foreach_false", "foreach", "AdamW(foreach=True)"]]})


def _conv_net(channels_last: bool):
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks, c = [], 3
    for w, stride in ((64, 2), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        blocks += [nn.Conv2d(c, w, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
        c = w
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 100)).cuda()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def case_conv_precision(out: Path) -> None:
    """A plain convolutional net (8 conv/BN/ReLU blocks, batch 128 of 3x160x160, SGD, cudnn.benchmark off as
    by default) at four settings: strict fp32 (TF32 off for matmuls and convolutions), TF32 on for both,
    bf16 autocast with NCHW tensors, bf16 autocast with channels_last model and input."""
    import torch
    from torch import nn

    torch.backends.cudnn.benchmark = False
    batch, hw = 128, 160
    y = torch.randint(0, 100, (batch,), device="cuda")

    def make(kind):
        cl = kind == "bf16_channels_last"
        model = _conv_net(cl)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(batch, 3, hw, hw, device="cuda")
        if cl:
            x = x.contiguous(memory_format=torch.channels_last)
        tf32 = kind == "tf32"
        bf16 = kind.startswith("bf16")

        def step():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    kinds = ("fp32_strict", "tf32", "bf16_nchw", "bf16_channels_last")
    steps = {k: make(k) for k in kinds}
    measured = {k: time_steps(steps[k], n=30, warm=5) for k in kinds}
    traces = {k: trace_steps(steps[k], "standard", out / f"{k}.standard.trace.json.gz", active=3)
              for k in ("fp32_strict", "bf16_nchw")}
    measured["fp32_strict_again"] = time_steps(steps["fp32_strict"], n=30, warm=5)
    write_truth(out, "conv_precision", {
        "params": {"batch": batch, "hw": hw, "widths": [64, 64, 128, 128, 256, 256, 512, 512],
                   "cudnn_benchmark": False, "optimizer": "SGD(momentum=0.9)"},
        "measured": measured, "traces": traces,
        "pairs": [["fp32_strict", "tf32", "TF32 for matmuls and convolutions"],
                  ["fp32_strict", "bf16_nchw", "bf16 autocast (NCHW)"],
                  ["fp32_strict", "bf16_channels_last", "bf16 autocast + channels_last"],
                  ["bf16_nchw", "bf16_channels_last", "channels_last (already bf16)"]]})


def run_case(name: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    {
        "tour_fixes": lambda: case_tour_fixes(out),
        "overhead_fp32": lambda: case_overhead(out, bf16=False),
        "overhead_bf16": lambda: case_overhead(out, bf16=True),
        "loader": lambda: case_loader(out),
        "sync": lambda: case_sync(out),
        "launch": lambda: case_launch(out),
        "copies": lambda: case_copies(out),
        "gpt": lambda: case_gpt(out),
        "compiled_mlp": lambda: case_compiled_mlp(out),
        "three_artifacts": lambda: case_three_artifacts(out),
        "gpu_bound_bf16": lambda: case_gpu_bound_bf16(out),
        "stamped": lambda: case_stamped(out),
        "heldout_cnn": lambda: case_heldout_cnn(out),
        "fused_optimizer": lambda: case_fused_optimizer(out),
        "conv_precision": lambda: case_conv_precision(out),
    }[name]()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", action="append", choices=CASES, help="one case (repeatable); default: all")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per case subprocess")
    ap.add_argument("--budget", type=float, default=1e9, help="start no case once this many seconds have passed")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.case and len(args.case) == 1:
        run_case(args.case[0], out / args.case[0])
        return 0
    status = {}
    t_all = time.perf_counter()
    for name in args.case or CASES:
        t = time.perf_counter()
        if t - t_all > args.budget:
            status[name] = {"rc": "skipped (budget)", "seconds": 0}
            continue
        left = args.budget - (t - t_all) + 60
        try:
            p = subprocess.run([sys.executable, __file__, "--out", str(out), "--case", name], timeout=min(args.timeout, left))
            status[name] = {"rc": p.returncode}
        except subprocess.TimeoutExpired:
            status[name] = {"rc": "timeout"}
        status[name]["seconds"] = round(time.perf_counter() - t, 1)
        print(f"== {name}: {status[name]}", flush=True)
        (out / "status.json").write_text(json.dumps(status, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
