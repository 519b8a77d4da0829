"""Record lesson 36 ("The flags people copy") on the H200: what four often-copied settings really do.

Run from the repository root on the GPU machine (budget about 120 s)::

    python benchmarks/record_lesson36_h200.py --out DIR          # DIR/h200_lesson36.json (+ one small .gz)
    python benchmarks/record_lesson36_h200.py --out /tmp/x --smoke   # CPU: tiny sizes, checks the code paths

Parts (each part's exception is caught into the JSON; one failed part loses nothing else):

1. ``cudnn``: ``torch.backends.cudnn.benchmark`` False vs True on a small fp32 CNN (4 conv layers, training
   step fwd+bwd), each setting in a fresh subprocess (the autotune cache lives in the process): fixed
   shape (wall time of the first calls, steady median by CUDA events) and variable shapes (10 new
   resolutions cycled 3 times: first-visit cost per shape, revisit median, total).
2. ``empty_cache``: a fragmented segment (a 512 MiB cached block carved into 64 x 8 MiB, every other
   one freed) plus four whole free 64 MiB segments; allocator numbers before/after ``empty_cache()``;
   then a training step repeated with and without ``empty_cache()`` between steps (peaks, time).
   A small memory snapshot of the first pattern is written (paths stripped).
3. ``prune``: ``torch.nn.utils.prune.l1_unstructured(amount=0.5)`` on a bf16 Linear (bytes, forward
   time) and ``torch.sparse.to_sparse_semi_structured`` (2:4) on a large bf16 weight (bytes, matmul time,
   error vs the dense matmul of the same 2:4 weight), per backend (cuSPARSELt default, CUTLASS forced).
4. ``torchao``: ``quantize_`` with int8 weight-only, int8 dynamic activation+weight, float8 weight-only and
   float8 dynamic on a bf16 MLP, eager (no torch.compile): weight bytes, latency at batch 16 and 4096,
   error vs bf16.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import gzip
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

T0 = time.monotonic()


def log(*a):
    print(f"[lesson36 {time.monotonic() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def _err(exc: BaseException) -> dict:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return {"error": f"{type(exc).__name__}: {_strip_text(first)[:400]}"}


def _strip_text(s: str) -> str:
    """Remove local paths (home, repo, site-packages prefixes) from a message."""
    for prefix in sorted({str(ROOT), os.path.expanduser("~"), sys.prefix}, key=len, reverse=True):
        if prefix and prefix != "/":
            s = s.replace(prefix, "<...>")
    return s


# --- timing --------------------------------------------------------------------------------------------
def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, reps: int, warmup: int = 2) -> list[float]:
    """Per-call times in ms: CUDA events on a GPU, perf_counter on a CPU (smoke)."""
    import torch

    for _ in range(warmup):
        fn()
    _sync()
    out = []
    cuda = torch.cuda.is_available()
    for _ in range(reps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def wall_ms(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - t) * 1e3


def med(xs):
    return float(statistics.median(xs)) if xs else None


def tensor_bytes(t) -> int:
    """Bytes of a tensor, looking through tensor subclasses (torchao, 2:4 sparse) to their inner tensors."""
    import torch

    if t is None:
        return 0
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n, None)) for n in names)
    return t.numel() * t.element_size()


def module_bytes(m) -> dict:
    p = sum(tensor_bytes(x) for x in m.parameters())
    b = sum(tensor_bytes(x) for x in m.buffers())
    return {"param_bytes": p, "buffer_bytes": b, "total_bytes": p + b,
            "params": [n for n, _ in m.named_parameters()], "buffers": [n for n, _ in m.named_buffers()]}


# --- env -----------------------------------------------------------------------------------------------
def env() -> dict:
    import torch

    e = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
         "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
         "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        e["gpu"] = torch.cuda.get_device_name(0)
        e["capability"] = list(torch.cuda.get_device_capability(0))
        e["total_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
        try:
            import pynvml

            pynvml.nvmlInit()
            d = pynvml.nvmlSystemGetDriverVersion()
            e["driver"] = d.decode() if isinstance(d, bytes) else d
        except Exception as exc:  # noqa: BLE001
            e["driver"] = _err(exc)["error"]
    try:
        import torchao

        e["torchao"] = torchao.__version__
    except Exception as exc:  # noqa: BLE001
        e["torchao"] = _err(exc)["error"]
    return e


# --- part 1: cudnn.benchmark (child process) ------------------------------------------------------------
def _cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))


def child_cudnn(bench: bool, smoke: bool) -> dict:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = bench
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    batch, fixed = (2, 32) if smoke else (32, 128)
    sizes = [24, 40] if smoke else [72, 88, 104, 120, 136, 152, 168, 184, 200, 216]
    cycles = 2 if smoke else 3
    steady_reps = 3 if smoke else 30
    model = _cnn(torch).to(dev)

    def step(x):
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()

    # CUDA context, cuDNN/cuBLAS handles: warmed on an unrelated shape that is never used again
    w = wall_ms(lambda: F.conv2d(torch.randn(1, 3, 17, 17, device=dev), torch.randn(8, 3, 3, 3, device=dev)).sum())
    x = torch.randn(batch, 3, fixed, fixed, device=dev)
    first = [wall_ms(lambda: step(x)) for _ in range(3)]
    steady = timed_ms(lambda: step(x), steady_reps, warmup=2)
    xs = {s: torch.randn(batch, 3, s, s, device=dev) for s in sizes}
    visits = {s: [] for s in sizes}
    t = time.perf_counter()
    for _ in range(cycles):
        for s in sizes:
            visits[s].append(wall_ms(lambda: step(xs[s])))
    total = (time.perf_counter() - t) * 1e3
    firsts = [visits[s][0] for s in sizes]
    revisits = [v for s in sizes for v in visits[s][1:]]
    return {
        "benchmark": bench, "device": dev, "dtype": "float32",
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32), "batch": batch,
        "context_warmup_ms": w,
        "fixed": {"shape": [batch, 3, fixed, fixed], "first_calls_wall_ms": first,
                  "steady_median_ms": med(steady), "steady_ms": steady},
        "variable": {"sizes": sizes, "cycles": cycles, "steps": cycles * len(sizes),
                     "first_visit_wall_ms": firsts, "first_visit_median_ms": med(firsts),
                     "revisit_median_ms": med(revisits), "total_wall_ms": total,
                     "per_size_wall_ms": {str(s): visits[s] for s in sizes}},
    }


def part_cudnn(args, deadline: float) -> dict:
    out = {}
    for bench in (False, True):
        left = deadline - time.monotonic()
        if left < 10:
            out[f"benchmark_{bench}"] = {"error": "skipped: out of time budget"}
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-cudnn", "1" if bench else "0"]
        if args.smoke:
            cmd.append("--smoke")
        try:
            t = time.monotonic()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=min(left, 45), cwd=str(ROOT))
            if r.returncode != 0:
                raise RuntimeError(f"child rc={r.returncode}: {_strip_text(r.stderr.strip()[-400:])}")
            rec = json.loads(r.stdout.strip().splitlines()[-1])
            rec["process_wall_s"] = time.monotonic() - t
            out[f"benchmark_{bench}"] = rec
        except Exception as exc:  # noqa: BLE001
            out[f"benchmark_{bench}"] = _err(exc)
        log(f"cudnn benchmark={bench}:", {k: v for k, v in out[f'benchmark_{bench}'].items() if k in ('fixed', 'error')})
    return out


# --- part 2: empty_cache ------------------------------------------------------------------------------
def allocator_now(torch) -> dict:
    segs = torch.cuda.memory_snapshot()
    holes = [b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"]
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    free = reserved - allocated
    largest = max(holes) if holes else 0
    st = torch.cuda.memory_stats()
    return {"reserved_bytes": reserved, "allocated_bytes": allocated, "free_in_reserved_bytes": free,
            "largest_free_block_bytes": largest, "free_blocks": len(holes), "segments": len(segs),
            "whole_free_segments": sum(1 for s in segs if s["allocated_size"] == 0),
            "cached_unused_share": free / reserved if reserved else 0.0,
            "external_fragmentation": 1 - largest / free if free else 0.0,
            "num_device_alloc": st.get("num_device_alloc"), "num_device_free": st.get("num_device_free")}


def _strip_snapshot(snap: dict) -> dict:
    def frames(fr):
        for f in fr or ():
            if isinstance(f, dict) and isinstance(f.get("filename"), str):
                fn = f["filename"]
                for marker in ("site-packages/", "dist-packages/"):
                    if marker in fn:
                        fn = "site-packages/" + fn.split(marker, 1)[1]
                        break
                else:
                    root = str(ROOT) + os.sep
                    fn = fn[len(root):] if fn.startswith(root) else (fn if fn.startswith("<") else os.path.basename(fn))
                f["filename"] = fn

    for seg in snap.get("segments", ()):
        frames(seg.get("frames"))
        for b in seg.get("blocks", ()):
            frames(b.get("frames"))
    for tr in snap.get("device_traces", ()):
        for e in tr:
            frames(e.get("frames"))
    return snap


def part_empty_cache(args, deadline: float, outdir: Path) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"error": "skipped: empty_cache() needs CUDA"}
    rec = {}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    u8 = torch.uint8
    recording = False
    try:
        torch.cuda.memory._record_memory_history(max_entries=20_000, stacks="python")
        recording = True
    except Exception as exc:  # noqa: BLE001
        rec["history"] = _err(exc)
    rec["start"] = allocator_now(torch)
    big = torch.empty(512 * MiB, dtype=u8, device="cuda")
    del big                                        # one cached 512 MiB segment, all free
    pieces = [torch.empty(8 * MiB, dtype=u8, device="cuda") for _ in range(64)]  # carve it into 64 x 8 MiB
    for i in range(0, 64, 2):
        pieces[i] = None                           # every other one freed: 32 holes inside a live segment
    whole = [torch.empty(64 * MiB, dtype=u8, device="cuda") for _ in range(4)]
    del whole                                      # four whole free 64 MiB segments
    torch.cuda.synchronize()
    rec["pattern"] = ("512 MiB block cached then carved into 64 x 8 MiB, every other freed (32 x 8 MiB holes in a "
                      "live segment); 4 x 64 MiB allocated and freed (4 whole free segments)")
    rec["before"] = allocator_now(torch)
    rec["empty_cache_call_ms"] = wall_ms(torch.cuda.empty_cache)
    rec["after"] = allocator_now(torch)
    if recording:
        try:
            snap = _strip_snapshot(torch.cuda.memory._snapshot())
            path = outdir / "h200_lesson36_empty_cache.snapshot.pickle.gz"
            with gzip.open(path, "wb", compresslevel=9) as f:
                pickle.dump(snap, f, protocol=4)
            rec["snapshot"] = {"file": path.name, "bytes": path.stat().st_size}
            if path.stat().st_size > 1_000_000:
                path.unlink()
                rec["snapshot"]["error"] = "over 1 MB: not kept"
        except Exception as exc:  # noqa: BLE001
            rec["snapshot"] = _err(exc)
        torch.cuda.memory._record_memory_history(enabled=None)
    del pieces
    torch.cuda.empty_cache()

    # the next steps: same training step, with and without empty_cache() between steps
    torch.manual_seed(0)
    d, h, n = 4096, 8192, 2048
    model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to("cuda", torch.bfloat16)
    x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16)

    def step():
        for p in model.parameters():
            p.grad = None
        model(x).float().square().mean().backward()
        for p in model.parameters():
            p.grad = None                         # the step's gradients die with it: all its memory is transient

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    steps = 20
    modes = {}
    for mode in ("keep_cache", "empty_cache_between_steps"):
        if time.monotonic() > deadline:
            modes[mode] = {"error": "skipped: out of time budget"}
            continue
        st0 = torch.cuda.memory_stats()
        ms, peaks_a, peaks_r, ec_ms = [], [], [], []
        for _ in range(steps):
            if mode == "empty_cache_between_steps":
                ec_ms.append(wall_ms(torch.cuda.empty_cache))
            torch.cuda.reset_peak_memory_stats()
            ms.append(wall_ms(step))
            peaks_a.append(torch.cuda.max_memory_allocated())
            peaks_r.append(torch.cuda.max_memory_reserved())
        st1 = torch.cuda.memory_stats()
        modes[mode] = {"step_median_ms": med(ms), "step_ms": ms, "empty_cache_median_ms": med(ec_ms),
                       "max_memory_allocated_bytes": max(peaks_a), "max_memory_reserved_bytes": max(peaks_r),
                       "reserved_after_bytes": torch.cuda.memory_reserved(),
                       "device_allocs": (st1.get("num_device_alloc", 0) - st0.get("num_device_alloc", 0))
                       if "num_device_alloc" in st1 else None,
                       "device_frees": (st1.get("num_device_free", 0) - st0.get("num_device_free", 0))
                       if "num_device_free" in st1 else None}
        log("empty_cache", mode, {k: v for k, v in modes[mode].items() if k != "step_ms"})
    rec["steps"] = {"model": f"bf16 MLP {d}->{h}->{d}, batch {n}, fwd+bwd, grads dropped each step",
                    "steps": steps, "modes": modes}
    del model, x
    torch.cuda.empty_cache()
    return rec


# --- part 3: prune vs 2:4 ----------------------------------------------------------------------------
def part_prune(args, deadline: float) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.utils import prune

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    reps = 5 if args.smoke else 30
    rec = {}
    try:
        torch.manual_seed(0)
        d = 256 if args.smoke else 4096
        lin = torch.nn.Linear(d, d).to(dev, dt)
        x = torch.randn(64 if args.smoke else 256, d, device=dev, dtype=dt)
        with torch.no_grad():
            before = module_bytes(lin)
            t_before = timed_ms(lambda: lin(x), reps)
            prune.l1_unstructured(lin, "weight", amount=0.5)
            after = module_bytes(lin)
            zero = float((lin.weight == 0).float().mean())
            t_after = timed_ms(lambda: lin(x), reps)
            prune.remove(lin, "weight")
            removed = module_bytes(lin)
            t_removed = timed_ms(lambda: lin(x), reps)
        rec["prune"] = {"layer": f"Linear({d}, {d}) {str(dt).replace('torch.', '')}", "batch": x.shape[0],
                        "before": before, "after_prune": after, "after_remove": removed,
                        "zero_fraction": zero, "forward_median_ms": {
                            "dense": med(t_before), "pruned": med(t_after), "after_remove": med(t_removed)}}
        log("prune", rec["prune"]["forward_median_ms"], before["total_bytes"], after["total_bytes"])
    except Exception as exc:  # noqa: BLE001
        rec["prune"] = _err(exc)

    semi = {}
    try:
        from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

        n = k = 256 if args.smoke else 8192
        torch.manual_seed(0)
        w = torch.randn(n, k, device=dev, dtype=dt)
        g = w.abs().view(n, k // 4, 4)
        keep = g.topk(2, dim=-1).indices
        mask = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, keep, True).view(n, k)
        w24 = w * mask                                  # 2:4: two of every four consecutive weights kept (by magnitude)
        semi["weight"] = {"shape": [n, k], "dtype": str(dt).replace("torch.", ""), "dense_bytes": tensor_bytes(w24),
                          "zero_fraction": float((w24 == 0).float().mean())}
        batches = [16, 64] if args.smoke else [64, 8192]
        for backend in ("default", "cutlass"):
            if time.monotonic() > deadline:
                semi[backend] = {"error": "skipped: out of time budget"}
                continue
            b = {}
            old = SparseSemiStructuredTensor._FORCE_CUTLASS
            try:
                SparseSemiStructuredTensor._FORCE_CUTLASS = backend == "cutlass"
                ws = to_sparse_semi_structured(w24)
                b["class"] = type(ws).__name__
                b["bytes"] = tensor_bytes(ws)
                for m in batches:
                    try:
                        xm = torch.randn(m, k, device=dev, dtype=dt)
                        ref = F.linear(xm, w24)
                        got = F.linear(xm, ws)
                        dense_t = timed_ms(lambda: F.linear(xm, w24), reps)
                        sparse_t = timed_ms(lambda: F.linear(xm, ws), reps)
                        b[f"batch_{m}"] = {
                            "dense_median_ms": med(dense_t), "sparse_median_ms": med(sparse_t),
                            "speedup": med(dense_t) / med(sparse_t),
                            "max_abs_err_vs_dense": float((got.float() - ref.float()).abs().max()),
                            "max_abs_dense": float(ref.float().abs().max())}
                    except Exception as exc:  # noqa: BLE001
                        b[f"batch_{m}"] = _err(exc)
            except Exception as exc:  # noqa: BLE001
                b.update(_err(exc))
            finally:
                SparseSemiStructuredTensor._FORCE_CUTLASS = old
            semi[backend] = b
            log("2:4", backend, b)
    except Exception as exc:  # noqa: BLE001
        semi.update(_err(exc))
    rec["semi_structured"] = semi
    return rec


# --- part 4: torchao ----------------------------------------------------------------------------------
CONFIGS = {
    "int8_weight_only": ("Int8WeightOnlyConfig", "int8_weight_only"),
    "int8_dynamic": ("Int8DynamicActivationInt8WeightConfig", "int8_dynamic_activation_int8_weight"),
    "float8_weight_only": ("Float8WeightOnlyConfig", "float8_weight_only"),
    "float8_dynamic": ("Float8DynamicActivationFloat8WeightConfig", "float8_dynamic_activation_float8_weight"),
}


def part_torchao(args, deadline: float) -> dict:
    import torch

    rec = {}
    try:
        import torchao.quantization as tq
    except Exception as exc:  # noqa: BLE001
        return _err(exc)
    rec["probed"] = {k: [n for n in names if hasattr(tq, n)] for k, names in CONFIGS.items()}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    d, h = (256, 1024) if args.smoke else (4096, 14336)
    batches = [16, 64] if args.smoke else [16, 4096]
    reps = 5 if args.smoke else 30
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to(dev, torch.bfloat16)
    base.eval()
    xs = {m: torch.randn(m, d, device=dev, dtype=torch.bfloat16) for m in batches}
    rec["model"] = f"bf16 MLP Linear({d},{h}) GELU Linear({h},{d}), eval, no torch.compile"
    with torch.no_grad():
        refs = {m: base(xs[m]) for m in batches}
        r = {"weight_bytes": module_bytes(base)["param_bytes"]}
        for m in batches:
            r[f"batch_{m}_median_ms"] = med(timed_ms(lambda: base(xs[m]), reps))
        rec["bf16"] = r
        log("torchao bf16", r)
        for name, names in CONFIGS.items():
            if time.monotonic() > deadline:
                rec[name] = {"error": "skipped: out of time budget"}
                continue
            r = {}
            try:
                found = [n for n in names if hasattr(tq, n)]
                if not found:
                    raise AttributeError(f"torchao.quantization has none of {names}")
                r["api"] = found[0]
                model = copy.deepcopy(base)
                t = time.perf_counter()
                tq.quantize_(model, getattr(tq, found[0])())
                _sync()
                r["quantize_s"] = time.perf_counter() - t
                r["weight_bytes"] = module_bytes(model)["param_bytes"]
                r["weight_class"] = type(model[0].weight).__name__
                for m in batches:
                    try:
                        y = model(xs[m])
                        ref = refs[m].float()
                        err = (y.float() - ref)
                        r[f"batch_{m}_median_ms"] = med(timed_ms(lambda: model(xs[m]), reps))
                        r[f"batch_{m}_max_abs_err"] = float(err.abs().max())
                        r[f"batch_{m}_rel_l2_err"] = float(err.norm() / ref.norm())
                    except Exception as exc:  # noqa: BLE001
                        r[f"batch_{m}"] = _err(exc)
                del model
            except Exception as exc:  # noqa: BLE001
                r.update(_err(exc))
            rec[name] = r
            log("torchao", name, r)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rec["bf16_max_abs_out"] = {str(m): float(refs[m].float().abs().max()) for m in batches}
    return rec


# --- main ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="directory for h200_lesson36.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on a CPU (checks the code paths)")
    p.add_argument("--budget", type=float, default=110.0, help="seconds for all parts (default 110)")
    p.add_argument("--child-cudnn", choices=("0", "1"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_cudnn is not None:
        print(json.dumps(child_cudnn(args.child_cudnn == "1", args.smoke)))
        return 0
    if args.out is None:
        p.error("--out DIR is required")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    deadline = T0 + args.budget
    result = {"lesson": 36, "smoke": args.smoke, "budget_s": args.budget}
    try:
        result["env"] = env()
    except Exception as exc:  # noqa: BLE001
        result["env"] = _err(exc)
    log("env", result["env"])
    if not torch.cuda.is_available() and not args.smoke:
        log("no CUDA device: run it on the GPU machine (or use --smoke)")
    # child budget for cudnn: leave time for the in-process parts
    parts = [
        ("cudnn", lambda: part_cudnn(args, T0 + args.budget * 0.45)),
        ("empty_cache", lambda: part_empty_cache(args, deadline - 40, args.out)),
        ("prune", lambda: part_prune(args, deadline - 20)),
        ("torchao", lambda: part_torchao(args, deadline)),
    ]
    for name, fn in parts:
        if time.monotonic() > deadline:
            result[name] = {"error": "skipped: out of time budget"}
            continue
        log("part", name)
        t = time.monotonic()
        try:
            result[name] = fn()
        except Exception as exc:  # noqa: BLE001
            result[name] = _err(exc)
            log(name, "failed:", _strip_text(traceback.format_exc()[-1500:]))
        if isinstance(result[name], dict):
            result[name]["part_wall_s"] = time.monotonic() - t
        # write after each part: a later crash keeps what is done
        (args.out / "h200_lesson36.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    result["total_wall_s"] = time.monotonic() - T0
    (args.out / "h200_lesson36.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    log("wrote", (args.out / "h200_lesson36.json").name, f"in {result['total_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
