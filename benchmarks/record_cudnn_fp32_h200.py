"""Record what cuDNN's convolutions take as workspace on the H200, per call, in fp32 without TF32, fp32
with TF32 (torch's default for cuDNN) and bf16 (issue 21, memory v2: the fp32 workspace rule).

Run from the repository root (torch only; about 2 minutes, the parts run side by side)::

    python benchmarks/record_cudnn_fp32_h200.py --out DIR
    python benchmarks/record_cudnn_fp32_h200.py --out DIR --smoke      # CPU: code paths only, tiny shapes

``DIR/h200_cudnn_fp32.json`` holds:

- ``sweep``: one row per convolution shape (kernel 1..7, stride 1/2, 3..512 channels, 7..128 pixels,
  batch 1..64, transposed ones) and mode (``fp32`` = no TF32, ``tf32``, ``bf16``), with ``benchmark=False``
  as torch's default: for the forward, the backward-data and the backward-weight convolution each
  (``aten.convolution`` and ``aten.convolution_backward`` with one output at a time) the transient bytes
  above the op's output (``max_memory_allocated - memory_allocated`` after the call; the workspace torch's
  caching allocator handed cuDNN), for the first call (heuristics, plan build) and a second call (the
  cached plan), and the CUDA kernels the second call ran (profiler; they name cuDNN's algorithm: FFT,
  Winograd, implicit GEMM, ...). ``split`` says whether a shape is for fitting a rule (``fit``) or held out
  to test it (``test``): every third shape of the list, decided before the run.
- ``wscap``: the same calls for a subset of shapes in a process with ``CUDNN_CONV_WSCAP_DBG=64`` (cuDNN's
  own workspace cap, MiB): does the cap bound the workspace?
- ``log``: a few shapes in a process with cuDNN's API log on (``CUDNN_LOGLEVEL_DBG=3``, cuDNN 9; also the
  cuDNN 8 ``CUDNN_LOGINFO_DBG=1`` and the frontend's ``CUDNN_FRONTEND_LOG_INFO=1``), the logs parsed here
  and reduced to a summary (sizes, attribute counts, a capped sample of engine / workspace lines).

``DIR/families.json``: ``benchmarks/record_memory_h200.py``'s families part rerun in a process of its own
(the estimator's six families, fp32 and bf16, ``measure_step_memory`` peaks and per-op cuDNN rows).
``DIR/trace_<family>_<batch>_<precision>.json.gz``: the caching allocator's event trace (alloc, free,
segment; address and size, no stacks) of ``measure_step_memory`` for a few families (process of its own).
``DIR/lstm_sweep.json``: nn.LSTM (batch first) forward and backward per shape (``LSTM_SWEEP``; every third
held out) in fp32, bf16 and fp32 under bf16 autocast, in a process of its own (70 s): the allocator's
counters around each (retained and transient bytes) and the reserve space and weight buffer autograd saved.

``--parts`` runs a subset (``sweep,families,wscap,lstm,snapshots,log``; default all), e.g. the rerun of the
LSTM sweep and allocator traces alone: ``--parts lstm,snapshots``. A child past its budget dumps its stacks
into its log (faulthandler) and exits; the log's tail lands in the JSON.

Every part catches its own exception into the JSON; the whole stays inside ``--budget`` seconds (120).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

MiB = 1 << 20
MODES = {"fp32": (torch.float32, False), "tf32": (torch.float32, True), "bf16": (torch.bfloat16, False)}
DIRECTIONS = ("forward", "backward_data", "backward_weight")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    s = str(exc).strip()
    return s.splitlines()[0][:300] if s else type(exc).__name__


def _strip(s: str) -> str:
    s = s.replace(str(ROOT), ".")
    return re.sub(r"(?:/[\w.+-]+){2,}", "<path>", s)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


# --- shapes ---------------------------------------------------------------------------------------------
# (batch, c_in, c_out, hw, kernel, stride, transposed). Order matters: the list is cut by the time budget,
# so the structured scans come first, the random grid after; every third entry (index % 3 == 2) is held
# out (decided here, before any run).
def shape_list(smoke: bool = False) -> list[tuple]:
    if smoke:
        return [(2, 3, 8, 8, 3, 1, False), (2, 8, 8, 8, 1, 2, False), (2, 8, 16, 8, 3, 1, False),
                (2, 16, 8, 4, 2, 2, True), (1, 8, 8, 7, 5, 1, False), (2, 8, 8, 8, 7, 2, False)]
    shapes: list[tuple] = []

    def add(s):
        if s not in shapes:
            shapes.append(s)

    # the families' 3x3 shapes (cnn: 64..512 at 64..8 px; unet 32..512 at 128..8 px) at several batches
    for n in (1, 2, 4, 8, 16, 24, 32, 48, 64, 128):
        add((n, 128, 128, 32, 3, 1, False))
    for n in (8, 16, 32, 64, 128):
        add((n, 256, 256, 16, 3, 1, False))
        add((n, 512, 512, 8, 3, 1, False))
        add((n, 64, 64, 64, 3, 1, False))
    for c in (3, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512):  # channel scan at 32 px, batch 32
        add((32, c, c, 32, 3, 1, False))
    for hw in (7, 8, 14, 16, 28, 32, 56, 64, 112, 128):  # spatial scan, 64 channels, batch 16
        add((16, 64, 64, hw, 3, 1, False))
    for (ci, co) in ((256, 128), (64, 128), (128, 64), (512, 256), (32, 64), (128, 256)):
        add((32, ci, co, 32, 3, 1, False))
        add((8, ci, co, 32, 3, 1, False))
    for k in (1, 5, 7):  # other kernels at a 3x3 shape that took FFT in the families
        for n in (8, 32):
            add((n, 128, 128, 32, k, 1, False))
            add((n, 256, 256, 16, k, 1, False))
    for s in [(32, 64, 128, 64, 3, 2, False), (32, 128, 256, 32, 3, 2, False), (32, 256, 512, 16, 3, 2, False),
              (128, 128, 256, 32, 3, 2, False), (32, 64, 128, 64, 1, 2, False), (128, 256, 512, 16, 1, 2, False),
              (32, 3, 64, 64, 3, 1, False), (8, 32, 2, 128, 1, 1, False), (32, 3, 64, 224, 7, 2, False)]:
        add(s)
    for s in [(8, 512, 256, 8, 2, 2, True), (8, 64, 32, 64, 2, 2, True), (32, 512, 256, 8, 2, 2, True),
              (32, 64, 32, 64, 2, 2, True), (32, 256, 128, 16, 2, 2, True), (16, 128, 64, 32, 4, 2, True),
              (16, 128, 128, 16, 3, 1, True), (8, 256, 128, 16, 3, 2, True)]:
        add(s)
    rng = random.Random(21)
    chans = (3, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    for _ in range(400):
        if len(shapes) >= 220:
            break
        k = rng.choice((1, 3, 3, 3, 5, 7))
        s = rng.choice((1, 1, 2))
        n = rng.choice((1, 2, 4, 8, 16, 32, 64))
        hw = rng.choice((7, 8, 14, 16, 28, 32, 56, 64, 96, 128))
        ci, co = rng.choice(chans), rng.choice(chans)
        if ci == 3 and co == 3:
            continue
        if n * max(ci, co) * hw * hw * 4 > 512 * MiB or n * ci * co * hw * hw * k * k / (s * s) > 4e12:
            continue
        add((n, ci, co, hw, k, s, False))
    return shapes


def _split(i: int) -> str:
    return "test" if i % 3 == 2 else "fit"


# --- one convolution, three directions -------------------------------------------------------------------
def _measure(fn, device: str):
    """(output, transient bytes above the output, wall ms) of one call."""
    if device != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return out, 0, (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return out, int(torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated()), ms


def conv_calls(shape, mode: str, device: str, label_prefix: str = "", profile_warm: bool = True) -> dict:
    n, ci, co, hw, k, s, tr = shape
    dtype, tf32 = MODES[mode]
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    aten = torch.ops.aten
    pad = [0, 0] if tr else [k // 2, k // 2]
    stride, dil, opad = [s, s], [1, 1], [0, 0]
    x = torch.randn(n, ci, hw, hw, device=device, dtype=dtype)
    w = torch.randn(*((ci, co) if tr else (co, ci)), k, k, device=device, dtype=dtype)
    row = {"shape": list(shape), "mode": mode, "x": list(x.shape), "w": list(w.shape)}

    def fwd():
        return aten.convolution(x, w, None, stride, pad, dil, tr, opad, 1)

    calls = {"forward": fwd}
    y = fwd()
    row["y"] = list(y.shape)
    gy = torch.randn_like(y)
    del y
    calls["backward_data"] = lambda: aten.convolution_backward(gy, x, w, None, stride, pad, dil, tr, opad, 1,
                                                               [True, False, False])
    calls["backward_weight"] = lambda: aten.convolution_backward(gy, x, w, None, stride, pad, dil, tr, opad, 1,
                                                                 [False, True, False])
    # the forward's first call (heuristics, plan build) ran in conv_calls_cold_forward: only its warm call here
    for d, fn in calls.items():
        if d == "forward":
            out, cold, cold_ms = None, None, None
        else:
            out, cold, cold_ms = _measure(fn, device)
            del out
        if profile_warm and device == "cuda":
            with torch.autograd.profiler.record_function(f"{label_prefix}|{d}"):
                out, warm, warm_ms = _measure(fn, device)
        else:
            out, warm, warm_ms = _measure(fn, device)
        del out
        row[d] = {"cold_bytes": cold, "warm_bytes": warm, "cold_ms": None if cold_ms is None else round(cold_ms, 3),
                  "warm_ms": round(warm_ms, 3)}
    return row


def conv_calls_cold_forward(shape, mode: str, device: str) -> tuple[int, float]:
    """The forward's first call (heuristics + plan build) measured: run it on fresh tensors of the shape
    before :func:`conv_calls` (the plan cache is keyed on shapes, dtypes, alignment, TF32, not tensors)."""
    n, ci, co, hw, k, s, tr = shape
    dtype, tf32 = MODES[mode]
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    pad = [0, 0] if tr else [k // 2, k // 2]
    x = torch.randn(n, ci, hw, hw, device=device, dtype=dtype)
    w = torch.randn(*((ci, co) if tr else (co, ci)), k, k, device=device, dtype=dtype)
    out, cold, ms = _measure(lambda: torch.ops.aten.convolution(x, w, None, [s, s], pad, [1, 1], tr, [0, 0], 1),
                             device)
    del out
    return cold, ms


def _kernels_by_label(prof) -> dict:
    """label -> CUDA kernel names launched inside that record_function range (the profiler attaches a
    kernel to the op that launched it; walk the range's children)."""
    out = {}
    for evt in prof.events():
        if "|" not in evt.name or evt.name.startswith("aten::"):
            continue
        names, stack = [], [evt]
        while stack:
            e = stack.pop()
            names += [kr.name for kr in getattr(e, "kernels", ()) if kr.name != e.name]
            stack.extend(getattr(e, "cpu_children", ()))
        out[evt.name] = sorted(set(n[:200] for n in names))
    return out


def sweep(shapes, modes, device: str, t_end: float, out_path: Path | None = None, profile: bool = True,
          tag: str = "sweep") -> dict:
    rows, skipped = [], 0
    prof = None
    if profile and device == "cuda":
        try:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        except Exception as exc:
            log(f"  profiler unavailable: {_first_line(exc)}")
            prof = None
    last_write = time.perf_counter()
    try:
        for i, shape in enumerate(shapes):
            for mode in modes:
                if time.perf_counter() > t_end:
                    skipped += 1
                    continue
                label = f"{tag}|{i}|{mode}"
                row = {"index": i, "split": _split(i)}
                try:
                    cold, cold_ms = conv_calls_cold_forward(shape, mode, device)
                    row.update(conv_calls(shape, mode, device, label_prefix=label, profile_warm=prof is not None))
                    row["forward"]["cold_bytes"] = cold
                    row["forward"]["cold_ms"] = round(cold_ms, 3)
                except Exception as exc:
                    row.update({"shape": list(shape), "mode": mode, "error": f"{type(exc).__name__}: {_first_line(exc)}"})
                    if device == "cuda":
                        torch.cuda.empty_cache()
                rows.append(row)
            if out_path is not None and time.perf_counter() - last_write > 5:
                write_json(out_path, {"rows": rows, "complete": False})
                last_write = time.perf_counter()
            if i % 20 == 0:
                log(f"  {tag}: shape {i}/{len(shapes)}, {len(rows)} rows")
            if device == "cuda" and i % 10 == 0:
                gc.collect()
                torch.cuda.empty_cache()
    finally:
        kernels = {}
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
                kernels = _kernels_by_label(prof)
            except Exception as exc:
                log(f"  profiler parse failed: {_first_line(exc)}")
    for row in rows:
        for d in DIRECTIONS:
            if d in row:
                row[d]["kernels"] = kernels.get(f"{tag}|{row['index']}|{row['mode']}|{d}")
    return {"rows": rows, "skipped_shape_modes": skipped, "complete": skipped == 0}


# --- the cuDNN log, reduced ------------------------------------------------------------------------------
_LOG_PATTERNS = {  # what to keep of a log: each match with the lines after it (cuDNN logs one value a line)
    "workspace": re.compile(r"WORKSPACE", re.IGNORECASE),
    "engine_index": re.compile(r"GLOBAL_INDEX|ENGINE_ID|engine_id", re.IGNORECASE),
    "knob": re.compile(r"KNOB", re.IGNORECASE),
    "execute": re.compile(r"cudnnBackendExecute"),
    "tag": re.compile(r"\beng\d+|tag", re.IGNORECASE),
    "heuristic": re.compile(r"HEUR", re.IGNORECASE),
    "error": re.compile(r"\bE!|error|fail", re.IGNORECASE),
}


def summarize_log(path: Path, head: int = 120, groups: int = 30, after: int = 6, max_bytes: int = 80 * MiB) -> dict:
    """A cuDNN / frontend log reduced to a few hundred lines: its size, the first ``head`` lines, counts
    of the attribute names and API calls, and per pattern the first ``groups`` matches with the ``after``
    lines that follow each (where the values are)."""
    if not path.exists():
        return {"exists": False}
    size = path.stat().st_size
    lines = read = 0
    first = []
    attrs, calls = Counter(), Counter()
    kept = {k: [] for k in _LOG_PATTERNS}
    counts = Counter()
    open_groups: list[tuple[list, int]] = []
    with open(path, errors="replace") as f:
        for line in f:
            read += len(line)
            if read > max_bytes:
                break
            lines += 1
            line = _strip(line.rstrip("\n")[:300])
            if len(first) < head:
                first.append(line)
            still = []
            for grp, left in open_groups:
                grp.append(line)
                if left > 1:
                    still.append((grp, left - 1))
            open_groups = still
            for a in re.findall(r"CUDNN_ATTR_[A-Z_]+", line):
                attrs[a] += 1
            m = re.search(r"\b(cudnn[A-Z]\w+)\(", line)
            if m:
                calls[m.group(1)] += 1
            for k, rx in _LOG_PATTERNS.items():
                if rx.search(line):
                    counts[k] += 1
                    if len(kept[k]) < groups:
                        grp = [line]
                        kept[k].append(grp)
                        open_groups.append((grp, after))
    return {"exists": True, "bytes": size, "lines_read": lines, "truncated": size > max_bytes, "head": first,
            "matches": kept, "match_counts": dict(counts), "attribute_counts": dict(attrs.most_common(60)),
            "api_call_counts": dict(calls.most_common(40))}


# --- the LSTM sweep (its own process) -----------------------------------------------------------------------
# (batch, seq, input, hidden, layers): the family's LSTM (T=256, 512 -> 1024, 2 layers) at six batches, then
# other sizes; every third entry (index % 3 == 2) is held out, as for the convolutions (decided here).
LSTM_SWEEP = [(8, 256, 512, 1024, 2), (16, 256, 512, 1024, 2), (24, 256, 512, 1024, 2), (32, 256, 512, 1024, 2),
              (48, 256, 512, 1024, 2), (64, 256, 512, 1024, 2), (16, 256, 512, 1024, 1), (16, 128, 256, 512, 1),
              (32, 64, 128, 256, 2), (8, 512, 1024, 1024, 1), (64, 128, 512, 512, 3), (16, 256, 1024, 2048, 1),
              (4, 32, 64, 128, 1), (128, 64, 256, 256, 2), (16, 1024, 256, 512, 1)]
LSTM_SMOKE = [(2, 8, 4, 8, 2), (3, 5, 4, 6, 1), (2, 4, 3, 5, 1)]
LSTM_MODES = ("fp32", "bf16", "autocast")  # autocast: fp32 model under bf16 autocast, as the family's bf16 rows


def _cudnn_rnn_saved(out_tensor) -> dict:
    """Bytes of the reserve space (result3) and weight buffer (result4) that autograd saved for
    _cudnn_rnn's backward, found on h_n's grad_fn (CudnnRnnBackward0); {} where not found (CPU)."""
    fn = getattr(out_tensor, "grad_fn", None)
    seen = 0
    while fn is not None and seen < 8 and "CudnnRnn" not in type(fn).__name__:
        nxt = [f for f, _ in getattr(fn, "next_functions", ()) if f is not None]
        fn, seen = (nxt[0] if nxt else None), seen + 1
    out = {}
    if fn is not None and "CudnnRnn" in type(fn).__name__:
        for key, attr in (("reserve_bytes", "_saved_result3"), ("weight_buf_bytes", "_saved_result4")):
            try:
                t = getattr(fn, attr)
                out[key] = int(t.untyped_storage().nbytes()) if isinstance(t, torch.Tensor) else None
            except Exception as exc:
                out[key + "_error"] = _first_line(exc)
    return out


def lstm_calls(shape, mode: str, device: str) -> dict:
    """One LSTM (batch_first, as the family) forward and backward measured with the allocator's own
    counters, no dispatch mode: the forward's retained bytes (outputs, reserve space, weight copies) and
    transient peak above them (workspace, input copy), the backward's peak above what it started with,
    and the saved reserve space / weight buffer sizes. A first unmeasured step warms cuDNN up."""
    n, t, i, h, layers = shape
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    rnn = torch.nn.LSTM(i, h, num_layers=layers, batch_first=True, device=device, dtype=dtype)
    x = torch.randn(n, t, i, device=device, dtype=dtype, requires_grad=True)
    cuda = device == "cuda"
    stat = (lambda: (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved(),
                     torch.cuda.max_memory_reserved())) if cuda else (lambda: (0, 0, 0, 0))
    row = {"shape": list(shape), "mode": mode,
           "weight_bytes": sum(p.untyped_storage().nbytes() for p in {p.untyped_storage().data_ptr(): p
                                                                      for p in rnn.parameters()}.values()),
           "weight_storages": len({p.untyped_storage().data_ptr() for p in rnn.parameters()}),
           "parameter_count": sum(p.numel() for p in rnn.parameters())}
    for it in range(2):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        a0, _, r0, _ = stat()
        with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            y, (hn, cn) = rnn(x)
        if cuda:
            torch.cuda.synchronize()
        a1, p1, r1, pr1 = stat()
        g = torch.ones_like(y)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        a2, _, _, _ = stat()
        saved = _cudnn_rnn_saved(hn)
        y.backward(g)
        if cuda:
            torch.cuda.synchronize()
        a3, p3, r3, pr3 = stat()
        if it == 1:
            row.update({
                "y": list(y.shape), "y_dtype": str(y.dtype).replace("torch.", ""),
                "output_bytes": y.untyped_storage().nbytes() + hn.untyped_storage().nbytes() + cn.untyped_storage().nbytes(),
                "forward": {"allocated_before": a0, "retained_bytes": a1 - a0, "transient_bytes": p1 - a1,
                            "reserved_before": r0, "max_reserved": pr1},
                "backward": {"allocated_before": a2, "peak_above_before": p3 - a2, "allocated_after": a3,
                             "grad_bytes": sum(p.grad.untyped_storage().nbytes() for p in {
                                 p.grad.untyped_storage().data_ptr(): p for p in rnn.parameters()
                                 if p.grad is not None}.values()) if any(p.grad is not None for p in rnn.parameters()) else 0,
                             "grad_storages": len({p.grad.untyped_storage().data_ptr() for p in rnn.parameters()
                                                   if p.grad is not None}),
                             "x_grad_bytes": x.grad.untyped_storage().nbytes() if x.grad is not None else 0,
                             "max_reserved": pr3},
                **saved})
        del y, hn, cn, g
        rnn.zero_grad(set_to_none=True)
        x.grad = None
    del rnn, x
    return row


def lstm_sweep(shapes, device: str, t_end: float, out_path: Path | None = None) -> dict:
    rows, skipped = [], 0
    for idx, shape in enumerate(shapes):
        for mode in LSTM_MODES:
            if time.perf_counter() > t_end:
                skipped += 1
                continue
            row = {"index": idx, "split": _split(idx)}
            t0 = time.perf_counter()
            try:
                row.update(lstm_calls(shape, mode, device))
            except Exception as exc:
                row.update({"shape": list(shape), "mode": mode, "error": f"{type(exc).__name__}: {_first_line(exc)}"})
            row["s"] = round(time.perf_counter() - t0, 3)
            rows.append(row)
            if device == "cuda":
                gc.collect()
                torch.cuda.empty_cache()
            if out_path is not None:
                write_json(out_path, {"rows": rows, "complete": False})
            log(f"  lstm {idx} {shape} {mode}: {row['s']} s" + (f" ({row['error']})" if "error" in row else ""))
    return {"rows": rows, "skipped_shape_modes": skipped, "complete": skipped == 0}


# --- children ----------------------------------------------------------------------------------------------
WSCAP_MIB = 64
SNAPSHOT_CASES = [("lstm", 64, "bf16"), ("cnn", 32, "bf16"), ("cnn", 128, "bf16"), ("lstm", 16, "fp32"),
                  ("unet", 32, "bf16"), ("cnn", 32, "fp32"), ("lstm", 16, "bf16"), ("lstm", 64, "fp32")]
PARTS = ("sweep", "families", "wscap", "lstm", "snapshots", "log")
LOG_SHAPES = [(32, 128, 128, 32, 3, 1, False), (8, 128, 128, 32, 3, 1, False), (128, 512, 512, 8, 3, 1, False),
              (32, 64, 64, 64, 3, 1, False)]


def child_main(kind: str, out: Path, budget_s: float, smoke: bool, hard_s: float | None = None) -> int:
    t_end = time.perf_counter() + budget_s
    import faulthandler
    # a child still running just before the parent would kill it prints every thread's stack to its log
    # (the parent keeps the log's tail) and exits: a stall says where it is
    faulthandler.dump_traceback_later(max(budget_s + 1, hard_s or 0), exit=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rec = {"kind": kind, "env": {k: os.environ.get(k) for k in ("CUDNN_CONV_WSCAP_DBG", "CUDNN_LOGLEVEL_DBG",
                                                                "CUDNN_LOGINFO_DBG", "CUDNN_FRONTEND_LOG_INFO")}}
    try:
        if kind == "families":
            if device != "cuda":
                rec["skipped"] = "no CUDA device"
            else:
                import record_memory_h200 as rm
                # one family at a time, written after each (a child killed at the budget keeps its rows)
                all_batches, rows = dict(rm.FAMILY_BATCHES), []
                for fam, batches in all_batches.items():
                    left = t_end - time.perf_counter()
                    if left <= 0:
                        rows += [{"family": fam, "batch_size": bs, "precision": p, "skipped": "time budget"}
                                 for bs in batches for p in ("fp32", "bf16")]
                        continue
                    rm.FAMILY_BATCHES = {fam: batches}
                    rows += rm.families(budget_s=left)["rows"]
                    write_json(out / "families.json", {"rows": rows})
                # then TF32 (torch's default for cuDNN convolutions) for the two convolution families
                for fam in ("cnn", "unet"):
                    left = t_end - time.perf_counter()
                    if left <= 0:
                        break
                    rm.FAMILY_BATCHES = {fam: all_batches[fam]}
                    rows += rm.families(budget_s=left, precisions=("tf32",))["rows"]
                    write_json(out / "families.json", {"rows": rows})
                rm.FAMILY_BATCHES = all_batches
                write_json(out / "families.json", {"rows": rows})
                rec["rows"] = len(rows)
        elif kind == "lstm":
            # the LSTM sweep: reserve space, workspace and weight copies per shape, fp32 / bf16 / autocast,
            # measured with the allocator's counters (no dispatch mode), written after every call. (The first
            # H200 run's LSTM child, record_memory_h200.cudnn_sweep under a dispatch mode, wrote nothing in
            # 117 s and was killed; a stall now dumps its stacks into the log: faulthandler below.)
            path = out / "lstm_sweep.json"
            res = lstm_sweep(LSTM_SMOKE if smoke else LSTM_SWEEP, device, t_end - 2, out_path=path)
            write_json(path, res)
            rec["lstm_rows"] = len(res["rows"])
            rec["complete"] = res["complete"]
        elif kind == "snapshots":
            # the allocator's own event trace (alloc / free / segment, addresses and sizes; no stacks) of
            # measure_step_memory for the rows whose reserved peak the allocator model missed: the estimate's
            # replay can be compared with the real sequence event by event
            if device != "cuda":
                rec["skipped"] = "no CUDA device"
            else:
                from estimate_families import FAMILIES, adamw
                from workbench.capture.estimate import measure_step_memory, warm_up_cublas

                warm_up_cublas()
                rec["cases"] = []
                for fam, bs, prec in SNAPSHOT_CASES:
                    if time.perf_counter() > t_end:
                        rec["cases"].append({"family": fam, "batch_size": bs, "precision": prec, "skipped": "time"})
                        continue
                    case = {"family": fam, "batch_size": bs, "precision": prec}
                    try:
                        build, batch_fn, loss_fn = FAMILIES[fam]
                        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                                  max_entries=400000)
                        case.update(measure_step_memory(build, batch_fn, adamw, precision=prec, strict_fp32=prec == "fp32", batch_size=bs,
                                                        loss_fn=loss_fn))
                        snap = torch.cuda.memory._snapshot()
                        torch.cuda.memory._record_memory_history(enabled=None)
                        trace = [[e.get("action"), int(e.get("addr", 0)), int(e.get("size", 0))]
                                 for t in snap.get("device_traces", [])[:1] for e in t]
                        segs = [[int(sg["address"]), int(sg["total_size"]), sg.get("segment_type")]
                                for sg in snap.get("segments", [])]
                        name = f"trace_{fam}_{bs}_{prec}.json.gz"
                        with gzip.open(out / name, "wt", compresslevel=9) as f:
                            json.dump({"trace": trace, "segments": segs, "case": case}, f)
                        case.update(file=name, events=len(trace))
                    except Exception as exc:
                        torch.cuda.memory._record_memory_history(enabled=None)
                        case["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
                    rec["cases"].append(case)
                    gc.collect()
                    torch.cuda.empty_cache()
        elif kind == "wscap":
            shapes = shape_list(smoke)
            subset = [s for s in shapes if s[4] in (3, 5) and s[5] == 1 and not s[6] and s[1] >= 64][:40] or shapes[:3]
            rec.update(sweep(subset, ("fp32", "tf32"), device, t_end, profile=True, tag="wscap"))
        elif kind == "log":
            shapes = shape_list(smoke)[:2] if smoke else LOG_SHAPES
            rec.update(sweep(shapes, ("fp32", "tf32"), device, t_end, profile=False, tag="log"))
            if device == "cuda":
                torch.cuda.synchronize()
    except Exception:
        rec["error"] = _strip(traceback.format_exc()[-3000:])
    write_json(out / f"child_{kind}.json", rec)
    faulthandler.cancel_dump_traceback_later()
    return 0


def start_child(kind: str, out: Path, budget_s: float, smoke: bool, extra_env: dict, logdir: Path,
                hard_s: float | None = None):
    """The child's output goes to a file (a pipe nobody reads could fill and block it)."""
    env = dict(os.environ, **extra_env)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--child", kind,
           "--budget", f"{budget_s:.0f}"] + (["--smoke"] if smoke else []) + (
               ["--hard", f"{hard_s:.0f}"] if hard_s else [])
    fh = open(logdir / f"{kind}.out", "w")
    return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT), fh


def finish_child(child, kind: str, out: Path, deadline: float, logdir: Path) -> dict:
    p, fh = child
    try:
        p.wait(timeout=max(1.0, deadline - time.perf_counter()))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, by its handle
        p.wait()
        rc = "killed at the budget"
    fh.close()
    tail = (logdir / f"{kind}.out").read_text(errors="replace")
    f = out / f"child_{kind}.json"
    rec = json.loads(f.read_text()) if f.exists() else {}
    if f.exists():
        f.unlink()
    rec["returncode"] = rc
    if rc != 0:
        rec["tail"] = _strip((tail or "")[-2000:])
    log(f"  child {kind}: rc={rc}")
    return rec


def env_info() -> dict:
    b = torch.backends
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "cudnn_version": b.cudnn.version() if b.cudnn.is_available() else None,
            "cudnn_benchmark": b.cudnn.benchmark, "cudnn_deterministic": b.cudnn.deterministic,
            "cudnn_allow_tf32_default": b.cudnn.allow_tf32,
            "TORCH_CUDNN_V8_API_DISABLED": os.environ.get("TORCH_CUDNN_V8_API_DISABLED")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), total_memory=p.total_memory,
                    capability=f"{p.major}.{p.minor}")
        try:
            import pynvml
            pynvml.nvmlInit()
            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception as exc:
            info["driver"] = f"unknown ({type(exc).__name__})"
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds for everything (default 120)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on a CPU (code paths only)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma-separated subset of " + ",".join(PARTS) + " (default: all)")
    ap.add_argument("--child", choices=PARTS[1:], help=argparse.SUPPRESS)
    ap.add_argument("--hard", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child_main(args.child, out, args.budget, args.smoke, args.hard)
    t0 = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        log("record_cudnn_fp32_h200: no CUDA device (use --smoke on a CPU)")
        return 2
    budget = args.budget if not args.smoke else min(args.budget, 60.0)
    parts = [x for x in args.parts.split(",") if x]
    bad = sorted(set(parts) - set(PARTS))
    if bad:
        log(f"record_cudnn_fp32_h200: unknown parts {bad}")
        return 2
    rec = {"env": env_info(), "parts": {}, "wscap_mib": WSCAP_MIB, "budget_s": budget, "parts_run": parts,
           "held_out_rule": "shape index % 3 == 2 is 'test' (decided in shape_list order before the run)"}
    logdir = Path(tempfile.mkdtemp(prefix="cudnnlog"))
    # children first (fresh processes: the families' truth, the capped workspace, the log), side by side
    # with the sweep in this process: allocator statistics and cuDNN's plan caches are per process
    children = {}
    starts = {"families": (budget - 30, {}),
              "wscap": (budget - 40, {"CUDNN_CONV_WSCAP_DBG": str(WSCAP_MIB)}),
              "lstm": (70, {}),
              "snapshots": (80, {}),
              "log": (30, {"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGINFO_DBG": "1",
                           "CUDNN_LOGDEST_DBG": str(logdir / "cudnn.log"),
                           "CUDNN_FRONTEND_LOG_INFO": "1", "CUDNN_FRONTEND_LOG_FILE": str(logdir / "frontend.log")})}
    for kind, (b, env) in starts.items():
        if kind not in parts:
            continue
        try:
            children[kind] = start_child(kind, out, b, args.smoke, env, logdir,
                                         hard_s=t0 + budget - 6 - time.perf_counter())
        except Exception as exc:
            rec["parts"][kind] = {"error": f"{type(exc).__name__}: {_first_line(exc)}"}
    log(f"children started: {sorted(children)}")
    shapes = shape_list(args.smoke)
    rec["shapes"] = [list(s) for s in shapes]
    t_sweep_end = t0 + budget - 22
    try:
        if "sweep" in parts:
            rec["sweep"] = sweep(shapes, tuple(MODES), device, t_sweep_end,
                                 out_path=out / "h200_cudnn_fp32.partial.json")
        else:
            rec["sweep"] = {"skipped": "not in --parts"}
    except Exception:
        rec["sweep"] = {"error": _strip(traceback.format_exc()[-3000:])}
    part = out / "h200_cudnn_fp32.partial.json"
    if part.exists():
        part.unlink()
    rec["sweep_s"] = round(time.perf_counter() - t0, 1)
    log(f"sweep done in {rec['sweep_s']} s: {len(rec['sweep'].get('rows', []))} rows")
    deadline = t0 + budget - 3
    for kind, p in children.items():
        rec["parts"][kind] = finish_child(p, kind, out, deadline, logdir)
    try:
        rec["log"] = {"cudnn": summarize_log(logdir / "cudnn.log"), "frontend": summarize_log(logdir / "frontend.log")}
    except Exception as exc:
        rec["log"] = {"error": f"{type(exc).__name__}: {_first_line(exc)}"}
    for f in logdir.iterdir():
        f.unlink()
    logdir.rmdir()
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    name = "h200_cudnn_fp32.json" if not args.smoke else "smoke_cudnn_fp32.json"
    write_json(out / name, rec)
    log(f"wrote {out / name} in {rec['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
