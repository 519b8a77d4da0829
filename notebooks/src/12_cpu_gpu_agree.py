# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12 · CPU and GPU agree: checking one step against float64
#
# A model moved to the GPU, or to TF32 or bf16, gives different numbers. Some of the difference is
# rounding, which is expected, and some may be a bug. You can only tell them apart by measuring: run
# **one step** (forward and backward) in float64 on the CPU as the reference, run the same step in the
# precision you care about, and compare every output and every gradient. The rounding error of each
# format has a known size (its *unit roundoff*), so a precision error has a typical size too. A bug
# usually makes an error far larger than that.
#
# How to compare two tensors. The elementwise `|a - b| / |ref|` blows up wherever the reference is close
# to zero, and gradients hold many such elements. This lesson uses the workbench's two errors scaled by
# the tensor's size (`workbench.analysis.numerics`, the same definition as the harness's numerical check):
#
# - `max_rel_err(x, ref)` = max|x − ref| / max|ref|: the worst element, measured against the tensor's scale;
# - `norm_rel_err(x, ref)` = ‖x − ref‖₂ / ‖ref‖₂: the error of the tensor as a whole.
#
# Sections: (1) the check live on this CPU, fp32 against fp64; (2) the same step on an H200 in fp64, fp32,
# TF32 and bf16 (`benchmarks/record_lesson12_h200.py`); (3) a planted bug that only the comparison
# catches; (4) deterministic algorithms; (5) an exercise; then a live GPU version and the takeaways.

# %%
# Setup (workbench/lessons.py): quiet logs, seeds, one CPU thread without a GPU, pandas display.
from workbench.lessons import setup, GIB, MIB, RESULTS
setup()
import json
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from workbench.analysis.numerics import (UNIT_ROUNDOFF, bitwise_equal, error_table, max_rel_err, norm_rel_err,
                                         unit_roundoff)
from workbench.analysis.experiment import DEFAULT_TOLERANCE
from workbench.capture.models import LM
GPU = torch.cuda.is_available()  # True: live CUDA runs; False: recorded H200 numbers and CPU runs

# %% [markdown]
# ## 1 · The check on this CPU: fp32 against fp64
#
# The model is the workbench's transformer (`workbench.capture.models.LM`), small here so that the
# step takes a fraction of a second. The weights are made once in fp32. The fp64 reference is a copy
# of them cast up, which is exact, so both runs start from the same numbers and only the arithmetic
# differs. `run_step` does one forward and backward with a cross-entropy loss. `to_host` brings the
# loss, the logits and every gradient to the host as float64 arrays.

# %%
def run_step(model, tokens, targets, autocast_bf16=False):
    model.zero_grad(set_to_none=True)
    dev = next(model.parameters()).device
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast_bf16):
        logits = model(tokens)
        wide = logits if logits.dtype == torch.float64 else logits.float()
        loss = F.cross_entropy(wide.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach(), logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def to_host(loss, logits, grads):
    out = {"loss": loss.double().cpu().numpy(), "logits": logits.double().cpu().numpy()}
    out.update({f"grad:{n}": g.double().cpu().numpy() for n, g in grads.items()})
    return out


def copy_of(base, dtype, device="cpu"):
    torch.manual_seed(0)
    m = LM(layers=2, d=64, heads=4, vocab=256, max_seq=32).to(dtype)
    m.load_state_dict({k: v.to(dtype) for k, v in base.state_dict().items()})
    return m.to(device)


torch.manual_seed(0)
base = LM(layers=2, d=64, heads=4, vocab=256, max_seq=32)          # fp32 weights
gen = torch.Generator().manual_seed(1)
tokens = torch.randint(0, 256, (4, 32), generator=gen)
targets = torch.randint(0, 256, (4, 32), generator=gen)

cpu = {"cpu_fp64": to_host(*run_step(copy_of(base, torch.float64), tokens, targets)),
       "cpu_fp32": to_host(*run_step(copy_of(base, torch.float32), tokens, targets))}
ref = cpu["cpu_fp64"]
print(f"{len(ref)} tensors compared: the loss, the logits and {len(ref) - 2} parameter gradients")

# %% [markdown]
# `error_table` puts one row per tensor and one column per candidate. The printed floats depend on the
# CPU (vector width, the BLAS library), so the cell below is not compared by the tests; the assertions
# after it check the bounds instead.

# %% tags=["nbval-ignore-output"]
live = pd.DataFrame({"max_rel": error_table({"cpu_fp32": cpu["cpu_fp32"]}, ref)["cpu_fp32"],
                     "norm_rel": error_table({"cpu_fp32": cpu["cpu_fp32"]}, ref, metric="norm_rel")["cpu_fp32"]})
print(live.map(lambda v: f"{v:.1e}").to_string())
print(f"fp32 unit roundoff u = {UNIT_ROUNDOFF['fp32']:.1e}; worst max_rel = "
      f"{live.loc['(worst)', 'max_rel'] / UNIT_ROUNDOFF['fp32']:.1f} u")

# %% [markdown]
# Each fp32 error is a small multiple of the unit roundoff (the ratio is printed below). It is more
# than one roundoff because the rounding errors of long dot products and of the layers add up, and it
# is never zero. The harness's fp32 tolerance (`DEFAULT_TOLERANCE["fp32"]`) leaves a wide margin above it:

# %% tags=["nbval-check-output"]
worst_live = live.loc["(worst)", "max_rel"]
assert UNIT_ROUNDOFF["fp32"] / 10 < worst_live < DEFAULT_TOLERANCE["fp32"], worst_live
assert (live["norm_rel"] <= live["max_rel"] * 10).all()
print(f"CPU fp32 vs fp64: worst max_rel between u/10 = {UNIT_ROUNDOFF['fp32'] / 10:.1e} and the harness's "
      f"fp32 tolerance {DEFAULT_TOLERANCE['fp32']:.0e}")

# %% [markdown]
# ## 2 · The same step on an H200
#
# `benchmarks/record_lesson12_h200.py` ran this step on an H200, with a larger model (2 layers,
# d = 512, batch 16 × 256 tokens, vocabulary 2048), in six ways. It used CPU fp64 (the reference),
# CPU fp32, GPU fp64, GPU fp32 with TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False` and
# `torch.backends.cudnn.allow_tf32 = False`), GPU TF32 (matmuls on tensor cores with a 10-bit mantissa),
# and GPU bf16 autocast. Each run is compared with CPU fp64, tensor by tensor.

# %%
REC_PATH = RESULTS / "h200_lesson12.json"
RECORDED = REC_PATH.exists()
if RECORDED:
    rec = json.loads(REC_PATH.read_text())
    env = rec["env"]
    print(f"recorded on {env['gpu']} (driver {env.get('driver')}, torch {env['torch']}, CUDA {env['cuda']}, "
          f"cuDNN {env['cudnn']}, {env['date'][:10]}); CPU: {env.get('cpu')}, {env['cpu_threads']} threads")
    prec, bug, det = (rec["parts"].get(k, {}) for k in ("precision", "planted_bug", "determinism"))
else:
    print("The H200 recording is pending: run `python benchmarks/record_lesson12_h200.py --out DIR` on a GPU "
          "and copy DIR/h200_lesson12.json into workbench/samples/results/.")

# %% [markdown]
# One row per way of running the step. The columns are: the loss's relative difference; the logits'
# `max_rel`; the worst and the median `max_rel` over the parameter gradients; the worst `norm_rel` over
# the gradients; and the unit roundoff of the format the matmuls round to.

# %% tags=["nbval-check-output"]
FORMAT = {"cpu_fp32": "fp32", "gpu_fp64": "fp64", "gpu_fp32": "fp32", "gpu_tf32": "tf32", "gpu_bf16_autocast": "bf16"}
if RECORDED:
    h200 = pd.DataFrame({m: {"loss_rel": e["loss_rel_err"], "logits_max_rel": e["logits_max_rel"],
                             "grad_max_rel_worst": e["grad_max_rel_worst"],
                             "grad_max_rel_median": e["grad_max_rel_median"],
                             "grad_norm_rel_worst": e["grad_norm_rel_worst"],
                             "unit_roundoff": UNIT_ROUNDOFF[FORMAT[m]]}
                         for m, e in prec["errors"].items()}).T
    print(f"reference loss (CPU fp64): {prec['reference_loss']:.6f}")
    print(h200.map(lambda v: f"{v:.1e}").to_string())

# %% [markdown]
# The rows form a ladder. GPU fp64 agrees with CPU fp64 close to fp64's own roundoff, so the device
# itself adds no error. GPU fp32 is on the same level as CPU fp32. TF32 is far above both, and bf16
# is higher again. Each precision's error scales with its unit roundoff. The largest gradient errors
# sit in a few tensors; the table below ranks each gradient by its bf16 error:

# %% tags=["nbval-check-output"]
if RECORDED:
    per = {m: {t.replace("grad:", ""): v["max_rel"] for t, v in e["per_tensor"].items()}
           for m, e in prec["errors"].items() if m != "gpu_fp64"}
    per = pd.DataFrame(per).sort_values("gpu_bf16_autocast", ascending=False)
    print(per.head(6).map(lambda v: f"{v:.1e}").to_string())

# %% [markdown]
# ## 3 · A planted bug that only the comparison catches
#
# The bug: after the step, the loss, the logits and the gradients are brought to the host with
# `.to("cpu", non_blocking=True)` (e.g. for logging), and the host reads them straight away. On a GPU
# that copy is only *queued*. The call returns at once, and the host reads pinned memory that the copy
# engine has not written yet. On a CPU tensor, `non_blocking` means nothing and the same code is exact.
# The fix is one line: synchronise (or wait on an event recorded after the copies) before reading.

# %%
def gather_non_blocking(loss, logits, grads, sync):
    host = {"loss": loss.to("cpu", non_blocking=True), "logits": logits.to("cpu", non_blocking=True)}
    host.update({f"grad:{n}": g.to("cpu", non_blocking=True) for n, g in grads.items()})
    if sync and loss.is_cuda:
        torch.cuda.synchronize()                        # the fix
    return {k: v.double().numpy() for k, v in host.items()}   # reads the host memory now

# %% [markdown]
# Run on this CPU, the buggy code gives the same bytes as the blocking copy. A test suite that runs
# on CPUs would pass:

# %% tags=["nbval-check-output"]
out = run_step(copy_of(base, torch.float32), tokens, targets)
buggy_cpu, blocking_cpu = gather_non_blocking(*out, sync=False), to_host(*out)
cpu_bug_exact = all(bitwise_equal(buggy_cpu[k], blocking_cpu[k]) for k in ref)
print("CPU: the buggy read is bitwise equal to the blocking copy:", cpu_bug_exact)

# %% [markdown]
# On the H200, the recorder ran the buggy read and the fixed read after the same step. "Copies done when
# read" is whether an event recorded after the copies had completed by the time the host read.

# %% tags=["nbval-check-output"]
if RECORDED:
    t0 = bug["gpu_trials"][0]
    rows = {"GPU fp32, fixed read": t0["fixed_vs_fp64"], "GPU fp32, buggy read": t0["bug_vs_fp64"],
            "GPU bf16 autocast (for scale)": prec["errors"]["gpu_bf16_autocast"]}
    bug_table = pd.DataFrame({k: {c: v[c] for c in ("loss_rel_err", "logits_max_rel", "grad_max_rel_worst",
                                                     "worst_max_rel")} for k, v in rows.items()}).T
    print(bug_table.map(lambda v: f"{v:.1e}").to_string())
    print("copies done when read:", t0["copies_done_when_read"], "| tensors wrong:",
          f"{t0['tensors_wrong']} of {t0['tensors']}, elements wrong: {t0['elements_wrong_fraction']:.0%}")
    print("the recorder's CPU run of the same code is bitwise exact:", bug["cpu"]["bitwise_equal_to_blocking"])
    for t in bug["gpu_trials"][1:]:
        print(f"trial {t['trial']} ({t['batch']}): buggy vs fixed worst max_rel {t['bug_vs_fixed']['worst_max_rel']:.1e}, "
              f"copies done when read: {t['copies_done_when_read']['bug']}")

# %% [markdown]
# The buggy read is wrong by far more than any precision explains: it is not a rounding effect, it is
# reading the wrong memory. The later trials show the bug does not go away on a new batch. Whatever the
# pinned buffer held before (fresh zeroed memory, or the previous step's numbers) is what the host reads.
# Only the comparison with a reference catches this, because a CPU-only test runs the same code exactly.

# %% [markdown]
# ## 4 · Deterministic algorithms
#
# Floating-point addition is not associative. A kernel that adds with atomics (`index_add_`,
# `scatter_add_`, embedding backward) adds in whatever order the threads arrive, so two runs can differ
# in the last bits. `torch.use_deterministic_algorithms(True)` swaps in kernels with a fixed order
# (slower ones, usually sort-based). cuBLAS needs `CUBLAS_WORKSPACE_CONFIG=:4096:8` set before CUDA
# starts; the recorder sets it at the top of the process. On this CPU with one thread, `index_add_`
# is already reproducible:

# %% tags=["nbval-check-output"]
g = torch.Generator().manual_seed(3)
src = torch.randn(20_000, 16, generator=g)
idx = torch.randint(0, 64, (20_000,), generator=g)
a = torch.zeros(64, 16).index_add_(0, idx, src).numpy()
b = torch.zeros(64, 16).index_add_(0, idx, src).numpy()
print("CPU index_add_ twice, bitwise equal:", bitwise_equal(a, b))

# %% [markdown]
# On the H200, each op was run twice in the default mode and twice in deterministic mode, and timed
# with CUDA events (median of 10 runs). Its result was also compared with the same op in fp64. The
# model's whole step was run twice in each mode as well.

# %% tags=["nbval-check-output"]
if RECORDED:
    drows = {}
    for op, r in det["ops"].items():
        for mode in ("default", "deterministic"):
            m = r[mode]
            if "error" in m:
                drows[(op, mode)] = {"error": m["error"][:60]}
                continue
            drows[(op, mode)] = {"bitwise_equal": m["bitwise_equal"], "max_rel_diff": f"{m['max_rel_diff']:.1e}",
                                 "elements_differ": f"{m['elements_differ_fraction']:.0%}",
                                 "vs_fp64_max_rel": f"{m['vs_fp64_max_rel']:.1e}", "ms_median": f"{m['ms_median']:.3f}"}
    print(pd.DataFrame(drows).T.to_string())
    for op, r in det["ops"].items():
        if "deterministic_slowdown" in r:
            print(f"{op}: {r['shape_in'][0]:,} rows into {r['out_rows']} ({r['mean_adds_per_output']:.0f} adds per "
                  f"output); deterministic mode x{r['deterministic_slowdown']:.1f} the time")
    for mode, m in det.get("model_step", {}).items():
        if isinstance(m, dict) and "bitwise_equal" in m:
            print(f"model step, {mode}: gradients bitwise equal across two runs: {m['bitwise_equal']}"
                  + ("" if m["bitwise_equal"] else f" ({len(m['tensors_differ'])} tensors differ, worst max_rel "
                                                   f"{m['worst_max_rel_diff']:.1e})") + f"; {m['ms_median']:.2f} ms")
        elif isinstance(m, dict):
            print(f"model step, {mode}: {m.get('error', m.get('skipped', ''))[:120]}")

# %% [markdown]
# The nondeterministic runs differ only at the level of rounding, and so does the deterministic result
# against fp64. Deterministic mode makes a run *repeatable*; it does not make it more *accurate*. Use it
# to bisect a difference (the same input gives the same bits) and to get reproducible tests. Its cost is
# in the time column.

# %% [markdown]
# ## 5 · Exercise: one tolerance rule for every precision
#
# A check needs a tolerance per precision. One rule is `tolerance = K × unit roundoff` of the format the
# matmuls round to (fp32, TF32 or bf16). Choose `K`. The rule must pass every honest run in the H200
# table (its `worst_max_rel`) and fail the buggy read, which was a GPU fp32 run.

# %%
K = 10          # your choice

# %% tags=["nbval-check-output"]
def check_rule(k):
    if not RECORDED:
        return None
    verdicts = {m: e["worst_max_rel"] <= k * UNIT_ROUNDOFF[FORMAT[m]] for m, e in prec["errors"].items()
                if FORMAT[m] != "fp64"}
    verdicts["buggy read (fp32)"] = bug["gpu_trials"][0]["bug_vs_fp64"]["worst_max_rel"] <= k * UNIT_ROUNDOFF["fp32"]
    return verdicts


verdicts = check_rule(K)
if verdicts:
    for m, ok in verdicts.items():
        print(f"{m:22s} {'passes' if ok else 'FAILS'}")
    good = all(v for m, v in verdicts.items() if m != "buggy read (fp32)") and not verdicts["buggy read (fp32)"]
    print(f"K = {K}:", "right: every honest run passes and the bug fails" if good else "not yet, try another K")

# %% [markdown]
# **Solution check.** From the table: the smallest K that passes every honest run, and the largest that
# still fails the bug. Any K between them works. Because the gap is wide, one rule scaled by each
# format's roundoff covers fp32, TF32 and bf16.

# %% tags=["nbval-check-output"]
if RECORDED:
    k_min = max(e["worst_max_rel"] / UNIT_ROUNDOFF[FORMAT[m]] for m, e in prec["errors"].items() if FORMAT[m] != "fp64")
    k_max = bug["gpu_trials"][0]["bug_vs_fp64"]["worst_max_rel"] / UNIT_ROUNDOFF["fp32"]
    print(f"K must be at least {k_min:.0f} and below {k_max:.1e}")
    k_mid = float(np.sqrt(k_min * k_max))
    assert all(v for m, v in check_rule(k_mid).items() if m != "buggy read (fp32)")
    assert not check_rule(k_mid)["buggy read (fp32)"]

# %% [markdown]
# ## On a GPU: the comparison live
#
# With a CUDA device, these cells run the section-1 step on it in fp32, TF32 and bf16, compare each with
# CPU fp64, and then show the planted bug. Skipped on a CPU.

# %% tags=["nbval-skip"]
if GPU:
    live_gpu = {}
    for name, tf32, bf16 in (("gpu_fp32", False, False), ("gpu_tf32", True, False), ("gpu_bf16", False, True)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        live_gpu[name] = to_host(*run_step(copy_of(base, torch.float32, "cuda"), tokens.cuda(), targets.cuda(), bf16))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    display(error_table({**{"cpu_fp32": cpu["cpu_fp32"]}, **live_gpu}, ref).map(lambda v: f"{v:.1e}"))

# %% tags=["nbval-skip"]
if GPU:
    # a GPU-bound step makes the race visible: the copies queue behind the backward's kernels
    torch.manual_seed(0)
    big = LM(layers=2, d=512, heads=8, vocab=2048, max_seq=256).cuda()
    tk, tg = torch.randint(0, 2048, (16, 256), device="cuda"), torch.randint(0, 2048, (16, 256), device="cuda")
    fixed = gather_non_blocking(*run_step(big, tk, tg), sync=True)
    buggy = gather_non_blocking(*run_step(big, tk, tg), sync=False)
    print("buggy read vs fixed read, worst max_rel:", f"{max(max_rel_err(buggy[k], fixed[k]) for k in fixed):.1e}")

# %% [markdown]
# ## Takeaways
#
# - Check a new device or precision with one step against a float64 reference, tensor by tensor. Use
#   errors scaled by the tensor (`max_rel_err`, `norm_rel_err`), not elementwise ones.
# - Precision errors follow the unit roundoff: fp64 ≪ fp32 ≪ TF32 < bf16. GPU fp32 is as close to fp64
#   as CPU fp32 is.
# - A bug shows as an error far above its precision's. The non_blocking read cannot be seen on a CPU,
#   only in the comparison.
# - Atomics make GPU runs differ at the rounding level. Deterministic mode makes them repeat bit for bit
#   at a cost in time, not in accuracy.

# %% tags=["nbval-check-output"]
assert cpu_bug_exact                                                   # the bug is invisible on a CPU
assert UNIT_ROUNDOFF["fp32"] / 10 < worst_live < DEFAULT_TOLERANCE["fp32"]
if RECORDED:
    e = {m: v["worst_max_rel"] for m, v in prec["errors"].items()}
    assert e["gpu_fp64"] < 1e3 * UNIT_ROUNDOFF["fp64"]                    # the device adds nothing
    assert e["gpu_fp32"] < 10 * e["cpu_fp32"] and e["cpu_fp32"] < 10 * e["gpu_fp32"]   # same level
    assert e["gpu_bf16_autocast"] > e["gpu_tf32"] > 10 * e["gpu_fp32"]      # the ladder
    for m in ("cpu_fp32", "gpu_fp32", "gpu_tf32", "gpu_bf16_autocast"):    # the harness's tolerances hold
        assert prec["errors"][m]["logits_max_rel"] <= DEFAULT_TOLERANCE[FORMAT[m]], m
        assert prec["errors"][m]["grad_max_rel_worst"] <= 10 * DEFAULT_TOLERANCE[FORMAT[m]], m
    t0 = bug["gpu_trials"][0]
    assert bug["cpu"]["bitwise_equal_to_blocking"] and t0["copies_done_when_read"]["fixed"]
    assert t0["bug_vs_fp64"]["worst_max_rel"] > 10 * e["gpu_bf16_autocast"]  # the bug >> any precision
    assert t0["fixed_vs_fp64"]["worst_max_rel"] < 10 * e["gpu_fp32"]
    for op, r in det["ops"].items():
        n, d = r["default"], r["deterministic"]
        assert d["bitwise_equal"], op                                      # deterministic mode repeats
        bound = r["mean_adds_per_output"] * UNIT_ROUNDOFF["fp32"]          # a sum's worst-case rounding scale
        assert n["max_rel_diff"] < bound and n["vs_fp64_max_rel"] < bound and d["vs_fp64_max_rel"] < bound, op
    print("ladder (worst max_rel):", {m: f"{v:.1e}" for m, v in e.items()})
    print(f"bug: {t0['bug_vs_fp64']['worst_max_rel']:.1e}, "
          f"x{t0['bug_vs_fp64']['worst_max_rel'] / e['gpu_bf16_autocast']:.0f} the bf16 error")
