"""Measured ceilings of the GPU this runs on: what a plain matmul per dtype and a device copy reach.

The datasheet figures (:mod:`workbench.analysis.trace.peaks`) are boost-clock, best-case numbers; the rates
a real program can approach are a little lower (power and clock limits, cuBLAS tile efficiency). This
module measures them with CUDA events so a roofline can be drawn against both:

- ``matmul[dtype]``: square ``torch.mm`` at sizes :data:`MATMUL_SIZES` (best of them), ``2 N^3`` FLOPs
  per call, median over ``repeats`` calls after warm-up; dtypes bf16, fp16, tf32 (fp32 tensors with
  ``torch.set_float32_matmul_precision("high")``) and fp32 (``"highest"``: no TF32).
- ``copy``: device-to-device ``Tensor.copy_`` of ``copy_mib`` MiB, counted as read + write (2x the size),
  which is how HBM bandwidth is quoted (STREAM copy).
- ``h2d_pinned``: a pinned host-to-device copy (one direction), the PCIe/NVLink-C2C rate.

Takes about 5-15 s on an H200. Without CUDA, :func:`measure_ceilings` raises :class:`NoDevice`.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any

from workbench._optional import import_optional
from workbench.analysis.trace.peaks import peak_for
from workbench.errors import NoDevice

__all__ = ["measure_ceilings", "MATMUL_SIZES"]

MATMUL_SIZES = (4096, 8192)
_DTYPES = ("bf16", "fp16", "tf32", "fp32")


def _time_ms(torch, fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def measure_ceilings(device: str = "cuda", dtypes=_DTYPES, sizes=MATMUL_SIZES, copy_mib: int = 1024,
                     repeats: int = 10) -> dict[str, Any]:
    """Measure matmul TFLOP/s per dtype and copy GB/s on ``device``; returns a JSON-ready dict with the
    datasheet row beside the measurements (``datasheet``: the matched peaks or None)."""
    torch = import_optional("torch", "to measure the GPU's ceilings")
    if not torch.cuda.is_available():
        raise NoDevice("measuring ceilings needs a CUDA device (torch.cuda.is_available() is False); "
                       "run it on the GPU machine, or use the datasheet peaks (workbench.analysis.trace.peaks)")
    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    name = torch.cuda.get_device_name(dev)
    saved_precision = torch.get_float32_matmul_precision()
    out: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "sm_count": props.multi_processor_count,
        "total_memory_bytes": props.total_memory,
        "method": {"matmul": f"torch.mm square N in {list(sizes)}, 2N^3 FLOPs, median of {repeats} CUDA-event "
                             f"timed calls after 3 warm-up, best N",
                   "copy": f"device-to-device copy_ of {copy_mib} MiB, read+write bytes, median of {repeats}",
                   "h2d_pinned": "pinned host-to-device copy_ of 256 MiB, one direction"},
        "matmul": {},
    }
    try:
        for dtype in dtypes:
            tdtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
            torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
            best = None
            for n in sizes:
                a = torch.randn(n, n, device=dev, dtype=tdtype)
                b = torch.randn(n, n, device=dev, dtype=tdtype)
                c = torch.empty(n, n, device=dev, dtype=tdtype)
                reps = repeats if dtype != "fp32" else max(3, repeats // 2)
                ms = _time_ms(torch, lambda: torch.mm(a, b, out=c), reps)
                tflops = 2.0 * n ** 3 / (ms * 1e-3) / 1e12
                if best is None or tflops > best["tflops"]:
                    best = {"tflops": round(tflops, 1), "size": n, "ms": round(ms, 4)}
                del a, b, c
            out["matmul"][dtype] = best
    finally:
        torch.set_float32_matmul_precision(saved_precision)
    n_elems = copy_mib * 2 ** 20 // 4
    src = torch.empty(n_elems, device=dev, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    ms = _time_ms(torch, lambda: dst.copy_(src), repeats)
    out["copy"] = {"gbps": round(2 * src.nbytes / (ms * 1e-3) / 1e9, 1), "bytes": int(src.nbytes),
                   "ms": round(ms, 4)}
    del src, dst
    host = torch.empty(64 * 2 ** 20, dtype=torch.float32, pin_memory=True).fill_(1.0)
    dev_buf = torch.empty(host.shape, device=dev, dtype=torch.float32)
    ms = _time_ms(torch, lambda: dev_buf.copy_(host, non_blocking=True), max(3, repeats // 2))
    out["h2d_pinned"] = {"gbps": round(host.nbytes / (ms * 1e-3) / 1e9, 1), "bytes": int(host.nbytes),
                         "ms": round(ms, 4)}
    del host, dev_buf
    torch.cuda.empty_cache()
    sheet = peak_for(name, {"warpSize": props.warp_size if hasattr(props, "warp_size") else 32,
                            "numSms": props.multi_processor_count})
    out["datasheet"] = sheet.as_dict() if sheet else None
    if sheet:
        out["fraction_of_datasheet"] = {
            **{k: round(v["tflops"] / sheet.tflops[k], 3) for k, v in out["matmul"].items() if k in sheet.tflops},
            "copy": round(out["copy"]["gbps"] / sheet.gbps, 3),
        }
    return out
