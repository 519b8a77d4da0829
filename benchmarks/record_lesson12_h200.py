"""Record lesson 12 (CPU and GPU agree) on the H200: one training step in five precisions, a planted bug,
and deterministic algorithms.

Run from the repository root (about 20 s)::

    python benchmarks/record_lesson12_h200.py --out DIR       # writes DIR/h200_lesson12.json
    python benchmarks/record_lesson12_h200.py --smoke --out DIR   # tiny sizes, CPU parts only

Parts (each one's exception is caught into the JSON; the clock is checked between parts):

1. ``precision``: one forward + backward of a small transformer (``workbench.capture.models.LM``, fixed
   seed, fixed tokens, cross-entropy loss) in CPU fp64 (the reference), CPU fp32, GPU fp64, GPU fp32
   (TF32 off for matmuls and cuDNN), GPU TF32 and GPU bf16 autocast (TF32 off). The weights are made in
   fp32 and cast up for fp64, so every run starts from the same numbers. Per tensor (logits, loss, every
   parameter's gradient): ``max_rel`` = max|x - ref| / max|ref| and ``norm_rel`` = ||x - ref|| / ||ref||
   (``workbench.analysis.numerics``), against CPU fp64.
2. ``planted_bug``: the step's loss, logits and gradients brought to the host with
   ``.to("cpu", non_blocking=True)`` and read at once, without a synchronize (the bug), then the same
   code with ``torch.cuda.synchronize()`` before the read (the fix); trial 0 is the step of part 1
   (compared with CPU fp64), later trials are new batches (compared with their fixed read). The same
   buggy code on CPU tensors is compared with a blocking copy (bitwise).
3. ``determinism``: ``index_add_`` and ``scatter_add_`` of float32 rows with many repeated indices (CUDA
   atomics), and the model's gradients, each run twice with default algorithms and twice under
   ``torch.use_deterministic_algorithms(True)`` (``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set at start):
   bitwise equal or not, the largest difference, the error against fp64; CUDA-event medians of both.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises (deterministic cuBLAS)

import argparse
import datetime as _dt
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np
import torch
import torch.nn.functional as F

from workbench.analysis.numerics import UNIT_ROUNDOFF, bitwise_equal, max_abs_diff, max_rel_err, norm_rel_err
from workbench.capture.models import LM

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[lesson12 {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def clean(text: str) -> str:
    """A traceback or message without local paths."""
    for p in (str(ROOT), str(Path.home()), sys.prefix):
        if p and p != "/":
            text = text.replace(p, "<...>")
    return text


def failure(exc: BaseException) -> dict:
    return {"error": clean(f"{type(exc).__name__}: {exc}"), "traceback": clean(traceback.format_exc())[-3000:]}


# --------------------------------------------------------------------------------------------------
# The step


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def make_model(p: dict) -> LM:
    torch.manual_seed(0)
    return LM(layers=p["layers"], d=p["d"], heads=p["heads"], vocab=p["vocab"], max_seq=p["seq"])


def make_batch(p: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    tokens = torch.randint(0, p["vocab"], (p["batch"], p["seq"]), generator=g)
    targets = torch.randint(0, p["vocab"], (p["batch"], p["seq"]), generator=g)
    return tokens, targets


def run_step(model, tokens, targets, autocast_bf16: bool = False):
    """One forward + backward; returns (loss, logits, {param name: grad}) as tensors on the model's device."""
    model.zero_grad(set_to_none=True)
    dev = next(model.parameters()).device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(tokens)
        wide = logits if logits.dtype == torch.float64 else logits.float()  # bf16 logits: the loss in fp32
        loss = F.cross_entropy(wide.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach(), logits.detach(), {n: q.grad for n, q in model.named_parameters()}


def to_host(loss, logits, grads) -> dict:
    """Blocking copies, as float64 arrays."""
    out = {"loss": loss.double().cpu().numpy(), "logits": logits.double().cpu().numpy()}
    out.update({f"grad:{n}": g.double().cpu().numpy() for n, g in grads.items()})
    return out


def gather_non_blocking(loss, logits, grads, sync: bool) -> tuple[dict, bool | None]:
    """THE PLANTED BUG when ``sync`` is False: device-to-host copies with ``non_blocking=True`` read at
    once. Returns the arrays and whether the copies had finished when the host read them (GPU only)."""
    host = {"loss": loss.to("cpu", non_blocking=True), "logits": logits.to("cpu", non_blocking=True)}
    host.update({f"grad:{n}": g.to("cpu", non_blocking=True) for n, g in grads.items()})
    done = None
    if loss.is_cuda:
        ev = torch.cuda.Event()
        ev.record()
        if sync:
            torch.cuda.synchronize()
        done = bool(ev.query())
    return {k: v.double().numpy() for k, v in host.items()}, done  # .double() reads the host memory now


def errors(run: dict, ref: dict) -> dict:
    """Per tensor: max_rel and norm_rel against ref; plus the loss difference and summaries."""
    per = {k: {"max_rel": max_rel_err(run[k], ref[k]), "norm_rel": norm_rel_err(run[k], ref[k])} for k in ref}
    grads = [v for k, v in per.items() if k.startswith("grad:")]
    loss_ref = float(ref["loss"])
    return {
        "per_tensor": per,
        "loss": float(run["loss"]),
        "loss_abs_diff": abs(float(run["loss"]) - loss_ref),
        "loss_rel_err": abs(float(run["loss"]) - loss_ref) / abs(loss_ref),
        "logits_max_rel": per["logits"]["max_rel"],
        "logits_norm_rel": per["logits"]["norm_rel"],
        "grad_max_rel_worst": max(g["max_rel"] for g in grads),
        "grad_norm_rel_worst": max(g["norm_rel"] for g in grads),
        "grad_max_rel_median": statistics.median(g["max_rel"] for g in grads),
        "worst_max_rel": max(v["max_rel"] for v in per.values()),
    }


def cuda_ms(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


# --------------------------------------------------------------------------------------------------
# Parts


def part_precision(p: dict, gpu: bool, state: dict) -> dict:
    base = make_model(p)  # fp32 weights, made once
    tokens, targets = make_batch(p, 0)
    modes = {"cpu_fp64": ("cpu", torch.float64, False, False), "cpu_fp32": ("cpu", torch.float32, False, False)}
    if gpu:
        modes.update({"gpu_fp64": ("cuda", torch.float64, False, False),
                      "gpu_fp32": ("cuda", torch.float32, False, False),
                      "gpu_tf32": ("cuda", torch.float32, True, False),
                      "gpu_bf16_autocast": ("cuda", torch.float32, False, True)})
    results, step_s, timing, flags = {}, {}, {}, {}
    for name, (dev, dtype, tf32, bf16) in modes.items():
        log(f"precision: {name}")
        if dev == "cuda":
            set_tf32(tf32)
            flags[name] = {"matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                           "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}
        model = make_model(p).to(dtype)
        model.load_state_dict({k: v.to(dtype) for k, v in base.state_dict().items()})
        model.to(dev)
        tk, tg = tokens.to(dev), targets.to(dev)
        t = time.perf_counter()
        out = run_step(model, tk, tg, bf16)
        host = to_host(*out)
        step_s[name] = time.perf_counter() - t
        results[name] = host
        if dev == "cuda":
            timing[name] = statistics.median(cuda_ms(lambda: run_step(model, tk, tg, bf16), p["timing_iters"]))
            if name == "gpu_fp32":
                state["gpu_fp32_model"] = model
            else:
                del model
        set_tf32(False)
    ref = results["cpu_fp64"]
    state.update(ref=ref, base=base, tokens=tokens, targets=targets, results=results)
    table = {name: errors(run, ref) for name, run in results.items() if name != "cpu_fp64"}
    return {
        "modes": {k: {"device": v[0], "param_dtype": str(v[1]).replace("torch.", ""), "tf32": v[2],
                      "bf16_autocast": v[3]} for k, v in modes.items()},
        "metric": "max_rel = max|x - ref| / max|ref| per tensor; norm_rel = ||x - ref||_2 / ||ref||_2; "
                  "ref = CPU fp64 of the same fp32 weights and tokens",
        "reference_loss": float(ref["loss"]),
        "tensors": list(ref),
        "errors": table,
        "first_step_wall_s": step_s,
        "gpu_step_ms_median": timing,
        "tf32_flags": flags,
        "cpu_threads": torch.get_num_threads(),
    }


def part_planted_bug(p: dict, gpu: bool, state: dict) -> dict:
    ref = state["ref"]
    out = {"what": "device-to-host copies with non_blocking=True read before synchronizing (bug) vs "
                   "the same code with torch.cuda.synchronize() before the read (fixed)"}
    # on the CPU the same code is exact: non_blocking means nothing there
    cpu_model = make_model(p)
    cpu_model.load_state_dict(state["base"].state_dict())
    res = run_step(cpu_model, state["tokens"], state["targets"])
    buggy_cpu, _ = gather_non_blocking(*res, sync=False)
    blocking_cpu = to_host(*res)
    out["cpu"] = {"bitwise_equal_to_blocking": all(bitwise_equal(buggy_cpu[k], blocking_cpu[k]) for k in ref),
                  "vs_fp64": errors(buggy_cpu, ref)}
    if not gpu:
        return out
    model = state["gpu_fp32_model"]
    set_tf32(False)
    trials = []
    for trial in range(p["bug_trials"]):
        tokens, targets = (state["tokens"], state["targets"]) if trial == 0 else make_batch(p, trial)
        tk, tg = tokens.cuda(), targets.cuda()
        torch.cuda.synchronize()
        buggy, done_b = gather_non_blocking(*run_step(model, tk, tg), sync=False)
        fixed, done_f = gather_non_blocking(*run_step(model, tk, tg), sync=True)
        row = {"trial": trial, "batch": "the step of part 1" if trial == 0 else f"new batch (seed {trial})",
               "copies_done_when_read": {"bug": done_b, "fixed": done_f},
               "bug_vs_fixed": {k: v for k, v in errors(buggy, fixed).items() if k != "per_tensor"},
               "tensors_wrong": sum(not bitwise_equal(buggy[k], fixed[k]) for k in fixed),
               "tensors": len(fixed),
               "elements_wrong_fraction": float(sum(int((buggy[k] != fixed[k]).sum()) for k in fixed)
                                                / sum(fixed[k].size for k in fixed))}
        if trial == 0:
            row["bug_vs_fp64"] = errors(buggy, ref)
            row["fixed_vs_fp64"] = {k: v for k, v in errors(fixed, ref).items() if k != "per_tensor"}
            row["fixed_equals_part1_gpu_fp32"] = all(bitwise_equal(fixed[k], state["results"]["gpu_fp32"][k])
                                                     for k in fixed)
        trials.append(row)
        log(f"planted bug trial {trial}: bug vs fixed worst max_rel {row['bug_vs_fixed']['worst_max_rel']:.3g}, "
            f"copies done when read: {done_b}")
    out["gpu_trials"] = trials
    return out


def atomics_case(kind: str, p: dict):
    g = torch.Generator(device="cuda").manual_seed(7)
    rows, cols, out_rows = p["atomic_rows"], p["atomic_cols"], p["atomic_out_rows"]
    src = torch.randn(rows, cols, device="cuda", generator=g)
    idx = torch.randint(0, out_rows, (rows,), device="cuda", generator=g)
    if kind == "index_add_":
        def fn(x=src):
            return torch.zeros(out_rows, cols, device="cuda", dtype=x.dtype).index_add_(0, idx, x)
    else:
        idx2 = idx[:, None].expand(rows, cols)

        def fn(x=src):
            return torch.zeros(out_rows, cols, device="cuda", dtype=x.dtype).scatter_add_(0, idx2, x)
    return fn, src


def part_determinism(p: dict, gpu: bool, state: dict) -> dict:
    if not gpu:
        return {"skipped": "no CUDA device"}
    out = {"cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"), "ops": {}}
    set_tf32(False)
    for kind in ("index_add_", "scatter_add_"):
        log(f"determinism: {kind}")
        fn, src = atomics_case(kind, p)
        ref64 = fn(src.double()).cpu().numpy()
        row = {"shape_in": list(src.shape), "out_rows": p["atomic_out_rows"],
               "mean_adds_per_output": p["atomic_rows"] / p["atomic_out_rows"]}
        for mode in ("default", "deterministic"):
            try:
                torch.use_deterministic_algorithms(mode == "deterministic")
                a, b = fn().cpu().numpy(), fn().cpu().numpy()
                fn()
                times = cuda_ms(fn, p["timing_iters"])
                row[mode] = {"bitwise_equal": bitwise_equal(a, b), "max_abs_diff": max_abs_diff(a, b),
                             "max_rel_diff": max_rel_err(a, b),
                             "elements_differ_fraction": float((a != b).mean()),
                             "vs_fp64_max_rel": max_rel_err(a, ref64), "vs_fp64_norm_rel": norm_rel_err(a, ref64),
                             "ms_median": statistics.median(times), "ms": times}
                row[mode + "_result"] = a
            except Exception as exc:  # noqa: BLE001
                row[mode] = failure(exc)
            finally:
                torch.use_deterministic_algorithms(False)
        if "default_result" in row and "deterministic_result" in row:
            row["default_vs_deterministic_max_rel"] = max_rel_err(row["default_result"], row["deterministic_result"])
            d, n = row["deterministic"], row["default"]
            row["deterministic_slowdown"] = d["ms_median"] / n["ms_median"]
        row.pop("default_result", None)
        row.pop("deterministic_result", None)
        out["ops"][kind] = row
    # the whole model's gradients, twice per mode
    model = state.get("gpu_fp32_model")
    if model is not None and time.monotonic() - T0 > p["budget_s"] - 4:
        out["model_step"] = {"skipped": "over the time budget"}
    elif model is not None:
        tk, tg = state["tokens"].cuda(), state["targets"].cuda()
        step = {}
        for mode in ("default", "deterministic"):
            log(f"determinism: model step, {mode}")
            try:
                torch.use_deterministic_algorithms(mode == "deterministic")
                a = to_host(*run_step(model, tk, tg))
                b = to_host(*run_step(model, tk, tg))
                differ = [k for k in a if not bitwise_equal(a[k], b[k])]
                step[mode] = {"bitwise_equal": not differ, "tensors_differ": differ,
                              "worst_max_rel_diff": max(max_rel_err(a[k], b[k]) for k in a),
                              "ms_median": statistics.median(cuda_ms(lambda: run_step(model, tk, tg),
                                                                     p["timing_iters"]))}
            except Exception as exc:  # noqa: BLE001
                step[mode] = failure(exc)
            finally:
                torch.use_deterministic_algorithms(False)
        out["model_step"] = step
    return out


# --------------------------------------------------------------------------------------------------


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           "numpy": np.__version__, "machine": platform.machine(),
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "cpu_threads": torch.get_num_threads()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                env["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
        try:
            import pynvml

            pynvml.nvmlInit()
            d = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = d.decode() if isinstance(d, bytes) else d
        except Exception as exc:  # noqa: BLE001
            env["driver"] = f"unknown ({type(exc).__name__})"
    return env


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if np.isfinite(x) else str(x)
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for h200_lesson12.json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes; the CPU parts only when there is no GPU")
    ap.add_argument("--budget-s", type=float, default=36.0, help="stop starting parts after this (default 36)")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu and not args.smoke:
        print("record_lesson12_h200: no CUDA device; run it on the H200 (or use --smoke)", file=sys.stderr)
        return 2
    if args.smoke:
        p = dict(layers=1, d=32, heads=2, vocab=64, seq=16, batch=2, timing_iters=3, bug_trials=2,
                 atomic_rows=4096, atomic_cols=8, atomic_out_rows=64)
    else:
        p = dict(layers=2, d=512, heads=8, vocab=2048, seq=256, batch=16, timing_iters=10, bug_trials=3,
                 atomic_rows=1 << 20, atomic_cols=64, atomic_out_rows=1024)
    p["budget_s"] = args.budget_s
    set_tf32(False)
    record = {"what": "lesson 12: one training step in CPU fp64/fp32 and GPU fp64/fp32/TF32/bf16 against CPU "
                      "fp64; a planted non_blocking-copy bug; deterministic algorithms",
              "command": "python benchmarks/record_lesson12_h200.py" + (" --smoke" if args.smoke else ""),
              "smoke": args.smoke, "params": p, "env": environment(), "unit_roundoff": UNIT_ROUNDOFF,
              "budget_s": args.budget_s, "parts": {}, "skipped_parts": []}
    log(f"start on {record['env'].get('gpu', 'CPU')}")
    state: dict = {}
    for name, fn in (("precision", part_precision), ("planted_bug", part_planted_bug),
                     ("determinism", part_determinism)):
        if time.monotonic() - T0 > args.budget_s:
            record["skipped_parts"].append(name)
            log(f"{name}: skipped (over the {args.budget_s} s budget)")
            continue
        t = time.monotonic()
        try:
            record["parts"][name] = fn(p, gpu, state)
        except Exception as exc:  # noqa: BLE001
            record["parts"][name] = failure(exc)
            log(f"{name} FAILED: {exc}")
        record["parts"].setdefault(name, {})["seconds"] = time.monotonic() - t
    record["total_s"] = time.monotonic() - T0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "h200_lesson12.json"
    path.write_text(json.dumps(jsonable(record), indent=1) + "\n")
    log(f"wrote h200_lesson12.json in {record['total_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
