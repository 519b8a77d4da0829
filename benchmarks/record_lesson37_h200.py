"""Record lesson 37 (inference latency) on the H200, and the compiled torchao numbers lesson 32 reads.

Run from the repository root on the GPU machine (budget about 200 s; torchao 0.18 for the int8 rows)::

    python benchmarks/record_lesson37_h200.py --out DIR            # DIR/h200_lesson37.json
    python benchmarks/record_lesson37_h200.py --out /tmp/x --smoke  # CPU: tiny sizes, checks the code paths

The file is named h200_ whatever GPU ran it; ship it under the name of the GPU in its ``env.gpu`` (the
shipped runs were an H100's: workbench/samples/results/h100_lesson37.json, whose ``quant_compiled`` part
was cut, and h100_quant_compiled.json, a second run with ``--only quant_compiled``).

Parts, each in a fresh subprocess (its exception, or its death, is caught into the JSON; one failed part
loses nothing else):

1. ``decode``: greedy decoding with a GPT-style decoder (12 layers, d=1024, 16 heads, bf16, batch 1,
   prompt 128, 128 new tokens). Variants: ``eager_cat`` (a KV cache that grows by ``torch.cat``),
   ``eager_static`` (a preallocated cache written in place, attention over the full length with a mask),
   ``cuda_graph`` (the static step captured once in a ``torch.cuda.CUDAGraph`` and replayed),
   ``compiled`` (``torch.compile(mode="reduce-overhead")`` of the static step) and ``compiled_int8``
   (the same after torchao ``quantize_(Int8WeightOnlyConfig())``). Every variant is fed the tokens the
   ``eager_cat`` run chose (teacher forcing), so their logits can be compared step by step. Per token: CUDA
   events around the step and the host's wall time with a synchronize after it (a server that streams each
   token waits for it); ``runs`` generations per variant, the first untimed. Per variant: p50/p90/p99/max,
   tokens/s, first-call (capture, compile) seconds, peak allocated memory, max |logit - eager_cat logit|.
2. ``quant_compiled``: lesson 36's bf16 MLP (Linear(4096, 14336), GELU, Linear(14336, 4096)) as bf16, int8
   weight-only, float8 weight-only and int8 dynamic (torchao ``quantize_``), each eager and
   ``torch.compile``'d (default mode, ``dynamic=False``), at batch 1, 16 and 4096: median ms per call
   (CUDA events around ``inner`` back-to-back calls), the host's time to issue one call, weight bytes,
   and the weight bytes read per second as a fraction of the GPU's memory bandwidth (the datasheet's, from
   ``workbench.analysis.trace.peaks``, and a device-to-device copy measured here).

``--smoke`` runs tiny sizes on the CPU: no CUDA graph (recorded as skipped), torch.compile and torchao where
they run. Never ship a smoke file as the H200 recording (``"smoke": true`` in it).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = time.monotonic()

# lesson 36's recorder: the environment block, error lines and tensor-subclass byte counts are the same
_spec = importlib.util.spec_from_file_location("_rec36", Path(__file__).resolve().parent / "record_lesson36_h200.py")
_rec36 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rec36)
env, tensor_bytes, _err, _strip_text = _rec36.env, _rec36.tensor_bytes, _rec36._err, _rec36._strip_text


def log(*a):
    print(f"[lesson37 {time.monotonic() - T0:6.1f}s]", *a, file=sys.stderr, flush=True)


def pct(xs, q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's default)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def summary(xs) -> dict:
    return {"n": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99), "max": max(xs) if xs else None,
            "mean": statistics.fmean(xs) if xs else None, "min": min(xs) if xs else None}


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def param_bytes(m) -> int:
    return sum(tensor_bytes(p) for p in m.parameters())


VARIANTS = ("eager_cat", "eager_static", "cuda_graph", "compiled", "compiled_int8")  # eager_cat: the reference

# --- the decoder ----------------------------------------------------------------------------------------
SIZES = {"full": dict(layers=12, d=1024, heads=16, vocab=32000, prompt=128, new=128, runs=5),
         "smoke": dict(layers=2, d=64, heads=4, vocab=256, prompt=8, new=8, runs=2)}


def build_decoder(torch, cfg: dict, max_len: int, device, dtype):
    nn, F = torch.nn, torch.nn.functional
    d, H = cfg["d"], cfg["heads"]
    hd = d // H

    class KV(nn.Module):
        """A preallocated cache (batch 1): written in place at ``pos``; its buffers keep their addresses."""

        def __init__(self):
            super().__init__()
            self.register_buffer("k", torch.zeros(1, H, max_len, hd, device=device, dtype=dtype), persistent=False)
            self.register_buffer("v", torch.zeros(1, H, max_len, hd, device=device, dtype=dtype), persistent=False)

        def update(self, pos, k, v):
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
            return self.k, self.v

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.cache = KV()

        def _qkv(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            return [t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v)]

        def _out(self, x, y):
            B, _, T, _ = y.shape
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

        def forward_cat(self, x, past):
            """Growing cache: ``past`` is (k, v) or None; returns the output and the longer cache."""
            q, k, v = self._qkv(x)
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and q.shape[2] > 1)
            return self._out(x, y), (k, v)

        def forward_static(self, x, pos, mask):
            """Static cache: positions ``pos`` (a tensor, so one graph serves every step), ``mask`` (T, max_len)."""
            q, k, v = self._qkv(x)
            k, v = self.cache.update(pos, k, v)
            return self._out(x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(cfg["vocab"], d), nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, cfg["vocab"], bias=False)
            self.register_buffer("causal", torch.ones(max_len, max_len, device=device, dtype=torch.bool).tril(),
                                 persistent=False)

        def step_cat(self, idx, start: int, past):
            x = self.tok(idx) + self.pos(torch.arange(start, start + idx.shape[1], device=idx.device))
            new = []
            for i, b in enumerate(self.blocks):
                x, kv = b.forward_cat(x, past[i] if past else None)
                new.append(kv)
            return self.head(self.ln(x))[:, -1].float(), new

        def step_static(self, idx, pos):
            x = self.tok(idx) + self.pos(pos)
            mask = self.causal.index_select(0, pos)
            for b in self.blocks:
                x = b.forward_static(x, pos, mask)
            return self.head(self.ln(x))[:, -1].float()

    torch.manual_seed(0)
    m = Decoder().to(device, dtype).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    return m


def child_decode(smoke: bool, budget_s: float, only_variants: list[str] | None = None) -> dict:
    import torch

    t_start = time.monotonic()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = SIZES["smoke" if smoke else "full"]
    max_len = cfg["prompt"] + cfg["new"]
    model = build_decoder(torch, cfg, max_len, dev, dtype)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg["vocab"], (1, cfg["prompt"]), generator=g).to(dev)
    rec = {"model": {**{k: cfg[k] for k in ("layers", "d", "heads", "vocab")}, "dtype": str(dtype).replace("torch.", ""),
                     "batch": 1, "prompt": cfg["prompt"], "new_tokens": cfg["new"], "max_len": max_len,
                     "weight_bytes": param_bytes(model),
                     "embedding_bytes": tensor_bytes(model.tok.weight) + tensor_bytes(model.pos.weight),
                     "kv_cache_bytes": sum(tensor_bytes(b.cache.k) + tensor_bytes(b.cache.v) for b in model.blocks),
                     "params": sum(p.numel() for p in model.parameters())},
           "device": dev, "runs": cfg["runs"], "timing": "per token: CUDA events around the step (gpu_ms) and "
           "perf_counter around the step plus a synchronize (wall_ms); teacher-forced with eager_cat's tokens"}
    log("decode model", rec["model"])

    def new_timer():
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            return e, s
        return None, None

    def generate(variant: str, step, prefill, tokens=None):
        """One generation: prefill, then ``new`` steps, each timed. ``tokens``: the tokens to feed (teacher
        forcing); None: greedy (the reference run). Returns the tokens chosen, logits, per-token times."""
        out_tokens, logits, gpu_ms, wall_ms = [], [], [], []
        nxt = prefill()
        for i in range(cfg["new"]):
            tok = tokens[i] if tokens is not None else int(nxt.argmax(-1))  # the reference: greedy, host-side
            out_tokens.append(tok)
            t = time.perf_counter()
            e, s = new_timer()
            nxt = step(tok, cfg["prompt"] + i)
            if cuda:
                e.record()
                torch.cuda.synchronize()
            wall_ms.append((time.perf_counter() - t) * 1e3)
            if cuda:
                gpu_ms.append(s.elapsed_time(e))
            logits.append(nxt.detach().clone())
        return out_tokens, torch.stack(logits), gpu_ms, wall_ms

    # --- the five ways to run the step ---
    def cat_runner(m):
        state = {}

        def prefill():
            logits, state["past"] = m.step_cat(prompt, 0, None)
            return logits

        def step(tok, p):
            idx = torch.full((1, 1), tok, device=dev, dtype=torch.long)
            logits, state["past"] = m.step_cat(idx, p, state["past"])
            return logits
        return prefill, step

    def static_runner(m, fn, compiled=False):
        pos_prompt = torch.arange(cfg["prompt"], device=dev)
        tok_buf = torch.zeros(1, 1, device=dev, dtype=torch.long)
        pos_buf = torch.zeros(1, device=dev, dtype=torch.long)

        def prefill():
            for b in m.blocks:
                b.cache.k.zero_(); b.cache.v.zero_()
            return m.step_static(prompt, pos_prompt)

        def step(tok, p):
            tok_buf.fill_(tok)
            pos_buf.fill_(p)
            if compiled:
                torch.compiler.cudagraph_mark_step_begin()  # a new step: the last step's outputs were copied
            return fn(tok_buf, pos_buf)
        return prefill, step, tok_buf, pos_buf

    def graph_runner(m):
        prefill, _, tok_buf, pos_buf = static_runner(m, m.step_static)
        t = time.perf_counter()
        prefill()                                       # the cache holds the prompt before capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                   # warm-up on a side stream, as CUDA graphs require
            for _ in range(3):
                m.step_static(tok_buf, pos_buf)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = m.step_static(tok_buf, pos_buf)
        torch.cuda.synchronize()
        capture_s = time.perf_counter() - t

        def step(tok, p):
            tok_buf.fill_(tok)
            pos_buf.fill_(p)
            graph.replay()
            return static_out
        return prefill, step, capture_s

    def launches_per_token(step, n=4):
        """Kernels the GPU ran and launch calls the host made (kernel or graph launches), per token, from a
        torch.profiler run over ``n`` steps (after the timed runs; the cache positions are reused)."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(n):
                step(1, cfg["prompt"] + i)
            torch.cuda.synchronize()
        kernels = launches = graph_launches = 0
        for evt in prof.key_averages():
            if evt.device_type == torch.autograd.DeviceType.CUDA:
                kernels += evt.count
            elif "LaunchKernel" in evt.key:
                launches += evt.count
            elif "GraphLaunch" in evt.key:
                graph_launches += evt.count
        return {"kernels": kernels / n, "kernel_launch_calls": launches / n, "graph_launch_calls": graph_launches / n,
                "steps_profiled": n}

    variants = [v for v in VARIANTS if not only_variants or v in only_variants or v == "eager_cat"]
    ref_tokens, ref_logits = None, None
    out = {}
    with torch.no_grad():
        for name in variants:
            left = budget_s - (time.monotonic() - t_start)
            if left < (5 if smoke else 20):
                out[name] = {"error": "skipped: out of time budget"}
                continue
            r = {}
            try:
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                m = model
                from torch._dynamo.utils import counters
                if name == "eager_cat":
                    prefill, step = cat_runner(m)
                elif name == "eager_static":
                    prefill, step, *_ = static_runner(m, m.step_static)
                elif name == "cuda_graph":
                    if not cuda:
                        raise RuntimeError("skipped: CUDA graphs need a CUDA device")
                    prefill, step, r["capture_s"] = graph_runner(m)
                else:
                    if name == "compiled_int8":
                        import torchao.quantization as tq

                        m = copy.deepcopy(model)
                        t = time.perf_counter()
                        tq.quantize_(m, tq.Int8WeightOnlyConfig())
                        r["quantize_s"] = time.perf_counter() - t
                        r["weight_bytes"] = param_bytes(m)
                        r["weight_class"] = type(m.blocks[0].fc1.weight).__name__
                    torch._dynamo.reset()
                    counters.clear()
                    for b in m.blocks:  # the caches keep their addresses: cudagraphs may then mutate them in place
                        torch._dynamo.mark_static_address(b.cache.k)
                        torch._dynamo.mark_static_address(b.cache.v)
                    fn = torch.compile(m.step_static, mode="reduce-overhead", fullgraph=True)
                    r["compile_mode"] = "reduce-overhead"
                    prefill, step, *_ = static_runner(m, fn, compiled=True)
                if cuda:
                    torch.cuda.synchronize()
                    r["allocated_before_runs_bytes"] = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                runs = []
                first_wall = None
                for run in range(cfg["runs"]):
                    t = time.perf_counter()
                    toks, logits, gpu_ms, wall_ms = generate(name, step, prefill, ref_tokens)
                    _sync()
                    if run == 0:
                        # the first generation pays the first calls (compile, cudagraph record); kept apart
                        first_wall = time.perf_counter() - t
                        r["first_run_token_wall_ms"] = [round(x, 4) for x in wall_ms[:4]]
                        if ref_tokens is None:
                            ref_tokens, ref_logits = toks, logits
                        r["max_abs_logit_diff_vs_eager_cat"] = float((logits - ref_logits).abs().max())
                        r["argmax_agrees_with_eager_cat"] = float((logits.argmax(-1) == ref_logits.argmax(-1))
                                                                  .float().mean())
                        continue
                    runs.append({"gpu_ms": gpu_ms, "wall_ms": wall_ms, "run_s": time.perf_counter() - t})
                    if budget_s - (time.monotonic() - t_start) < 5:
                        break
                r["first_run_s"] = first_wall
                if name.startswith("compiled"):
                    r["inductor_cudagraph_counters"] = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
                r["timed_runs"] = len(runs)
                gpu_all = [x for rr in runs for x in rr["gpu_ms"]]
                wall_all = [x for rr in runs for x in rr["wall_ms"]]
                r["wall_ms"] = summary(wall_all)
                r["gpu_ms"] = summary(gpu_all) if gpu_all else None
                r["tokens_per_s"] = cfg["new"] * len(runs) / sum(rr["run_s"] for rr in runs) if runs else None
                # every timed token, to the microsecond: position i of run j is entry j * new + i
                r["per_token_wall_ms"] = [round(x, 3) for x in wall_all]
                if gpu_all:
                    r["per_token_gpu_ms"] = [round(x, 3) for x in gpu_all]
                if cuda:
                    r["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                    r["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
                    try:
                        prefill()
                        r["per_token_launches"] = launches_per_token(step)
                    except Exception as exc:  # noqa: BLE001
                        r["per_token_launches"] = _err(exc)
                del m
            except Exception as exc:  # noqa: BLE001
                r.update(_err(exc))
                if not str(exc).startswith("skipped"):
                    log("decode", name, "failed:", _strip_text(traceback.format_exc()[-1200:]))
            out[name] = r
            log("decode", name, {k: v for k, v in r.items() if not k.startswith("per_token")})
    rec["variants"] = out
    return rec


# --- quant_compiled -------------------------------------------------------------------------------------
QUANT = {"int8_weight_only": "Int8WeightOnlyConfig", "float8_weight_only": "Float8WeightOnlyConfig",
         "int8_dynamic": "Int8DynamicActivationInt8WeightConfig"}


def measure_call(torch, fn, cuda: bool, target_s: float) -> dict:
    """Median ms per call: CUDA events (perf_counter on a CPU) around ``inner`` back-to-back calls, so that
    the GPU stays busy wherever the host issues calls faster than the GPU runs them; and the host's own time
    to issue one call (no synchronize), which bounds the rate when it is the slower side."""
    fn(); _sync()
    t = time.perf_counter(); fn(); _sync()
    one = max(time.perf_counter() - t, 1e-6)
    inner = max(1, min(50, int(0.002 / one)))
    reps = max(5, min(30, int(target_s / (one * inner))))
    times, issue = [], []
    for _ in range(reps):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        issue.append((time.perf_counter() - t) / inner * 1e3)
        if cuda:
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / inner)
        else:
            times.append((time.perf_counter() - t) / inner * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "host_issue_ms": statistics.median(issue),
            "inner": inner, "reps": reps}


def child_quant(smoke: bool, budget_s: float) -> dict:
    import torch

    t_start = time.monotonic()
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    d, h = (256, 1024) if smoke else (4096, 14336)
    batches = [1, 16, 64] if smoke else [1, 16, 4096]
    target = 0.05 if smoke else 0.3
    rec = {"model": f"bf16 MLP Linear({d},{h}) GELU Linear({h},{d}), eval (lesson 36's)", "d": d, "hidden": h,
           "batches": batches, "device": dev, "compile": "torch.compile(model, dynamic=False), default mode",
           "timing": "median over reps of (CUDA events around `inner` back-to-back calls) / inner; host_issue_ms: "
                     "perf_counter around the same calls, no synchronize"}
    try:
        import torchao.quantization as tq
    except Exception as exc:  # noqa: BLE001
        tq = None
        rec["torchao"] = _err(exc)
    if cuda:
        # what this GPU's memory really moves: a 1 GiB device-to-device copy (read + write)
        n = 2**30
        a, b = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
        c = measure_call(torch, lambda: b.copy_(a), True, 0.2)
        rec["copy_gbps"] = 2 * n / (c["median_ms"] * 1e-3) / 1e9
        del a, b
        torch.cuda.empty_cache()
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to(dev, torch.bfloat16).eval()
    xs = {m: torch.randn(m, d, device=dev, dtype=torch.bfloat16) for m in batches}
    from torch._dynamo.utils import counters

    rows, fns = {}, {}
    # four modules share nn.Sequential.forward's code object: 4 x 3 compiled entries must not hit the limit
    # (past it, dynamo would run the rest eagerly without a word)
    for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    with torch.no_grad():
        refs = {m: base(xs[m]).float() for m in batches}
        for name in ["bf16", *QUANT]:                 # the four models, each eager and compiled
            r = rows[name] = {}
            try:
                if name == "bf16":
                    model = base
                else:
                    if tq is None:
                        raise RuntimeError("skipped: torchao is not installed")
                    model = copy.deepcopy(base)
                    r["api"] = QUANT[name]
                    tq.quantize_(model, getattr(tq, QUANT[name])())
                    r["weight_class"] = type(model[0].weight).__name__
                r["weight_bytes"] = param_bytes(model)
                fns[name] = {"eager": model, "compiled": torch.compile(model, dynamic=False)}
            except Exception as exc:  # noqa: BLE001
                r.update(_err(exc))
                log("quant", name, "failed:", _strip_text(traceback.format_exc()[-1200:]))
        # batch by batch, so that a budget that runs out loses the compute-bound batch 4096 first
        for m in batches:
            for name, by_mode in fns.items():
                r = rows[name]
                for mode, fn in by_mode.items():
                    key = f"{mode}_batch_{m}"
                    if budget_s - (time.monotonic() - t_start) < (2 if smoke else 8):
                        r[key] = {"error": "skipped: out of time budget"}
                        continue
                    try:
                        x = xs[m]
                        graphs = counters["stats"]["unique_graphs"]
                        t = time.perf_counter()
                        y = fn(x)
                        _sync()
                        cell = {"first_call_s": time.perf_counter() - t}
                        if mode == "compiled":  # 1: this batch got its own graph (0 would mean it ran eagerly)
                            cell["graphs_compiled"] = counters["stats"]["unique_graphs"] - graphs
                        cell.update(measure_call(torch, lambda: fn(x), cuda, target))
                        err = y.float() - refs[m]
                        cell["rel_l2_err_vs_bf16_eager"] = float(err.norm() / refs[m].norm())
                        cell["weight_gbps"] = r["weight_bytes"] / (cell["median_ms"] * 1e-3) / 1e9
                        r[key] = cell
                    except Exception as exc:  # noqa: BLE001
                        r[key] = _err(exc)
                    log("quant", name, key, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r[key].items()})
    rec["configs"] = rows
    return rec


# --- parent -----------------------------------------------------------------------------------------------
def run_child(part: str, args, budget_s: float) -> dict:
    """One part in a fresh process with a cold, private inductor cache (compile times are first-compile times)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--child-budget", f"{budget_s:.1f}"]
    if args.smoke:
        cmd.append("--smoke")
    if args.variants:
        cmd += ["--variants", args.variants]
    with tempfile.TemporaryDirectory(prefix="wb37_inductor_") as cache:
        child_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        t = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                                env=child_env)
        tail: list[str] = []

        def relay():  # the child's progress lines as they come; the rest kept for an error message
            for line in proc.stderr:
                if line.startswith("[lesson37"):
                    print(line, end="", file=sys.stderr, flush=True)
                tail.append(line)
                del tail[:-40]

        th = threading.Thread(target=relay, daemon=True)
        th.start()
        limit = budget_s + 60
        killer = threading.Timer(limit, proc.kill)   # a compile cannot be interrupted from inside the child
        killer.start()
        try:
            stdout = proc.stdout.read()
            proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            raise
        finally:
            killer.cancel()
        th.join(timeout=5)
        if time.monotonic() - t >= limit:
            return {"error": f"child stopped after {limit:.0f} s (its budget plus 60 s)"}
        if proc.returncode != 0 or not stdout.strip():
            return {"error": f"child rc={proc.returncode}: {_strip_text(''.join(tail).strip()[-600:])}"}
        rec = json.loads(stdout.strip().splitlines()[-1])
        rec["process_wall_s"] = time.monotonic() - t
        return rec


def peaks(gpu: str | None) -> dict:
    sys.path.insert(0, str(ROOT))
    from workbench.analysis.trace.peaks import peak_for

    p = peak_for(gpu)
    return {"name": p.name, "gbps": p.gbps, "source": p.source} if p else {"error": f"no datasheet row for {gpu!r}"}


def add_bandwidth_fractions(q: dict, gbps: float | None) -> None:
    """Each quant cell's weight-read rate as a fraction of the datasheet bandwidth and of the measured copy."""
    for r in q.get("configs", {}).values():
        for cell in r.values():
            if isinstance(cell, dict) and "weight_gbps" in cell:
                if gbps:
                    cell["weight_bandwidth_fraction"] = cell["weight_gbps"] / gbps
                if q.get("copy_gbps"):
                    cell["weight_copy_fraction"] = cell["weight_gbps"] / q["copy_gbps"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="directory for h200_lesson37.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on a CPU (checks the code paths)")
    p.add_argument("--budget", type=float, default=200.0, help="seconds for both parts (default 200)")
    p.add_argument("--only", choices=("decode", "quant_compiled"), help="run one part (default: both)")
    p.add_argument("--variants", help="decode variants to run, comma-separated (eager_cat always runs: the "
                                      f"reference); default: all of {', '.join(VARIANTS)}")
    p.add_argument("--child", choices=("decode", "quant_compiled"), help=argparse.SUPPRESS)
    p.add_argument("--child-budget", type=float, default=100.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if args.child == "decode":
            print(json.dumps(child_decode(args.smoke, args.child_budget, args.variants.split(",") if args.variants else None)))
        else:
            print(json.dumps(child_quant(args.smoke, args.child_budget)))
        return 0
    if args.out is None:
        p.error("--out DIR is required")
    unknown = set(args.variants.split(",")) - set(VARIANTS) if args.variants else set()
    if unknown:
        p.error(f"unknown --variants {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "h200_lesson37.json"
    result = {"lesson": 37, "smoke": args.smoke, "budget_s": args.budget,
              "recorder": " ".join(["benchmarks/record_lesson37_h200.py", *(argv if argv is not None else sys.argv[1:])]
                                   ).replace(str(args.out), "DIR")}
    try:
        result["env"] = env()
    except Exception as exc:  # noqa: BLE001
        result["env"] = _err(exc)
    log("env", result["env"])
    try:
        result["peak"] = peaks(result["env"].get("gpu"))
    except Exception as exc:  # noqa: BLE001
        result["peak"] = _err(exc)
    import torch

    if not torch.cuda.is_available() and not args.smoke:
        log("no CUDA device: run it on the GPU machine (or use --smoke)")
    shares = {"decode": 0.55, "quant_compiled": 0.45}
    if args.only:
        shares = {args.only: 1.0}
    try:
        for name, share in shares.items():
            left = args.budget - (time.monotonic() - T0)
            if left < 10:
                result[name] = {"error": "skipped: out of time budget"}
                continue
            log("part", name)
            part_budget = left if name == list(shares)[-1] else args.budget * share
            try:
                result[name] = run_child(name, args, part_budget)
            except Exception as exc:  # noqa: BLE001
                result[name] = _err(exc)
            if name == "quant_compiled" and "configs" in result[name]:
                add_bandwidth_fractions(result[name], result["peak"].get("gbps"))
            path.write_text(json.dumps(result, indent=None, sort_keys=True, separators=(",", ":")) + "\n")
    except KeyboardInterrupt:
        log("stopped (Ctrl-C): what is done is in", path.name)
        return 130
    result["total_wall_s"] = time.monotonic() - T0
    path.write_text(json.dumps(result, indent=None, sort_keys=True, separators=(",", ":")) + "\n")
    log("wrote", path.name, f"{path.stat().st_size / 1e3:.1f} KB in {result['total_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
