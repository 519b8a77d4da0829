"""Record lesson 17 ("attention kernels") on the H200: the SDPA backends against each other and a hand-written one.

Run from the repository root on the GPU machine (budget about 140 s)::

    python benchmarks/record_lesson17_h200.py --out DIR            # DIR/h200_lesson17.json
    python benchmarks/record_lesson17_h200.py --out /tmp/x --smoke   # CPU: tiny sizes, checks the code paths

The file is named h200_ whatever GPU ran it; ship it under the name of the GPU in its ``env.gpu`` (the
shipped run was an H100's: workbench/samples/results/h100_lesson17.json).

Each part runs in its own subprocess (a fresh CUDA context and allocator; a crash or a hang loses that part
only, written as its error line). Inside a part every combination that cannot run is recorded as a row with
its error (torch's message and the reasons its warnings give), never a crash.

Parts (``torch.bfloat16``, batch 4, 16 heads unless said; ``--smoke``: batch 1, 2 heads, sequences 64..256):

``sweep_d128``, ``sweep_d64``
    head_dim 128 / 64, sequence 1024..16384; masks ``none``, ``causal`` (``is_causal=True``) and ``mask`` (the
    same causal mask as an explicit boolean ``attn_mask`` tensor); backends ``flash``, ``efficient``,
    ``cudnn``, ``math`` (each forced with ``torch.nn.attention.sdpa_kernel``) and ``naive``
    (``softmax(Q K^T / sqrt(d)) V`` written out, the mask by ``masked_fill``; it has no ``is_causal``, so its
    ``causal`` row is skipped: its ``mask`` row is the causal one). Modes ``fwd`` (inputs without grad) and
    ``fwd_bwd`` (inputs with grad, ``out.backward(grad)``). Each row: the median and minimum of CUDA-event
    times after two warm-up calls (up to 10 calls, fewer when one call is long), the peak memory above what
    was allocated before the call (``max_memory_allocated`` after ``reset_peak_memory_stats``; fwd_bwd: the
    inputs' gradients included), FLOPs and TFLOP/s. ``math`` and ``naive`` rows whose score matrices would
    need more than ``--max-gib`` are skipped with the estimate. ``default``: which backend the dispatcher
    picks with no ``sdpa_kernel`` (the aten op a profiler sees), for inference and training inputs.
``support``
    sequence 1024, dtypes bf16 / fp16 / fp32, head_dim 64 / 128 / 256 / 512: each backend's fwd and fwd_bwd,
    ok (with its time) or its error line, and the default's pick.
``kernels``
    sequence 4096, head_dim 128, masks ``none`` and ``causal``: the GPU kernels each backend launches for one
    fwd_bwd (torch.profiler, names and time; CPU ops on ``--smoke``).

FLOPs: the count attention benchmarks use (FlashAttention's): forward ``4 * B * H * S^2 * D`` (two S x S x D
matrix products), half of it when causal (``causal`` and ``mask`` rows alike: the explicit mask does the
same useful work); backward 2.5x the forward (five products, the scores recomputed); fwd_bwd 3.5x.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
T0 = time.monotonic()

# lesson 36's recorder: its environment block and its per-call timer (CUDA events / perf_counter)
_spec = importlib.util.spec_from_file_location("_rec36", Path(__file__).resolve().parent / "record_lesson36_h200.py")
_rec36 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rec36)

BACKENDS = ("flash", "efficient", "cudnn", "math", "naive")
SDPA = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}
MASKS = ("none", "causal", "mask")
MODES = ("fwd", "fwd_bwd")
# the aten op that names the backend the dispatcher took (CPU op names included, for --smoke)
PICKED = (("_scaled_dot_product_flash_attention_for_cpu", "flash"), ("_scaled_dot_product_flash_attention", "flash"),
          ("_scaled_dot_product_efficient_attention", "efficient"), ("_scaled_dot_product_cudnn_attention", "cudnn"),
          ("_scaled_dot_product_attention_math", "math"), ("_scaled_dot_product_fused_attention_overrideable", "overrideable"))
COLUMNS = ("head_dim", "seq", "mask", "backend", "mode", "status", "median_ms", "min_ms", "reps", "peak_extra_bytes",
           "flops", "tflops", "error")
SUPPORT_COLUMNS = ("dtype", "head_dim", "backend", "mode", "status", "median_ms", "error")


def sizes(smoke: bool) -> dict:
    """Shapes, and how many calls a row times (``reps``: at most; ``target_s``: fewer when a call is long)."""
    if smoke:
        return {"batch": 1, "heads": 2, "seqs": [64, 128, 256], "support_seq": 32, "kernels_seq": 128,
                "warmup": 1, "reps": 3, "target_s": 0.01}
    return {"batch": 4, "heads": 16, "seqs": [1024, 2048, 4096, 8192, 16384], "support_seq": 1024,
            "kernels_seq": 4096, "warmup": 2, "reps": 10, "target_s": 0.25}


def log(*a):
    print(f"[lesson17 {time.monotonic() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def _strip_text(s: str) -> str:
    """Remove local paths (home, repository, interpreter prefixes) from a message."""
    for prefix in sorted({str(ROOT), os.path.expanduser("~"), sys.prefix, sys.base_prefix}, key=len, reverse=True):
        if prefix and prefix != "/":
            s = s.replace(prefix, "<...>")
    return s


def _err(exc: BaseException) -> dict:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return {"error": f"{type(exc).__name__}: {_strip_text(first)[:400]}"}


def error_line(exc: BaseException, caught: list) -> str:
    """torch's one line, then the reasons its UserWarnings gave (which backend refused, and why)."""
    text = str(exc).strip()
    line = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".strip()
    reasons = []
    for w in caught:
        msg = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", " ".join(str(w.message).split())).strip()
        if not msg or msg.endswith("because:") or "has been runtime disabled" in msg or msg in reasons:
            continue
        # torch prefixes each reason with the C++ file and line: keep the sentence
        if "] " in msg and msg.startswith(("/", "<", "(")):
            msg = msg.split("] ", 1)[1]
        reasons.append(msg)
    if reasons:
        line += " | " + "; ".join(reasons)
    return _strip_text(line)[:360]


# --- env -----------------------------------------------------------------------------------------------
def env() -> dict:
    """Lesson 36's recorder's environment (torch, CUDA, cuDNN, GPU, driver; its torchao line dropped) and
    whether the math SDPA backend may reduce in fp16/bf16."""
    import torch

    e = {"gpu": None, "capability": None, "total_memory_bytes": None, "driver": None, **_rec36.env()}
    e.pop("torchao", None)
    e["math_sdp_fp16_bf16_reduction"] = bool(getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed",
                                                     lambda: None)())
    return e


# --- one attention call ---------------------------------------------------------------------------------
class Case:
    """q, k, v (and the grad of the output) for one shape; ``fn(backend, mask, mode)`` -> a callable."""

    def __init__(self, torch, batch, heads, seq, head_dim, dtype, dev):
        self.torch, self.dev = torch, dev
        g = torch.Generator(device=dev).manual_seed(0)
        shape = (batch, heads, seq, head_dim)
        self.q, self.k, self.v = (torch.randn(shape, device=dev, dtype=dtype, generator=g) for _ in range(3))
        self.grad = torch.randn(shape, device=dev, dtype=dtype, generator=g)
        self.tril = torch.ones(seq, seq, device=dev, dtype=torch.bool).tril()
        self.above = ~self.tril
        self.scale = 1.0 / math.sqrt(head_dim)

    def inputs(self, mode):
        if mode == "fwd":
            return self.q, self.k, self.v
        return tuple(t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))

    def fn(self, backend: str | None, mask: str, mode: str):
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q, k, v = self.inputs(mode)
        kw = {"is_causal": True} if mask == "causal" else {"attn_mask": self.tril} if mask == "mask" else {}

        if backend == "naive":
            def forward():
                s = (q @ k.transpose(-2, -1)) * self.scale
                if mask != "none":
                    s = s.masked_fill(self.above, float("-inf"))
                return torch.softmax(s, dim=-1) @ v
        elif backend is None:
            def forward():
                return F.scaled_dot_product_attention(q, k, v, **kw)
        else:
            which = getattr(SDPBackend, SDPA[backend])

            def forward():
                with sdpa_kernel(which):
                    return F.scaled_dot_product_attention(q, k, v, **kw)

        if mode == "fwd":
            def call():
                with torch.no_grad():
                    return forward()
        else:
            def call():
                for t in (q, k, v):
                    t.grad = None
                out = forward()
                out.backward(self.grad)
                return out
        call.inputs = (q, k, v)
        return call


def _sync(torch):
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(call, reps_max: int, target_s: float) -> list[float]:
    """Per-call ms after the caller's warm-up: CUDA events on a GPU, perf_counter on a CPU."""
    first = _rec36.timed_ms(call, 1, warmup=0)[0]
    reps = max(3, min(reps_max, int(target_s * 1e3 / max(first, 1e-3))))
    return [first] + _rec36.timed_ms(call, reps - 1, warmup=0)


def peak_extra_bytes(torch, call) -> int | None:
    if not torch.cuda.is_available():
        return None
    for t in getattr(call, "inputs", ()):
        t.grad = None                 # the last call's gradients: counted in the peak, not in the base
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def attention_flops(b, h, s, d, causal: bool, mode: str) -> int:
    fwd = 4 * b * h * s * s * d // (2 if causal else 1)
    return fwd if mode == "fwd" else fwd * 7 // 2


def score_bytes_needed(backend, b, h, s, mode, elt_bytes) -> int:
    """A rough need of the math / naive paths: S x S score matrices (3 live in a forward, 6 with backward)."""
    per = b * h * s * s * (4 if backend == "math" else elt_bytes)
    return per * (3 if mode == "fwd" else 6)


def run_one(torch, case, backend, mask, mode, *, reps_max=10, target_s=0.25, warmup=2) -> dict:
    """{status, median_ms, min_ms, reps, peak_extra_bytes, error}: ok, or the error line."""
    row = {"status": "error", "median_ms": None, "min_ms": None, "reps": None, "peak_extra_bytes": None, "error": None}
    try:
        call = case.fn(backend, mask, mode)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                for _ in range(warmup):
                    call()
                _sync(torch)
            except Exception as exc:  # noqa: BLE001
                row["error"] = error_line(exc, caught)
                return row
        times = time_ms(call, reps_max, target_s)
        row.update(status="ok", median_ms=round(statistics.median(times), 4), min_ms=round(min(times), 4),
                   reps=len(times), peak_extra_bytes=peak_extra_bytes(torch, call))
    except Exception as exc:  # noqa: BLE001 (an OOM in timing, ...)
        row.update(status="error", error=error_line(exc, []))
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return row


def picked_backend(torch, case, mask, mode) -> str:
    """The backend the dispatcher took with no sdpa_kernel: the aten op the profiler records (CPU side only)."""
    from torch.profiler import ProfilerActivity, profile

    call = case.fn(None, mask, mode)
    call()
    _sync(torch)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                call()
                _sync(torch)
    except Exception as exc:  # noqa: BLE001
        return "error: " + error_line(exc, caught)
    names = {e.name for e in prof.events()}
    for op, name in PICKED:
        if f"aten::{op}" in names:
            return name
    return "unknown: " + ", ".join(sorted(n for n in names if "attention" in n))[:200]


# --- parts (each in its own process) -------------------------------------------------------------------
class Table:
    """Rows as lists under fixed columns, error texts kept once (``errors``; a row holds the index)."""

    def __init__(self, columns, errors: list):
        self.columns, self.rows, self.errors = list(columns), [], errors

    def add(self, **cells):
        if cells.get("error") is not None:
            if cells["error"] not in self.errors:
                self.errors.append(cells["error"])
            cells["error"] = self.errors.index(cells["error"])
        self.rows.append([cells.get(c) for c in self.columns])

    def out(self) -> dict:
        return {"columns": self.columns, "rows": self.rows}


def part_sweep(torch, smoke: bool, head_dim: int, deadline: float, max_gib: float) -> dict:
    z = sizes(smoke)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, h, dtype = z["batch"], z["heads"], torch.bfloat16
    errors: list = []
    runs, picks = Table(COLUMNS, errors), Table(("head_dim", "seq", "mask", "mode", "picked"), errors)
    for s in z["seqs"]:
        case = Case(torch, b, h, s, head_dim, dtype, dev)
        for mask in MASKS:
            for mode in MODES:
                picks.add(head_dim=head_dim, seq=s, mask=mask, mode=mode, picked=picked_backend(torch, case, mask, mode))
            for backend in BACKENDS:
                for mode in MODES:
                    flops = attention_flops(b, h, s, head_dim, mask != "none", mode)
                    key = {"head_dim": head_dim, "seq": s, "mask": mask, "backend": backend, "mode": mode, "flops": flops}
                    if backend == "naive" and mask == "causal":
                        runs.add(**key, status="skipped", error="skipped: no is_causal in a hand-written attention "
                                                                  "(its 'mask' row is the causal one)")
                        continue
                    if backend in ("math", "naive"):
                        need = score_bytes_needed(backend, b, h, s, mode, 2)
                        if need > max_gib * GiB:
                            runs.add(**key, status="skipped",
                                     error=f"skipped: would need ~{need / GiB:.0f} GiB of score matrices "
                                           f"(limit {max_gib:g} GiB)")
                            continue
                    if time.monotonic() > deadline:
                        runs.add(**key, status="skipped", error="skipped: out of time budget")
                        continue
                    r = run_one(torch, case, backend, mask, mode, reps_max=z["reps"], target_s=z["target_s"],
                                warmup=z["warmup"])
                    tflops = round(flops / (r["median_ms"] * 1e9), 2) if r["median_ms"] else None
                    runs.add(**key, **r, tflops=tflops)
            log(f"d={head_dim} S={s} {mask}:", [(row[3], row[4], row[6] if row[5] == "ok" else row[5])
                                               for row in runs.rows[-10:]])
        del case
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"batch": b, "heads": h, "dtype": "bfloat16", "head_dim": head_dim, "seqs": z["seqs"],
            "runs": runs.out(), "default": picks.out(), "errors": errors}


def part_support(torch, smoke: bool, deadline: float) -> dict:
    z = sizes(smoke)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    b, h, s = z["batch"], z["heads"], z["support_seq"]
    errors: list = []
    runs = Table(SUPPORT_COLUMNS, errors)
    picks = Table(("dtype", "head_dim", "mode", "picked"), errors)
    for dname in ("bfloat16", "float16", "float32"):
        for d in (64, 128, 256, 512):
            case = Case(torch, b, h, s, d, getattr(torch, dname), dev)
            for mode in MODES:
                picks.add(dtype=dname, head_dim=d, mode=mode, picked=picked_backend(torch, case, "none", mode))
            for backend in ("flash", "efficient", "cudnn", "math"):
                for mode in MODES:
                    if time.monotonic() > deadline:
                        runs.add(dtype=dname, head_dim=d, backend=backend, mode=mode, status="skipped",
                                 error="skipped: out of time budget")
                        continue
                    r = run_one(torch, case, backend, "none", mode, reps_max=min(5, z["reps"]), target_s=0.05, warmup=1)
                    runs.add(dtype=dname, head_dim=d, backend=backend, mode=mode, status=r["status"],
                             median_ms=r["median_ms"], error=r["error"])
            log(f"support {dname} d={d}:", [(r[2], r[3], r[4]) for r in runs.rows[-8:]])
            del case
    return {"batch": b, "heads": h, "seq": s, "mask": "none", "runs": runs.out(), "default": picks.out(),
            "errors": errors, "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32)}


def part_kernels(torch, smoke: bool, deadline: float) -> dict:
    """The kernels (GPU) or ops (CPU) one fwd_bwd runs, per backend: name, calls and self time."""
    from torch.profiler import ProfilerActivity, profile

    z = sizes(smoke)
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    b, h, s, d = z["batch"], z["heads"], z["kernels_seq"], 128
    case = Case(torch, b, h, s, d, torch.bfloat16, dev)
    out = {"batch": b, "heads": h, "seq": s, "head_dim": d, "dtype": "bfloat16", "mode": "fwd_bwd",
           "what": "GPU kernels" if cuda else "CPU ops", "masks": {}}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for mask in ("none", "causal"):
        per = {}
        for backend in BACKENDS:
            if backend == "naive" and mask == "causal":
                continue
            if time.monotonic() > deadline:
                per[backend] = {"error": "skipped: out of time budget"}
                continue
            try:
                call = case.fn(backend, mask, "fwd_bwd")
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        call()
                        _sync(torch)
                    except Exception as exc:  # noqa: BLE001
                        per[backend] = {"error": error_line(exc, caught)}
                        continue
                with profile(activities=acts) as prof:
                    call()
                    _sync(torch)
                rows = []
                for e in prof.key_averages():
                    on_gpu = str(getattr(e, "device_type", "")).endswith("CUDA")
                    if cuda != on_gpu:
                        continue
                    us = getattr(e, "self_device_time_total", None) if cuda else e.self_cpu_time_total
                    if us is None:
                        us = getattr(e, "self_cuda_time_total", 0)
                    rows.append((float(us), e.key, int(e.count)))
                rows.sort(key=lambda r: (-r[0], r[1]))
                total = sum(r[0] for r in rows)
                per[backend] = {"total_us": round(total, 1), "top_columns": ["name", "calls", "us"],
                                "top": [[_strip_text(k)[:100], n, round(us, 1)] for us, k, n in rows[:6]]}
            except Exception as exc:  # noqa: BLE001
                per[backend] = _err(exc)
            log(f"kernels {mask} {backend}:", [t[0][:50] for t in per[backend].get("top", [])][:3])
        out["masks"][mask] = per
    return out


PARTS = ("support", "sweep_d128", "sweep_d64", "kernels")
# share of the whole budget each part may use at most (what a part leaves, the next ones get)
CAPS = {"support": 0.15, "sweep_d128": 0.45, "sweep_d64": 0.35, "kernels": 0.15}


def child(part: str, smoke: bool, seconds: float, max_gib: float) -> dict:
    import torch

    torch.manual_seed(0)
    if not torch.cuda.is_available():
        torch.set_num_threads(1)              # --smoke: the code paths, quickly (no thread contention)
    deadline = time.monotonic() + seconds
    if part == "support":
        return part_support(torch, smoke, deadline)
    if part.startswith("sweep_d"):
        return part_sweep(torch, smoke, int(part.removeprefix("sweep_d")), deadline, max_gib)
    if part == "kernels":
        return part_kernels(torch, smoke, deadline)
    raise ValueError(part)


# --- output --------------------------------------------------------------------------------------------
def dumps(obj, indent: int = 0) -> str:
    """JSON with sorted keys, one row of a table per line (the file stays small and diffs line by line)."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{pad}{json.dumps(k)}: {dumps(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, list) for x in obj):
        return "[\n" + ",\n".join(pad + json.dumps(x) for x in obj) + "\n" + " " * indent + "]"
    if isinstance(obj, list) and obj and any(isinstance(x, dict) for x in obj):
        return "[\n" + ",\n".join(pad + dumps(x, indent + 1) for x in obj) + "\n" + " " * indent + "]"
    return json.dumps(obj, sort_keys=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="directory for h200_lesson17.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on a CPU (checks the code paths)")
    p.add_argument("--budget", type=float, default=140.0, help="seconds for all parts (default 140)")
    p.add_argument("--max-gib", type=float, default=32.0,
                   help="skip math/naive rows whose score matrices would need more (GiB, default 32)")
    p.add_argument("--child", choices=PARTS, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.smoke, args.seconds, args.max_gib)))
        return 0
    if args.out is None:
        p.error("--out DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "h200_lesson17.json"
    result = {"lesson": 17, "smoke": args.smoke, "budget_s": args.budget, "max_gib": args.max_gib,
              "flops": "forward 4*B*H*S^2*D, half when causal (the 'mask' rows too); fwd_bwd 3.5x the forward "
                       "(backward 2.5x: FlashAttention's count, scores recomputed)",
              "memory": "peak_extra_bytes: torch.cuda.max_memory_allocated() during one call minus "
                        "memory_allocated() before it (fwd_bwd: the inputs' gradients included)",
              "timing": "CUDA events per call after 2 warm-up calls, median and min of up to 10 calls"}
    try:
        import torch  # noqa: F401

        result["env"] = env()
    except Exception as exc:  # noqa: BLE001
        result["env"] = _err(exc)
    log("env", result["env"])
    if not result["env"].get("cuda_available") and not args.smoke:
        log("no CUDA device: run it on the GPU machine (or use --smoke for the code paths)")
        return 2
    deadline = T0 + args.budget
    for part in PARTS:
        left = deadline - time.monotonic()
        if left < 5:
            result[part] = {"error": "skipped: out of time budget"}
            continue
        # the part times its own runs to `seconds`; the process itself is killed at that plus a margin
        seconds = min(left - 3, args.budget * CAPS[part] + max(0.0, left - args.budget * sum(
            CAPS[q] for q in PARTS[PARTS.index(part):])))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--seconds", f"{seconds:.1f}",
               "--max-gib", str(args.max_gib)] + (["--smoke"] if args.smoke else [])
        log("part", part, f"({seconds:.0f} s)")
        t = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, left), cwd=str(ROOT))
            if r.returncode != 0:
                raise RuntimeError(f"part process rc={r.returncode}: {_strip_text(r.stderr.strip()[-600:])}")
            sys.stderr.write(r.stderr)
            result[part] = json.loads(r.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            result[part] = {"error": f"TimeoutExpired: the part's process ran past {left:.0f} s"}
        except Exception as exc:  # noqa: BLE001
            result[part] = _err(exc)
            log(part, "failed:", _strip_text(traceback.format_exc()[-1500:]))
        result[part]["part_wall_s"] = round(time.monotonic() - t, 1)
        target.write_text(dumps(result) + "\n")      # after each part: a later crash keeps what is done
    result["total_wall_s"] = round(time.monotonic() - T0, 1)
    target.write_text(dumps(result) + "\n")
    log("wrote", target.name, f"({target.stat().st_size} bytes) in {result['total_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
