"""Record lesson 11 on a GPU: one training step unprofiled, lightly and fully profiled, and the ladder
fp32 -> TF32 -> bf16 autocast -> torch.compile -> CUDA graph.

Run on the H200 from the repository root (about 100 s; ``--budget`` seconds, 130 by default, plus the diagnoses)::

    python benchmarks/record_lesson11_h200.py --out OUTDIR
    python benchmarks/record_lesson11_h200.py --out /tmp/smoke --smoke     # CPU, tiny sizes: code paths only

The step: the shared transformer of :mod:`workbench.capture.models` (``LM(layers=4, d=1024, heads=16,
vocab=2048, max_seq=512)``), batch 4 x 512 tokens, cross-entropy, ``AdamW(fused=True, capturable=True)``
(the same optimizer on every rung, so that the last rung can capture it). Rungs, each on top of the last:

- ``fp32``: fp32 matmuls without TF32 (``allow_tf32 = False``);
- ``tf32``: TF32 allowed for matmuls and cuDNN;
- ``bf16``: ``torch.autocast("cuda", torch.bfloat16)`` around the forward and the loss;
- ``compile``: the forward + loss function ``torch.compile``'d (default mode), compiled once; the backward is
  the compiled backward AOTAutograd made, the optimizer step stays eager (fused: a few launches);
- ``graph``: the whole ``compile`` step (forward, backward, optimizer step) captured once in one
  ``torch.cuda.CUDAGraph`` on static inputs and replayed. If the compiled step cannot be captured, the
  eager bf16 step is captured instead and ``graph_of`` says so.

Per rung: the step time without the profiler (CUDA events, one before each step, no synchronise between
steps: median, p10 and p90 of ``--steps`` steps after warm-up; :func:`record_diagnosis_h200.time_steps`),
the same step timed with a device synchronise after each step (what the profiler's steps are compared
with), and a light trace of 3 steps written by :func:`workbench.capture.profiler.profile_steps` (which
stamps its own unprofiled step time into the trace). The ``fp32`` and ``bf16`` rungs also get a full-detail
trace (shapes, memory, Python stacks). Each trace's diagnosis (:func:`workbench.analysis.trace.diagnosis.diagnose`)
is stored too, so the notebook's offline diagnosis can be compared with the one made where it was
recorded.

Output: ``OUTDIR/h200_lesson11.json`` and ``OUTDIR/lesson11_<rung>.<detail>.trace.json.gz`` (local paths
stripped; each trace must stay under 1.5 MB: a full trace over it is recorded again with fewer steps).
Every part catches its own exception into the JSON; the JSON is rewritten after each part.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from record_diagnosis_h200 import _strip_obj, env_info, strip_paths, time_steps  # noqa: E402

RUNGS = ["fp32", "tf32", "bf16", "compile", "graph"]
FULL_RUNGS = ["fp32", "bf16"]
MAX_TRACE_BYTES = 1_500_000
_COMPILED: dict = {}  # the compile rung's step, reused by the graph rung (one compile in all)
SIZES = {"layers": 4, "d": 1024, "heads": 16, "vocab": 2048, "seq": 512, "batch": 4}
SMOKE_SIZES = {"layers": 2, "d": 64, "heads": 4, "vocab": 128, "seq": 32, "batch": 2}


def log(msg: str) -> None:
    print(f"[lesson11 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ensure_tqdm() -> None:
    """profile_steps shows a tqdm bar; if tqdm is missing, a silent stand-in (the bar is off anyway)."""
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        import types

        class _Bar:
            def __init__(self, *a, **k):
                pass

            def update(self, *a):
                pass

            def close(self):
                pass

        mod, auto = types.ModuleType("tqdm"), types.ModuleType("tqdm.auto")
        auto.tqdm = _Bar
        mod.auto = auto
        sys.modules["tqdm"], sys.modules["tqdm.auto"] = mod, auto


# ------------------------------------------------------------------------------------------- timing
def _sync(dev: str) -> None:
    import torch

    if dev == "cuda":
        torch.cuda.synchronize()


def time_pipelined(step, dev: str, n: int, warm: int) -> dict:
    """Steps back to back, no synchronise between them: CUDA events on the GPU (the shared helper),
    perf_counter per step on the CPU (smoke runs)."""
    if dev == "cuda":
        return time_steps(step, n=n, warm=warm)
    for _ in range(warm):
        step()
    d = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        d.append((time.perf_counter() - t) * 1e3)
    d.sort()
    return {"median_ms": statistics.median(d), "mean_ms": sum(d) / n, "p10_ms": d[n // 10],
            "p90_ms": d[(9 * n) // 10], "wall_ms_per_step": sum(d) / n, "steps": n}


def time_synced(step, dev: str, n: int) -> dict:
    """Each step ended by a device synchronise, wall clock (how profile_steps times a step)."""
    step()
    _sync(dev)
    d = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        _sync(dev)
        d.append((time.perf_counter() - t) * 1e3)
    d.sort()
    return {"median_ms": statistics.median(d), "p10_ms": d[n // 10], "p90_ms": d[(9 * n) // 10], "steps": n}


# ------------------------------------------------------------------------------------------- the step
def build(sizes: dict, dev: str):
    import torch

    from workbench.capture.models import LM

    torch.manual_seed(0)
    model = LM(layers=sizes["layers"], d=sizes["d"], heads=sizes["heads"], vocab=sizes["vocab"],
               max_seq=sizes["seq"]).to(dev)
    fused = dev == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, capturable=fused)
    g = torch.Generator(device=dev).manual_seed(0)
    idx = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["seq"]), device=dev, generator=g)
    tgt = torch.roll(idx, -1, 1)
    return model, opt, idx, tgt


def set_precision(rung: str) -> None:
    import torch

    tf32 = rung != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def make_step(rung: str, sizes: dict, dev: str, info: dict):
    """The step function of a rung (and, for compile, the compile time in ``info``)."""
    import torch
    import torch.nn.functional as F

    set_precision(rung)
    model, opt, idx, tgt = build(sizes, dev)
    bf16 = rung in ("bf16", "compile", "graph")
    vocab = sizes["vocab"]

    def fwd_loss(idx, tgt):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            logits = model(idx)
        return F.cross_entropy(logits.float().view(-1, vocab), tgt.view(-1))

    fwd = torch.compile(fwd_loss) if rung in ("compile", "graph") else fwd_loss

    def step():
        loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if rung in ("compile", "graph"):
        t = time.perf_counter()
        for _ in range(3):
            step()
        _sync(dev)
        info["compile_s"] = round(time.perf_counter() - t, 2)
        log(f"compiled in {info['compile_s']} s")
    if rung == "compile":
        _COMPILED.update(step=step, opt=opt, fwd=fwd, idx=idx, tgt=tgt)
    if rung != "graph":
        return step
    return capture(step, opt, fwd, idx, tgt, info)


def capture(step, opt, fwd, idx, tgt, info):
    """The whole step (forward + backward + capturable AdamW) in one CUDA graph, as the PyTorch CUDA-graph
    notes' whole-network recipe does: warm up on a side stream, grads set to None before the capture so
    that the backward allocates them from the graph's pool, then replay."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    t = time.perf_counter()
    with torch.cuda.graph(g):
        loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    info["capture_s"] = round(time.perf_counter() - t, 3)
    g.replay()  # capturing runs nothing: the loss is real only after a replay
    torch.cuda.synchronize()
    info["replayed_loss"] = float(loss.item())

    def replay():
        g.replay()

    replay.graph = g  # keep it alive
    replay.static_loss = loss
    return replay


# ------------------------------------------------------------------------------------------- traces
def write_trace(step, rung: str, detail: str, out: Path, dev: str, steps: int = 3) -> dict:
    from workbench.capture.profiler import profile_steps

    path = out / f"lesson11_{rung}.{detail}.trace.json.gz"
    while True:
        res = profile_steps(step, steps=steps, wait=1, warmup=1, detail=detail, path=str(path), device=dev,
                            verbose=False, progress=False)
        with gzip.open(path, "rt") as f:
            text = f.read()
        stamped = json.loads(text).get("workbench_unprofiled_step_ms")
        text = strip_paths(text)
        with gzip.open(path, "wt", compresslevel=9) as f:
            f.write(text)
        size = path.stat().st_size
        if size <= MAX_TRACE_BYTES or steps == 1:
            break
        log(f"{path.name}: {size} bytes with {steps} steps; again with {steps - 1}")
        steps -= 1
    return {"file": path.name, "detail": detail, "steps": res.steps, "bytes": size,
            "profiled_step_ms": [round(x, 4) for x in res.step_ms],
            "profiled_step_ms_median": round(statistics.median(res.step_ms), 4),
            "stamped_unprofiled_step_ms": stamped, "session_wall_s": round(res.wall_s, 2),
            "too_big": size > MAX_TRACE_BYTES}


def diagnose_file(path: Path) -> dict:
    from workbench.analysis.trace.diagnosis import diagnose
    from workbench.io import load_trace

    d = diagnose(load_trace(path))
    return d.as_dict() if d is not None else {"error": "no GPU activity in the trace"}


# ------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks the code paths")
    ap.add_argument("--budget", type=float, default=130.0, help="seconds; parts not started in time are skipped")
    ap.add_argument("--steps", type=int, default=40, help="unprofiled steps timed per rung")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _ensure_tqdm()
    import torch

    dev = "cpu" if args.smoke else "cuda"
    sizes = SMOKE_SIZES if args.smoke else SIZES
    n = 10 if args.smoke else args.steps
    warm = 2 if args.smoke else 10
    rec: dict = {"lesson": 11, "smoke": args.smoke, "device": dev, "sizes": sizes, "rungs": RUNGS,
                 "timing": {"pipelined": f"{n} steps after {warm} warm-up, no synchronise between steps; "
                                         + ("CUDA events before each step" if dev == "cuda" else "perf_counter"),
                            "synced": "20 steps, each ended by a device synchronise, perf_counter"},
                 "optimizer": "AdamW(lr=1e-4, fused=True, capturable=True)" if dev == "cuda" else "AdamW(lr=1e-4)",
                 "ladder": {}, "errors": {}, "skipped": {}}
    try:
        rec["env"] = env_info() if dev == "cuda" else {"torch": torch.__version__, "device": "cpu (smoke)"}
        rec["env"]["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:
        rec["errors"]["env"] = repr(exc)
    json_path = out / "h200_lesson11.json"

    def save():
        rec["elapsed_s"] = round(time.perf_counter() - t0, 1)
        json_path.write_text(json.dumps(_strip_obj(rec), indent=1, sort_keys=True) + "\n")

    # a compile needs tens of seconds: the compile rung starts only with this much budget left
    need = {"fp32": 8, "tf32": 6, "bf16": 8, "compile": 60, "graph": 15}
    traces = []
    for rung in RUNGS:
        left = args.budget - (time.perf_counter() - t0)
        if left < need[rung]:
            rec["skipped"][rung] = f"{left:.0f} s of budget left, needs about {need[rung]} s"
            log(f"skip {rung}: {rec['skipped'][rung]}")
            save()
            continue
        if rung == "graph" and dev != "cuda":
            rec["skipped"][rung] = "CUDA graphs need a CUDA device"
            save()
            continue
        log(f"rung {rung}")
        r: dict = {}
        rec["ladder"][rung] = r
        try:
            info: dict = {}
            try:
                if rung == "graph" and _COMPILED:
                    c = _COMPILED
                    step = capture(c["step"], c["opt"], c["fwd"], c["idx"], c["tgt"], info)
                    info["reused_compile_rung"] = True
                else:
                    step = make_step(rung, sizes, dev, info)
                if rung == "graph":
                    info["graph_of"] = "compile step (forward+loss compiled, backward, fused capturable AdamW)"
            except Exception as exc:
                if rung != "graph":
                    raise
                info["graph_compiled_error"] = repr(exc)[:2000]
                log(f"capturing the compiled step failed ({exc!r}); capturing the eager bf16 step")
                torch.cuda.synchronize()
                model_info: dict = {}
                # the eager bf16 step rebuilt and captured the same way
                set_precision("bf16")
                model, opt, idx, tgt = build(sizes, dev)
                import torch.nn.functional as F

                def fwd_loss(idx, tgt):
                    with torch.autocast(dev, dtype=torch.bfloat16):
                        logits = model(idx)
                    return F.cross_entropy(logits.float().view(-1, sizes["vocab"]), tgt.view(-1))

                def eager(fwd=fwd_loss):
                    loss = fwd(idx, tgt)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                step = capture(eager, opt, fwd_loss, idx, tgt, model_info)
                info.update(model_info)
                info["graph_of"] = "eager bf16 step (forward, backward, fused capturable AdamW)"
            r.update(info)
            r["unprofiled"] = time_pipelined(step, dev, n, warm)
            r["unprofiled_synced"] = time_synced(step, dev, 20 if not args.smoke else 5)
            log(f"{rung}: {r['unprofiled']['median_ms']:.3f} ms (synced {r['unprofiled_synced']['median_ms']:.3f})")
            save()
            details = ["light"] + (["full"] if rung in FULL_RUNGS else [])
            r["traces"] = {}
            for detail in details:
                try:
                    tr = write_trace(step, rung, detail, out, dev)
                    r["traces"][detail] = tr
                    traces.append((rung, detail, out / tr["file"]))
                    log(f"{rung} {detail}: {tr['profiled_step_ms_median']:.3f} ms profiled, {tr['bytes']} bytes")
                except Exception as exc:
                    rec["errors"][f"{rung}.{detail}"] = traceback.format_exc()[-3000:]
                    log(f"{rung} {detail} failed: {exc!r}")
                save()
            del step
            if dev == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        except Exception as exc:
            rec["errors"][rung] = traceback.format_exc()[-3000:]
            log(f"{rung} failed: {exc!r}")
        save()

    # the diagnosis of each trace where it was recorded (the notebook makes it again offline)
    for rung, detail, path in traces:
        if args.budget + 10 - (time.perf_counter() - t0) < 2:
            rec["skipped"][f"diagnosis.{rung}.{detail}"] = "out of budget"
            continue
        try:
            rec["ladder"][rung]["traces"][detail]["diagnosis"] = diagnose_file(path)
        except Exception as exc:
            rec["errors"][f"diagnosis.{rung}.{detail}"] = traceback.format_exc()[-3000:]
            log(f"diagnosis {rung} {detail} failed: {exc!r}")
    save()
    total = sum(p.stat().st_size for _, _, p in traces)
    log(f"done in {time.perf_counter() - t0:.0f} s; {len(traces)} traces, {total} bytes; errors: {list(rec['errors'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
