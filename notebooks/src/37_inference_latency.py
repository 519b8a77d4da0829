# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 37 · Inference latency: static shapes, CUDA graphs, and the tail
#
# **One idea:** generating text one token at a time at batch 1, each token's step is a few hundred small
# kernels. The GPU finishes each one faster than the host can launch the next, so the token takes as long
# as the **host** takes to issue them. Nothing on the GPU side (faster kernels, fewer bytes) helps until
# the host is out of the loop, and the host can only be taken out when every step has the **same shapes
# at the same addresses**: a static KV cache. Then a CUDA graph (or `torch.compile(mode="reduce-overhead")`,
# which captures one for you) replays the whole step with one launch. Judge the result by the per-token
# distribution, p50 *and* p99, not by a mean.
#
# Where the numbers come from:
#
# - **live, on this machine's CPU** (section 1): a tiny decoder with a KV cache that grows by `torch.cat`
#   and one that is preallocated, each token timed with `time.perf_counter`;
# - **a GPU recording** (sections 2-4; `benchmarks/record_lesson37_h200.py`, shipped as
#   `workbench/samples/results/h100_lesson37.json`: it ran on an **NVIDIA H100 80GB HBM3**, 2026-12-05, and the
#   cell below prints the machine from the file): a 12-layer, d=1024 bf16 decoder, batch 1, a 128-token prompt and 128 new tokens, run five ways: eager
#   with the growing cache, eager with the static cache, the static step captured in a `torch.cuda.CUDAGraph`,
#   `torch.compile(mode="reduce-overhead")`, and the same compiled after torchao int8 weight-only
#   quantization. Every token timed with CUDA events and with the host's clock (a synchronize after each
#   token, as a server that streams tokens does), four timed generations per way after an untimed one.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, recording, MIB
setup(recorded_on="H100")
import time
import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
GPU = torch.cuda.is_available()  # True: live CUDA capture; False: recorded GPU samples and CPU runs

REC = recording("h100_lesson37.json")
SMOKE = REC["smoke"]          # a --smoke recording (CPU, tiny sizes) stands in while developing the lesson
e = REC["env"]
print(f"recording: {e.get('gpu') or 'CPU (smoke run)'}, torch {e['torch']}, CUDA {e['cuda']}, torchao {e['torchao']}, "
      f"{e['date_utc'][:10]}; parts:", {p: ("not in the file" if p not in REC else REC[p].get("error", "ok"))
                                        for p in ("decode", "quant_compiled")})

# %% [markdown]
# ## 1 · Live on this CPU: a growing cache against a static one
#
# A decoder keeps, for every layer, the keys and values of every token so far (the **KV cache**), so a
# new token only computes its own. Two ways to keep it:
#
# - **growing**: `torch.cat` the new key and value onto the cache. Simple, and every step has a new shape
#   and a new tensor: the cache is copied, and grows, every token.
# - **static**: allocate the cache for the longest sequence once and write each token's key and value
#   in place (`index_copy_` at position `pos`); attention runs over the whole buffer with a mask that hides
#   the positions not written yet. Every step has the same shapes and the same tensors.
#
# The model below is small enough for one CPU thread: 4 layers, d=128, a 32-token prompt and 480 new
# tokens. Both ways run the same weights on the same tokens.

# %%
L, D, H, V, PROMPT, NEW = 4, 128, 4, 512, 32, 480
MAX_LEN, HD = PROMPT + NEW, D // H


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def heads(self, x):                                    # (B, T, D) -> q, k, v as (B, H, T, HD)
        B, T, _ = x.shape
        return [t.view(B, T, H, HD).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(D, -1)]

    def rest(self, x, q, k, v, mask=None, causal=False):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        x = x + self.proj(y.transpose(1, 2).reshape(x.shape))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(MAX_LEN, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def step_growing(self, idx, start, cache):             # cache: a list of (k, v) per layer, or None
        x = self.tok(idx) + self.pos(torch.arange(start, start + idx.shape[1]))
        for i, b in enumerate(self.blocks):
            q, k, v = b.heads(x)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)   # a new, longer tensor
            cache[i] = (k, v)
            x = b.rest(x, q, k, v, causal=start == 0)
        return self.head(self.ln(x))[:, -1]

    def step_static(self, idx, pos, K, Vc):                # K, Vc: per layer (1, H, MAX_LEN, HD), written in place
        x = self.tok(idx) + self.pos(pos)
        mask = torch.arange(MAX_LEN)[None, :] <= pos[:, None]   # each query sees the positions up to its own
        for i, b in enumerate(self.blocks):
            q, k, v = b.heads(x)
            K[i].index_copy_(2, pos, k)
            Vc[i].index_copy_(2, pos, v)
            x = b.rest(x, q, K[i], Vc[i], mask=mask)
        return self.head(self.ln(x))[:, -1]


model = TinyDecoder().eval()
prompt = torch.randint(0, V, (1, PROMPT))


def generate(kind):
    """Greedy decoding; returns each new token's latency (ms) and its logits."""
    ms, logits = [], []
    with torch.no_grad():
        if kind == "growing":
            cache = [None] * L
            out = model.step_growing(prompt, 0, cache)
        else:
            K = [torch.zeros(1, H, MAX_LEN, HD) for _ in range(L)]
            Vc = [torch.zeros(1, H, MAX_LEN, HD) for _ in range(L)]
            out = model.step_static(prompt, torch.arange(PROMPT), K, Vc)
        for i in range(NEW):
            tok = out.argmax(-1, keepdim=True)
            t = time.perf_counter()
            if kind == "growing":
                out = model.step_growing(tok, PROMPT + i, cache)
            else:
                out = model.step_static(tok, torch.tensor([PROMPT + i]), K, Vc)
            ms.append((time.perf_counter() - t) * 1e3)
            logits.append(out)
    return np.array(ms), torch.cat(logits)


live, live_logits = {}, {}
for _ in range(3):                      # three rounds; each token keeps its quickest time (a busy machine's
    for kind in ("growing", "static"):  # hiccups land in one round, not in all three)
        ms, lg = generate(kind)
        live[kind] = ms if kind not in live else np.minimum(live[kind], ms)
        live_logits[kind] = lg

# %% [markdown]
# The same tokens came out both ways (the logits agree to float32 rounding). Per way: the percentiles of
# the 480 per-token latencies, and the median of the first 48 tokens against the last 48:

# %% tags=["nbval-ignore-output"]
def percentiles(ms):
    return {"p50 ms": np.percentile(ms, 50), "p90 ms": np.percentile(ms, 90), "p99 ms": np.percentile(ms, 99),
            "max ms": ms.max(), "first 48 (median ms)": np.median(ms[:48]), "last 48 (median ms)": np.median(ms[-48:])}


live_table = pd.DataFrame({k: percentiles(v) for k, v in live.items()}).T
live_table["last / first"] = live_table["last 48 (median ms)"] / live_table["first 48 (median ms)"]
print("max |logit difference|, growing vs static:", f"{(live_logits['growing'] - live_logits['static']).abs().max():.1e}")
live_table.round(3)

# %%
assert torch.allclose(live_logits["growing"], live_logits["static"], atol=1e-4)
grow_ratio, static_ratio = live_table["last / first"]
assert grow_ratio > 1.15 and grow_ratio > static_ratio + 0.1, live_table

# %% [markdown]
# The growing cache's token gets slower as the sequence gets longer: every `torch.cat` copies all the keys
# and values so far. The static cache pays for the full length from the first token (attention over 512
# positions, most of them masked) and then stays flat. On a CPU, that is the whole difference, and it is
# not in favour of either one by much. The static cache earns its keep on a GPU, in section 2: a step with
# fixed shapes and fixed buffers can be captured once and replayed.
#
# The picture the workbench draws of the distribution (per token, in order; then sorted, which is what a
# percentile reads). The spikes are this machine's other work, not the model: that is what a p99 sees.

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from workbench.panels import PlotWidget


def latency_figure(series: dict, title: str, log_y=False):
    """Per-token latency in generation order (left) and as a distribution, sorted with p50/p99 marked (right)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per token, in order", "sorted: the share of tokens at or below"),
                        column_widths=[0.55, 0.45])
    for i, (name, ms) in enumerate(series.items()):
        ms = np.asarray(ms)
        color = f"hsl({(i * 67) % 360}, 65%, 45%)"
        fig.add_trace(go.Scattergl(y=ms, mode="markers", marker=dict(size=3, color=color), name=name,
                                   legendgroup=name), 1, 1)
        s = np.sort(ms)
        fig.add_trace(go.Scatter(x=s, y=np.arange(1, len(s) + 1) / len(s), mode="lines", line=dict(color=color),
                                 name=name, legendgroup=name, showlegend=False), 1, 2)
        for q in (50, 99):
            fig.add_trace(go.Scatter(x=[np.percentile(ms, q)], y=[q / 100], mode="markers+text", text=[f"p{q}"],
                                     textposition="middle left", marker=dict(color=color, size=7),
                                     legendgroup=name, showlegend=False, hoverinfo="x"), 1, 2)
    fig.update_xaxes(title_text="token", row=1, col=1)
    fig.update_yaxes(title_text="ms", type="log" if log_y else "linear", row=1, col=1)
    fig.update_xaxes(title_text="ms", type="log" if log_y else "linear", row=1, col=2)
    fig.update_layout(title=title, height=380, margin=dict(t=70, b=40))
    return fig


PlotWidget(latency_figure(live, "Live on this CPU: per-token latency, growing vs static KV cache"))

# %% [markdown]
# **One token, as the host sees it.** The workbench's profiler on five static-cache tokens of this
# decoder (`profile_steps`, light detail): every row of the operator table is work the host dispatches,
# one call at a time, for every token. On a GPU, most of these calls launch a kernel.

# %% tags=["nbval-ignore-output"]
from workbench import profile_steps, TraceAnalysis, ProfilerPanel

K1 = [torch.zeros(1, H, MAX_LEN, HD) for _ in range(L)]
V1 = [torch.zeros(1, H, MAX_LEN, HD) for _ in range(L)]


def one_token():
    with torch.no_grad():
        model.step_static(torch.tensor([[1]]), torch.tensor([PROMPT]), K1, V1)


token_trace = TraceAnalysis(profile_steps(one_token, steps=5, detail="light", verbose=False, progress=False).load())
op_calls = int(token_trace.ops["count"].sum()) // 5
print(f"{op_calls} operator calls a token (nested calls included), {L} layers")
ProfilerPanel(token_trace, top=8)

# %%
assert op_calls > 20 * L

# %% [markdown]
# ## 2 · On the H100: five ways to run the same decoder
#
# The recorded table: per-token latency by the host's clock (a synchronize after each token; `wall`) and
# by CUDA events on the GPU (`gpu`), over the timed generations; tokens a second; the first, untimed
# generation's seconds (it pays the CUDA-graph capture and the compile); the peak allocated memory during
# the timed generations; and how far the logits are from the eager, growing-cache run's.

# %% tags=["nbval-check-output"]
DEC = REC["decode"]
VAR = DEC["variants"]
NAMES = ["eager_cat", "eager_static", "cuda_graph", "compiled", "compiled_int8"]
mdl = DEC["model"]
print(f"{mdl['layers']} layers, d={mdl['d']}, {mdl['heads']} heads, vocab {mdl['vocab']}, {mdl['dtype']}, batch "
      f"{mdl['batch']}, prompt {mdl['prompt']}, {mdl['new_tokens']} new tokens; weights {mdl['weight_bytes'] / MIB:.0f} MiB, "
      f"KV cache {mdl['kv_cache_bytes'] / MIB:.1f} MiB")
rows = {}
for name in NAMES:
    v = VAR[name]
    if "error" in v:
        rows[name] = {"error": v["error"][:60]}
        continue
    g = v.get("gpu_ms") or {}
    rows[name] = {"wall p50": v["wall_ms"]["p50"], "wall p90": v["wall_ms"]["p90"], "wall p99": v["wall_ms"]["p99"],
                  "wall max": v["wall_ms"]["max"], "gpu p50": g.get("p50"), "gpu p99": g.get("p99"),
                  "tokens/s": v["tokens_per_s"], "first run s": v["first_run_s"],
                  "peak MiB": v.get("peak_allocated_bytes", float("nan")) / MIB,
                  "max |dlogit|": v["max_abs_logit_diff_vs_eager_cat"], "argmax agrees": v["argmax_agrees_with_eager_cat"]}
dec = pd.DataFrame(rows).T
dec.round(3)

# %% [markdown]
# Read the table by pairs:
#
# - **eager_cat against eager_static**: the cache alone. In eager mode both wait on the host, and on the
#   H100 the static cache was the *slower* one (p50 6.56 against 4.41 ms): its step launches more kernels
#   (201 against 164 a token, section 3: the mask, the in-place writes) and attends over all 256 positions,
#   and the host pays for every launch. What the static cache buys is the next pair.
# - **eager_static against cuda_graph**: the same step, the same kernels; the graph launches them all with
#   one call. The difference is the host's launching.
# - **cuda_graph against compiled**: `reduce-overhead` captures a CUDA graph too, around kernels that
#   inductor fused; its first generation paid the compile. Here its step ran 142 kernels to the plain graph's
#   201 and was still a little slower (p50 1.08 against 0.90 ms): fewer kernels is not by itself less time.
# - **compiled against compiled_int8**: half the weight bytes (torchao int8 weight-only); section 4.
#
# The per-token picture, by the host's clock, every timed token of every run (log axes):

# %% tags=["nbval-ignore-output"]
h200_series = {n: VAR[n]["per_token_wall_ms"] for n in NAMES if "error" not in VAR[n]}
PlotWidget(latency_figure(h200_series, f"{e.get('gpu', 'smoke run')}: per-token latency, batch 1", log_y=True))

# %% [markdown]
# ## 3 · Where a token's time goes
#
# **The floor.** Each new token reads every weight once, except the embedding tables, of which it reads
# one row. At batch 1 that is almost all the bytes a step moves (the KV cache is small next to the
# weights), so those bytes over the memory bandwidth are the fastest a token can be on this GPU. The
# workbench's datasheet row (`peak_for`) gives the bandwidth.

# %% tags=["nbval-check-output"]
from workbench.analysis.trace.peaks import peak_for

PEAK = peak_for(e["gpu"] or "NVIDIA H200")       # the recording's GPU: its datasheet row
read_bytes = mdl["weight_bytes"] - mdl["embedding_bytes"]
floor_ms = read_bytes / (PEAK.gbps * 1e9) * 1e3
p50 = dec["wall p50"].dropna()
print(f"{PEAK.name}: {PEAK.gbps:.0f} GB/s -> the floor: {read_bytes / 1e6:.0f} MB / {PEAK.gbps:.0f} GB/s = "
      f"{floor_ms * 1e3:.1f} us a token")
print((p50 / floor_ms).round(1).rename("p50 / floor").to_string())

# %% [markdown]
# **The host's share.** In eager mode the CPU launches each kernel in turn: the per-token time is set by
# Python and the launch path, and the GPU idles between kernels. The CUDA graph removes that, and what is
# left is the GPU's own time. The ratio eager_static / cuda_graph is the host's share in one number.
# The recorder also profiled a few tokens of each way after timing them: kernels the GPU ran per token,
# and the launch calls the host made for them (one `cudaLaunchKernel` per kernel, or one `cudaGraphLaunch`
# for a whole graph).

# %% tags=["nbval-check-output"]
launches = pd.DataFrame({n: VAR[n]["per_token_launches"] for n in NAMES
                         if "error" not in VAR[n] and "error" not in VAR[n].get("per_token_launches", {"error": 1})}).T
if launches.empty:
    print("no per-token launch counts in this recording (the recorder counts them on a GPU only)")
else:
    print(launches.drop(columns="steps_profiled").round(1).to_string())
    per_call_us = VAR["eager_static"]["wall_ms"]["p50"] * 1e3 / launches.loc["eager_static", "kernel_launch_calls"]
    print(f"eager_static: {per_call_us:.1f} us of the token's p50 per kernel launch call")

# %% [markdown]
# **Compile's price.** `reduce-overhead` paid its compile in the first generation (the first token of it,
# then a second for the graph's recording). How many tokens at the steady gain does it take to pay that
# back?

# %% tags=["nbval-check-output"]
def first_tokens(name):
    return VAR[name].get("first_run_token_wall_ms", [])


if "error" not in VAR["compiled"]:
    gain_ms = VAR["eager_static"]["wall_ms"]["p50"] - VAR["compiled"]["wall_ms"]["p50"]
    compile_s = VAR["compiled"]["first_run_s"]
    print(f"compiled: first generation {compile_s:.1f} s; its first tokens (ms): {first_tokens('compiled')}")
    print(f"steady gain over eager_static: {gain_ms:.3f} ms a token -> {compile_s * 1e3 / gain_ms:,.0f} tokens to pay back"
          if gain_ms > 0 else "no steady gain over eager_static: compile never pays back here")
if "error" not in VAR["cuda_graph"]:
    print(f"cuda_graph: capture {VAR['cuda_graph']['capture_s']:.2f} s; eager_static / cuda_graph p50 = "
          f"{VAR['eager_static']['wall_ms']['p50'] / VAR['cuda_graph']['wall_ms']['p50']:.1f}x")

# %% [markdown]
# **The tail.** p50 says what a typical token costs; p99 what one token in a hundred costs, which at 128
# tokens a reply is in most replies. A mean hides both. The first, untimed generation is the worst tail of
# all: a server that compiles on its first request makes that request wait seconds.

# %% tags=["nbval-check-output"]
tail = pd.DataFrame({n: {"p99 / p50 (wall)": VAR[n]["wall_ms"]["p99"] / VAR[n]["wall_ms"]["p50"],
                         "max / p50 (wall)": VAR[n]["wall_ms"]["max"] / VAR[n]["wall_ms"]["p50"],
                         "first token of the first run / p50": first_tokens(n)[0] / VAR[n]["wall_ms"]["p50"]}
                     for n in NAMES if "error" not in VAR[n]}).T
tail.round(2)

# %% [markdown]
# ## 4 · int8 weights at batch 1, compiled
#
# Int8 weight-only quantization halves the bytes of every `Linear` weight. Section 3's floor says how much
# time that can save at most: the bytes not read, over the bandwidth. Whether it saves that much depends on
# what else the step spends its time on (the host, in eager mode; the many small kernels, once graphed).

# %% tags=["nbval-check-output"]
if "error" not in VAR["compiled_int8"] and "error" not in VAR["compiled"]:
    q = VAR["compiled_int8"]
    saved_bytes = mdl["weight_bytes"] - q["weight_bytes"]
    most_ms = saved_bytes / (PEAK.gbps * 1e9) * 1e3
    got_ms = VAR["compiled"]["wall_ms"]["p50"] - q["wall_ms"]["p50"]
    print(f"weights {mdl['weight_bytes'] / MIB:.0f} -> {q['weight_bytes'] / MIB:.0f} MiB ({q['weight_class']}); at most "
          f"{most_ms * 1e3:.1f} us a token saved; measured p50 {VAR['compiled']['wall_ms']['p50'] * 1e3:.1f} -> "
          f"{q['wall_ms']['p50'] * 1e3:.1f} us ({got_ms * 1e3:+.1f} us saved)")
    print(f"argmax agrees with bf16 eager for {q['argmax_agrees_with_eager_cat']:.1%} of tokens; max |dlogit| "
          f"{q['max_abs_logit_diff_vs_eager_cat']:.3f}")
else:
    print("compiled_int8:", VAR["compiled_int8"].get("error"), "| compiled:", VAR["compiled"].get("error"))

# %% [markdown]
# On the H100 int8 did not save time, it cost time: the compiled int8 token took 2.6x the compiled bf16 one
# at p50 (2.78 against 1.08 ms), with a long tail (p99 13.3 ms, 4.8x its p50). The host is not the reason:
# the step is one graph launch, and the GPU's own time (CUDA events, `gpu p50` in section 2's table: 2.72 ms)
# is nearly all of the wall time. The int8 kernels themselves, as torchao 0.18 and inductor built them for
# batch 1, ran slower than the bf16 ones they replaced. Which kernels, the recording does not say (a profile
# of the int8 step would); the lesson to keep is that halving the bytes bounds the gain, it does not
# promise one. The logits moved too: argmax agreed with bf16 for 84% of the tokens.
#
# Lesson 32 (section 3) asks the same question of one large MLP, eager and compiled, at batch 1, 16 and 4096.
# That part (`quant_compiled`) is not in this file (the call's time limit cut it); a second run of the
# recorder on an H100 (`--only quant_compiled`) recorded it in full, `results/h100_quant_compiled.json`,
# which lesson 32 reads.
#
# ## 5 · Exercise: the fastest a token can be
#
# A model with 7 billion bf16 parameters serves one user (batch 1) on the recording's GPU. Using section 3's
# reasoning (every weight read once per token, at the datasheet bandwidth printed there), what is the lowest
# possible time per token, in milliseconds? Put your answer below.

# %% tags=["nbval-check-output"]
MY_FLOOR_MS = 1.0          # your answer (ms per token)

# %% tags=["nbval-check-output"]
answer_ms = 7e9 * 2 / (PEAK.gbps * 1e9) * 1e3
print("you said", MY_FLOOR_MS, "ms ->", "right" if abs(MY_FLOOR_MS / answer_ms - 1) < 0.05 else "look again")

# %% [markdown]
# **Solution check.** 14 GB over the H100's 3.35 TB/s is 4.2 ms, so at most about 240 tokens a second for
# one user, whatever the host does (on an H200, 4.8 TB/s: 2.9 ms). Larger batches share the weight read among users; int8 weights halve it.

# %%
assert abs(answer_ms - 14e9 / (PEAK.gbps * 1e9) * 1e3) < 1e-9 and PEAK.name == "H100 SXM"
print(f"answer: {answer_ms:.2f} ms a token, {1e3 / answer_ms:.0f} tokens/s at most")

# %% [markdown]
# ## 6 · Takeaways, asserted on the recording
#
# 1. At batch 1 the eager step is the host's: the CUDA graph of the same kernels, one launch call instead
#    of hundreds, ran a token several times faster, and compiled `reduce-overhead` likewise.
# 2. Compiling cost seconds before the first token (the first generation) where the graph's capture cost
#    a fraction of one; count the tokens to pay it back.
# 3. p99 is above p50 for every variant, and the first token of the first generation is far worse than
#    any p99 where something is built on first use: 17,000x the p50 for the compiled step (the compile),
#    90-160x for eager (CUDA and cuBLAS warming up); the hand-captured graph, captured before it, 1.9x.
#    Warm up a server before it takes traffic.
# 4. Int8 weights cannot save more per token than the bytes they do not read (55 us a token here), and they
#    may save nothing: on the H100 the compiled int8 step was 2.6x *slower* than compiled bf16, on the GPU's
#    side, not the host's. Measure the quantized step before serving it for latency.
# 5. The live CPU run: a growing cache slows token by token; a static one is flat.

# %% tags=["nbval-check-output"]
assert grow_ratio > 1.15 and grow_ratio > static_ratio + 0.1                        # 5 (live)
if SMOKE:
    print("a --smoke recording (CPU, tiny sizes): the GPU takeaways are not checked on it")
else:
    assert e["cuda_available"] and all("error" not in VAR[n] for n in NAMES)
    w = {n: VAR[n]["wall_ms"] for n in NAMES}
    assert w["eager_static"]["p50"] > 2 * w["cuda_graph"]["p50"]                    # 1: the host's share
    assert w["eager_static"]["p50"] > 2 * w["compiled"]["p50"]
    assert VAR["compiled"]["first_run_s"] > 10 * VAR["cuda_graph"]["capture_s"]     # 2: compile's price
    for n in NAMES:                                                                  # 3: the tail
        assert w[n]["max"] >= w[n]["p99"] >= w[n]["p50"]
    assert first_tokens("compiled")[0] > 100 * w["compiled"]["p99"]
    calls = {n: VAR[n]["per_token_launches"]["kernel_launch_calls"] + VAR[n]["per_token_launches"]["graph_launch_calls"]
             for n in ("eager_static", "cuda_graph")}
    assert calls["eager_static"] > 20 * calls["cuda_graph"]                         # 1: one launch, not hundreds
    q = VAR["compiled_int8"]                                                         # 4: int8's ceiling
    saved_ms = (mdl["weight_bytes"] - q["weight_bytes"]) / (PEAK.gbps * 1e9) * 1e3
    emb = mdl["embedding_bytes"]                                                     # embeddings stay bf16
    assert q["weight_bytes"] - emb < 0.55 * (mdl["weight_bytes"] - emb)
    assert w["compiled"]["p50"] - q["wall_ms"]["p50"] < saved_ms + 0.2 * w["compiled"]["p50"]
    assert q["wall_ms"]["p50"] > 2 * w["compiled"]["p50"]                           # 4: here int8 lost time,
    assert q["gpu_ms"]["p50"] > 0.9 * q["wall_ms"]["p50"]                            #    on the GPU's side
    assert q["argmax_agrees_with_eager_cat"] > 0.8
    assert first_tokens("cuda_graph")[0] < w["cuda_graph"]["p99"]                   # 3: the graph, captured before
    print(f"eager_static {w['eager_static']['p50']:.3f} ms -> cuda_graph {w['cuda_graph']['p50']:.3f} ms, compiled "
          f"{w['compiled']['p50']:.3f} ms, compiled int8 {q['wall_ms']['p50']:.3f} ms a token (p50)")

# %% [markdown]
# ## 7 · Rerun it live (GPU only)
#
# On a CUDA machine this runs the recorder's decode part (about a minute and a half; torchao is needed
# for the int8 row) into a temporary folder and prints the same table for your GPU. The quantization
# grid is its other part: `python benchmarks/record_lesson37_h200.py --out DIR --only quant_compiled`.

# %% tags=["nbval-skip"]
import json, os
from pathlib import Path

from workbench.lessons import checkout_recorder

recorder = checkout_recorder("record_lesson37_h200.py", "your own numbers") if GPU else None
if GPU and recorder is not None:
    import subprocess, sys, tempfile

    out = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, str(recorder), "--out", str(out), "--only", "decode"], check=True)
    mine = json.loads((out / "h200_lesson37.json").read_text())["decode"]["variants"]
    print(pd.DataFrame({n: {"p50 ms": v["wall_ms"]["p50"], "p99 ms": v["wall_ms"]["p99"], "tokens/s": v["tokens_per_s"]}
                        for n, v in mine.items() if "error" not in v}).T.round(3))
