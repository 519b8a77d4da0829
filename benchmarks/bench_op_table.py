"""Op table from a profile: torch's own ``key_averages()`` against workbench ``load_trace`` + ``op_summary``.

Both sides work on the same profile. A child process records a training loop with torch.profiler
(record_shapes, one warm-up step outside the profiler, then ``schedule(wait=1, warmup=1, active=steps)``), exports it with ``prof.export_chrome_trace``
(which does not touch torch's Python-side event list), then times torch's FIRST ``key_averages()`` call on
it: that call parses the profiler's results into FunctionEvents, builds their tree and aggregates (later
calls reuse the parsed events; the child times one repeat call too, to show the split). Then a fresh
process times workbench reading the exported file and building the table: ``load_trace(file)`` +
``op_summary(trace)`` (imports excluded, reported apart). The ``shape`` mode does the same with
``key_averages(group_by_input_shape=True)`` as the first call against ``op_summary(by_shape=True)``, on
its own recording.

The tables are compared key by key (op name, plus input shapes in ``shape`` mode; torch rows on the CPU
device summed per key, ProfilerStep rows left out as op_summary leaves them to step_summary): op counts must
be equal, CPU total and self CPU time within ``max(1%, 2 us)`` per key. Runtime calls (cudaLaunchKernel...)
are rows in torch's table but not in the op table; they are counted as "torch only" names. With
``--with-stack`` torch also puts Python functions in its tree, so an annotation around Python code
(``Optimizer.step#...``) has less self time in torch's table than in ours: expect that key to differ.

    OMP_NUM_THREADS=1 python benchmarks/bench_op_table.py                 # CPU: ~150k-event profile
    python benchmarks/bench_op_table.py --device cuda                     # GPU: 3 steps, d=512 x 6 layers
    python benchmarks/bench_op_table.py --runs 3 --json op_table.json

Progress goes to stderr; Ctrl-C stops the children and exits 130.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("name", "shape")
STEP_RE = re.compile(r"^ProfilerStep(?:#\d+|\*)$")  # torch groups the steps as "ProfilerStep*"
REL_TOL, ABS_TOL_US = 0.01, 2.0

# Defaults per device: (d_model, layers, batch, seq, steps). CPU: a tiny-width, 6-layer transformer for
# 25 steps gives ~146k trace events (~57 MB of JSON) with little compute. CUDA: the shipped H200 sample's
# model (d=512, 6 layers, batch 16x256) over 3 steps.
DEFAULTS = {"cpu": (64, 6, 4, 16, 25), "cuda": (512, 6, 16, 256, 3)}

def _peak_mib() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child
    would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------------- torch child


def torch_child(args) -> None:
    """Record, export, time the first key_averages call; write timings and the table as JSON."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    device = args.device
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    d, layers, batch, seq, steps = args.d_model, args.layers, args.batch, args.seq, args.steps
    layer = torch.nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=4 * d, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, d, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up outside the profiler (a cold first step under with_stack can crash post-processing)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=acts, record_shapes=True, with_stack=args.with_stack,
                 schedule=schedule(wait=1, warmup=1, active=steps, repeat=1)) as prof:
        for _ in range(steps + 2):
            step()
            prof.step()
    t1 = time.perf_counter()
    prof.export_chrome_trace(args.trace)
    t2 = time.perf_counter()
    rss0 = _peak_mib()
    shape = args.mode == "shape"
    avg = prof.key_averages(group_by_input_shape=shape)  # the first call: parse + tree + aggregate
    t3 = time.perf_counter()
    rss1 = _peak_mib()
    prof.key_averages(group_by_input_shape=shape)  # a repeat: aggregation only
    t4 = time.perf_counter()

    rows = []
    for e in avg:
        if "CPU" not in str(e.device_type):
            continue
        dev_self = getattr(e, "self_device_time_total", None)
        if dev_self is None:
            dev_self = getattr(e, "self_cuda_time_total", 0.0)
        rows.append(
            {
                "name": e.key,
                "input_shapes": str(e.input_shapes) if shape else "",
                "count": int(e.count),
                "cpu_total_us": float(e.cpu_time_total),
                "cpu_self_us": float(e.self_cpu_time_total),
                "device_self_us": float(dev_self or 0.0),
            }
        )
    out = {
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "record_s": t1 - t0,
        "export_s": t2 - t1,
        "first_call_s": t3 - t2,
        "repeat_call_s": t4 - t3,
        "first_call_peak_growth_mib": rss1 - rss0,
        "function_events": len(prof.events()),
        "rows": rows,
    }
    Path(args.result).write_text(json.dumps(out))


# ------------------------------------------------------------------------------- workbench child


def workbench_child(args) -> None:
    t0 = time.perf_counter()
    from workbench.analysis import op_summary
    from workbench.io import load_trace

    t1 = time.perf_counter()
    rss0 = _peak_mib()
    trace = load_trace(args.trace)
    t2 = time.perf_counter()
    table = op_summary(trace, by_shape=args.mode == "shape")
    t3 = time.perf_counter()
    rss1 = _peak_mib()
    Path(args.result).write_text(
        json.dumps(
            {"import_s": t1 - t0, "load_s": t2 - t1, "table_s": t3 - t2, "work_s": t3 - t1,
             "peak_growth_mib": rss1 - rss0, "trace_events": trace.n_events,
             "x_events": len(trace.events), "rows": len(table)}
        )
    )


# ------------------------------------------------------------------------------------ comparison


def _shape_key(text: str) -> str:
    """torch's str(list) and our compact JSON spell the same shapes differently: one spelling. An op
    without recorded shapes is "[]" in torch's table and "" in ours."""
    if not text:
        return "[]"
    try:
        return json.dumps(ast.literal_eval(text), separators=(",", ":"))
    except (ValueError, SyntaxError):
        try:
            return json.dumps(json.loads(text), separators=(",", ":"))
        except ValueError:
            return text


def compare(torch_rows: list[dict], trace_path: str, mode: str) -> dict:
    """Per key: counts equal, CPU total and self within max(REL_TOL, ABS_TOL_US). Returns a summary."""
    import pandas as pd

    from workbench.analysis import op_summary
    from workbench.io import load_trace

    ours = op_summary(load_trace(trace_path), by_shape=mode == "shape")
    keys = ["name"] + (["input_shapes"] if mode == "shape" else [])
    theirs = pd.DataFrame(torch_rows)
    theirs = theirs[~theirs["name"].str.match(STEP_RE)]
    if mode == "shape":
        theirs["input_shapes"] = theirs["input_shapes"].map(_shape_key)
        ours["input_shapes"] = ours["input_shapes"].map(_shape_key)
    cols = ["count", "cpu_total_us", "cpu_self_us", "device_self_us"]
    theirs = theirs.groupby(keys)[cols].sum()
    ours = ours.groupby(keys)[cols].sum()
    both = theirs.add_suffix("_torch").join(ours.add_suffix("_wb"), how="inner")
    only_torch = sorted({k if isinstance(k, str) else k[0] for k in theirs.index.difference(ours.index)})
    only_ours = sorted({k if isinstance(k, str) else k[0] for k in ours.index.difference(theirs.index)})

    def off(col):
        a, b = both[f"{col}_wb"], both[f"{col}_torch"]
        return (a - b).abs() > (REL_TOL * b.abs()).clip(lower=ABS_TOL_US)

    bad_count = int((both["count_wb"] != both["count_torch"]).sum())
    bad_total, bad_self = int(off("cpu_total_us").sum()), int(off("cpu_self_us").sum())
    rel_self = ((both["cpu_self_us_wb"] - both["cpu_self_us_torch"]).abs()
                / both["cpu_self_us_torch"].abs().clip(lower=ABS_TOL_US))
    return {
        "keys_compared": len(both),
        "keys_torch": len(theirs),
        "keys_workbench": len(ours),
        "count_mismatches": bad_count,
        "cpu_total_out_of_tol": bad_total,
        "cpu_self_out_of_tol": bad_self,
        "max_self_rel_diff": float(rel_self.max()) if len(rel_self) else 0.0,
        "self_cpu_sum_torch_us": float(both["cpu_self_us_torch"].sum()),
        "self_cpu_sum_workbench_us": float(both["cpu_self_us_wb"].sum()),
        "device_self_sum_torch_us": float(both["device_self_us_torch"].sum()),
        "device_self_sum_workbench_us": float(both["device_self_us_wb"].sum()),
        "names_only_in_torch": only_torch,
        "names_only_in_workbench": only_ours,
        "agree": bad_count == 0 and bad_total == 0 and bad_self == 0 and not only_ours,
    }


# ------------------------------------------------------------------------------------------ parent


def _child(role: str, args, mode: str, trace: Path, result: Path) -> dict:
    cmd = [sys.executable, __file__, "--_child", role, "--device", args.device, "--mode", mode,
           "--trace", str(trace), "--result", str(result), "--d-model", str(args.d_model),
           "--layers", str(args.layers), "--batch", str(args.batch), "--seq", str(args.seq),
           "--steps", str(args.steps)] + (["--with-stack"] if args.with_stack else [])
    env = dict(os.environ, KINETO_LOG_LEVEL="6", TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{role} child failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def _med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--runs", type=int, default=2, help="recordings per mode (each re-records the profile)")
    p.add_argument("--modes", default="name,shape", help="name, shape or both (comma-separated)")
    p.add_argument("--d-model", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--seq", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--with-stack", action="store_true", help="also record Python stacks (bigger trace)")
    p.add_argument("--keep", type=Path, help="keep the exported traces in this folder")
    p.add_argument("--json", type=Path, help="write every measurement here")
    p.add_argument("--_child", choices=("torch", "workbench"), help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="name", help=argparse.SUPPRESS)
    p.add_argument("--trace", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for k, v in zip(("d_model", "layers", "batch", "seq", "steps"), DEFAULTS[args.device]):
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args._child == "torch":
        torch_child(args)
        return 0
    if args._child == "workbench":
        workbench_child(args)
        return 0

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        p.error(f"--modes takes {', '.join(MODES)}")
    print(f"{args.device}: transformer d={args.d_model} x {args.layers} layers, batch {args.batch}x{args.seq}, "
          f"{args.steps} profiled steps, record_shapes{', with_stack' if args.with_stack else ''}; "
          f"{args.runs} run(s) per mode, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1 (set here)')}",
          file=sys.stderr)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        with tempfile.TemporaryDirectory(prefix="bench_op_table_") as tmp:
            folder = args.keep or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            for run in range(args.runs):
                for mode in modes:
                    trace = folder / f"profile_{args.device}_{mode}_{run}.trace.json"
                    tag = f"[run {run + 1}/{args.runs}, {mode}]"
                    print(f"{tag} recording + torch key_averages first call ...", file=sys.stderr, flush=True)
                    t = _child("torch", args, mode, trace, Path(tmp) / f"torch_{mode}_{run}.json")
                    print(f"{tag} torch first call {t['first_call_s']:.2f} s; workbench load + op_summary ...",
                          file=sys.stderr, flush=True)
                    w = _child("workbench", args, mode, trace, Path(tmp) / f"wb_{mode}_{run}.json")
                    c = compare(t.pop("rows"), str(trace), mode)
                    print(f"{tag} workbench {w['work_s']:.2f} s; tables agree: {c['agree']}", file=sys.stderr)
                    results[mode].append({"torch": t, "workbench": w, "compare": c,
                                          "trace_mb": trace.stat().st_size / 1e6})
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

    first = results[modes[0]][0]
    print(f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores; device: "
          f"{first['torch']['device_name']}; torch {first['torch']['torch']}; python {platform.python_version()}")
    print(f"profile: {first['workbench']['trace_events']:,} trace events ({first['trace_mb']:.1f} MB JSON), "
          f"{first['torch']['function_events']:,} torch FunctionEvents\n")
    print("| mode | torch first key_averages s | torch repeat call s | workbench load + op_summary s "
          "(load / table) | speed-up | workbench import s | peak memory growth MiB torch / workbench | tables agree |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rs = results[mode]
        tf, tr = _med([r["torch"]["first_call_s"] for r in rs]), _med([r["torch"]["repeat_call_s"] for r in rs])
        ww = _med([r["workbench"]["work_s"] for r in rs])
        wl, wt = _med([r["workbench"]["load_s"] for r in rs]), _med([r["workbench"]["table_s"] for r in rs])
        wi = _med([r["workbench"]["import_s"] for r in rs])
        mt = _med([r["torch"]["first_call_peak_growth_mib"] for r in rs])
        mw = _med([r["workbench"]["peak_growth_mib"] for r in rs])
        label = "key_averages()" if mode == "name" else "key_averages(group_by_input_shape=True)"
        agree = all(r["compare"]["agree"] for r in rs)
        print(f"| {label} vs op_summary({'by_shape=True' if mode == 'shape' else ''}) | {tf:.2f} | {tr:.2f} | "
              f"{ww:.2f} ({wl:.2f} / {wt:.2f}) | {tf / ww:.1f}x | {wi:.2f} | {mt:.0f} / {mw:.0f} | {'yes' if agree else 'NO'} |")
    print()
    for mode in modes:
        c = results[mode][0]["compare"]
        print(f"{mode}: {c['keys_compared']} keys compared ({c['keys_torch']} torch, {c['keys_workbench']} workbench); "
              f"count mismatches {c['count_mismatches']}, cpu total / self out of max({REL_TOL:.0%}, {ABS_TOL_US:g} us): "
              f"{c['cpu_total_out_of_tol']} / {c['cpu_self_out_of_tol']}; max self rel diff {c['max_self_rel_diff']:.2e}; "
              f"self CPU sum torch {c['self_cpu_sum_torch_us'] / 1e3:,.1f} ms vs workbench "
              f"{c['self_cpu_sum_workbench_us'] / 1e3:,.1f} ms; device self sum torch "
              f"{c['device_self_sum_torch_us'] / 1e3:,.1f} ms vs {c['device_self_sum_workbench_us'] / 1e3:,.1f} ms; "
              f"only in torch: {len(c['names_only_in_torch'])} names {c['names_only_in_torch'][:6]}; "
              f"only in workbench: {c['names_only_in_workbench'][:6]}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                        indent=1))
    return 0 if all(r["compare"]["agree"] for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
