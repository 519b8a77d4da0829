"""Record the torch.compile pairs of docs/compile.md: each problem and its fix, timed without the profiler.

    python benchmarks/record_compile_pairs.py --backend aot_eager --device cpu   # -> tests/data/compile_pairs/aot_eager-cpu/
    python benchmarks/record_compile_pairs.py --backend inductor --device cpu    # --only auto: that pair only
    python benchmarks/record_compile_h200.py                                      # inductor on the GPU (same layout)

Four pairs, one folder per backend and device (``measured.json``'s ``recorded``: which run gave each):
* ``break``: a small MLP whose forward branches on ``.item()`` (a graph break) against the same forward with
  ``torch.where`` (one graph). ``break.pt.trace.json.gz`` and ``fixed.pt.trace.json.gz`` are
  ``profile_steps`` captures (the ``workbench_compile`` stamp inside); ``measured.json`` holds both steps
  timed warm and without the profiler, interleaved (median of ``--reps``).
* ``recompile``: one function called on inputs whose first dimension changes; ``dynamic=False`` recompiles
  for each new length, ``dynamic=True`` compiles once. Each sequence runs cold (``torch._dynamo.reset()``,
  inductor's caches off) under :class:`workbench.capture.compile.CompileRecorder` without the profiler:
  ``recompile.compile.json`` / ``dynamic.compile.json`` are the stamps, ``measured.json`` the totals.
  ``auto``: the same with torch's default ``dynamic=None`` against ``dynamic=True`` (:func:`_sequences`).
* ``payback``: the fixed step from cold, ``--cold-steps`` calls compiled and eager, totals in ``measured.json``
  (the ``compile_cost`` finding's compile time + steps x step against them).

Paths in the stored files are cut to file names. Tests: tests/test_compile_pairs.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")   # every compile is a real one

import torch  # noqa: E402

from workbench.capture.compile import CompileRecorder  # noqa: E402
from workbench.capture.profiler import profile_steps  # noqa: E402

_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[^\s\"':/\\]+)+/([^\s\"':/\\]+)")


def strip_paths(obj):
    """Absolute paths (``/a/b/c.py``) cut to their file name, in every string of ``obj``."""
    if isinstance(obj, str):
        return _PATH.sub(r"\1", obj)
    if isinstance(obj, list):
        return [strip_paths(x) for x in obj]
    if isinstance(obj, dict):
        return {k: strip_paths(v) for k, v in obj.items()}
    return obj


def _rewrite_trace(path: Path) -> None:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    if "workbench_compile" in doc:
        doc["workbench_compile"] = strip_paths(doc["workbench_compile"])
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))


class MLP(torch.nn.Module):
    def __init__(self, width: int, depth: int, fixed: bool):
        super().__init__()
        self.a = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                       for _ in range(depth)])
        self.b = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                                       for _ in range(depth)])
        self.fixed = fixed

    def forward(self, x):
        h = self.a(x)
        if self.fixed:
            h = torch.where(h.abs().amax() > 1e6, h.clamp(-1e6, 1e6), h)   # one graph
        elif h.abs().amax().item() > 1e6:                                 # graph break: .item() in a branch
            h = h.clamp(-1e6, 1e6)
        return self.b(h).sum()


def _sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn, device) -> float:
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3


PARTS = ("break", "payback", "recompile", "auto")


def record(backend: str, device: str, out: Path, reps: int, cold_steps: int, width: int, batch: int,
           cold_reps: int = 3, parts=PARTS) -> dict:
    """Record ``parts`` (all of :data:`PARTS` by default) into ``out``; with fewer, the keys of the others in an
    existing ``measured.json`` are kept and ``measured["recorded"]`` says which part came from which run."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = torch.randn(batch, width, device=device)
    models = {k: MLP(width, 3, fixed=(k == "fixed")).to(device).eval() for k in ("break", "fixed")}
    run = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if device.startswith("cuda"):
        run["gpu"] = torch.cuda.get_device_name()
    old = out / "measured.json"
    if set(parts) != set(PARTS) and old.is_file():
        measured = json.loads(old.read_text())
        earlier = {k: measured.get(k) for k in ("torch", "threads", "gpu") if k in measured}
        rec = measured.setdefault("recorded", {p: earlier for p in PARTS if p != "auto"})
    else:
        measured = {"backend": backend, "device": device, **{k: v for k, v in run.items() if k != "date"},
                    "reps": reps}
        rec = measured["recorded"] = {}
    rec.update({p: run for p in parts})

    if "break" in parts:
        # -- break / fixed: profiled captures, then both timed warm without the profiler, interleaved
        steps = {}
        for k, m in models.items():
            torch._dynamo.reset()
            steps[k] = torch.compile(m, backend=backend)
            with torch.no_grad():
                r = profile_steps(lambda f=steps[k]: f(x), steps=5, detail="standard", device=device,
                                  path=out / f"{k}.pt.trace.json.gz", progress=False, verbose=False)
            _rewrite_trace(r.path)
            print(f"{k}: {r}", file=sys.stderr)
        times = {k: [] for k in steps}
        with torch.no_grad():
            for k in steps:       # warm: both compiled and run since the reset above
                for _ in range(3):
                    _time(lambda: steps[k](x), device)
            for _ in range(reps):
                for k in steps:
                    times[k].append(_time(lambda: steps[k](x), device))
        measured["break_step_ms"] = statistics.median(times["break"])
        measured["fixed_step_ms"] = statistics.median(times["fixed"])

    if "payback" in parts:
        # -- payback: the fixed step from cold, compiled and eager
        totals = []
        for _ in range(cold_reps):
            torch._dynamo.reset()
            cold = torch.compile(models["fixed"], backend=backend)
            with torch.no_grad():
                t0 = time.perf_counter()
                for _ in range(cold_steps):
                    cold(x)
                _sync(device)
                totals.append((time.perf_counter() - t0) * 1e3)
        measured["cold_compiled_total_ms"] = statistics.median(totals)
        measured["cold_compiled_totals_ms"] = totals
        with torch.no_grad():
            eager = [_time(lambda: models["fixed"](x), device) for _ in range(cold_steps)]
        measured["cold_steps"] = cold_steps
        measured["eager_total_ms"] = float(sum(eager))
        measured["eager_step_ms"] = statistics.median(eager)

    if "recompile" in parts:
        # -- recompile: lengths that change every call, static against dynamic, each from cold
        _sequences(backend, device, out, width, measured, (("recompile", False), ("dynamic", True)))
    if "auto" in parts:
        # -- auto: torch's default (automatic dynamic shapes) against dynamic=True, from cold, one run
        _sequences(backend, device, out, width, measured, (("auto", None), ("auto_dynamic", True)))
    measured["lengths"] = LENGTHS
    (out / "measured.json").write_text(json.dumps(measured, indent=1))
    return measured


LENGTHS = [40, 48, 56, 64, 72, 80] * 2   # above 32: inductor on CPU specialises a dynamic size at <= 32


def _sequences(backend: str, device: str, out: Path, width: int, measured: dict, runs) -> None:
    """Each ``(name, dynamic)`` of ``runs``: the 12 calls of :data:`LENGTHS` from cold under a CompileRecorder,
    without the profiler -> ``<name>.compile.json`` and ``measured[<name>_calls_ms]``.

    The ``auto`` pair: ``dynamic=None`` (dynamo's automatic dynamic shapes: the first change of length
    recompiles the frame with that size symbolic, then nothing compiles) against ``dynamic=True``, one after
    the other in one run: ``auto.compile.json`` / ``auto_dynamic.compile.json``, ``auto_calls_ms`` /
    ``auto_dynamic_calls_ms``. The recompile what-if reads the dynamic compile's cost from the first; the
    ``recompile`` pair's static stamp holds no such compile (the what-if then says it gives a lower bound).
    ``--only auto`` records this pair alone and keeps the other pairs' numbers."""
    inputs = [torch.randn(n, width, device=device) for n in LENGTHS]
    seq = MLP(width, 1, fixed=True).to(device).eval()
    torch._dynamo.reset()   # dynamic shapes' one-time set-up (sympy, ...) out of the timed sequences
    with torch.no_grad():
        torch.compile(MLP(width // 2, 1, fixed=True).to(device).eval(), backend=backend, dynamic=True)(
            torch.randn(8, width // 2, device=device))
    for name, dynamic in runs:
        torch._dynamo.reset()
        f = torch.compile(seq, backend=backend, dynamic=dynamic)
        with torch.no_grad(), CompileRecorder() as rec:
            for xi in inputs:
                rec.call(_time(lambda: f(xi), device))
        stamp = strip_paths(rec.stamp())
        (out / f"{name}.compile.json").write_text(json.dumps(stamp, indent=1))
        measured[f"{name}_calls_ms"] = float(sum(c["ms"] for c in stamp["calls"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="aot_eager", help="torch.compile backend (aot_eager, inductor)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None, help="default: tests/data/compile_pairs/<backend>-<device>")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--cold-steps", type=int, default=200)
    ap.add_argument("--cold-reps", type=int, default=3, help="cold compiled runs (median)")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (1: timings steady on a shared machine)")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS),
                    help="record these pairs only, keeping the others' numbers in an existing measured.json")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        torch.set_num_threads(a.threads)
    out = a.out or ROOT / "tests" / "data" / "compile_pairs" / f"{a.backend}-{a.device.split(':')[0]}"
    try:
        t0 = time.perf_counter()
        m = record(a.backend, a.device, out, a.reps, a.cold_steps, a.width, a.batch, a.cold_reps,
                   parts=tuple(a.only))
        m["wall_s"] = round(time.perf_counter() - t0, 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(json.dumps(m, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
