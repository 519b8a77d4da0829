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

# %% tags=["nbval-check-output"]
rec = json.loads((RESULTS / "h200_lesson12.json").read_text())
env, params = rec["env"], rec["params"]
print("recorded with:\n" + pd.Series(env).astype(str).to_string())
assert (params["layers"], params["d"], params["batch"], params["seq"], params["vocab"]) == (2, 512, 16, 256, 2048)
assert rec["skipped_parts"] == [] and not rec["smoke"]
prec, bug, det = (rec["parts"][k] for k in ("precision", "planted_bug", "determinism"))
assert all("error" not in part for part in (prec, bug, det))
print("the TF32 switches in each GPU run:", {m: f["matmul.allow_tf32"] for m, f in prec["tf32_flags"].items()})

# %% [markdown]
# One row per way of running the step. The columns are: the loss's relative difference; the logits'
# `max_rel`; the worst and the median `max_rel` over the parameter gradients; the worst `norm_rel` over
# the gradients; the unit roundoff `u` of the format the matmuls round to; and the worst `max_rel` of
# all the tensors divided by that `u`.

# %% tags=["nbval-check-output"]
FORMAT = {"cpu_fp32": "fp32", "gpu_fp64": "fp64", "gpu_fp32": "fp32", "gpu_tf32": "tf32", "gpu_bf16_autocast": "bf16"}
worst = {m: e["worst_max_rel"] for m, e in prec["errors"].items()}
in_u = {m: worst[m] / UNIT_ROUNDOFF[FORMAT[m]] for m in worst}
h200 = pd.DataFrame({m: {"loss_rel": e["loss_rel_err"], "logits_max_rel": e["logits_max_rel"],
                         "grad_max_rel_worst": e["grad_max_rel_worst"],
                         "grad_max_rel_median": e["grad_max_rel_median"],
                         "grad_norm_rel_worst": e["grad_norm_rel_worst"],
                         "u": UNIT_ROUNDOFF[FORMAT[m]]}
                     for m, e in prec["errors"].items()}).T
print(f"reference loss (CPU fp64): {prec['reference_loss']:.6f}")
print(h200.map(lambda v: f"{v:.1e}").assign(worst_in_u=[f"{in_u[m]:.1f}" for m in h200.index]).to_string())

# %% [markdown]
# The rows form a ladder. GPU fp64 agrees with CPU fp64 close to fp64's own roundoff, so the device
# itself adds no error beyond rounding. GPU fp32 is on the same level as CPU fp32 (within a factor of 10
# of it). TF32 is far above both, and bf16 is higher again. Measured in its own format's `u`, every error
# is between 1 and 100 `u`: the size of each error is set by the format, not by the device. TF32 and bf16
# sit lowest in their own `u`, fp32 and fp64 higher (the last column). The cell checks these statements
# on the recording:

# %% tags=["nbval-check-output"]
assert worst["gpu_fp64"] < 1e3 * UNIT_ROUNDOFF["fp64"]                                  # no error beyond rounding
assert worst["gpu_fp32"] < 10 * worst["cpu_fp32"] and worst["cpu_fp32"] < 10 * worst["gpu_fp32"]  # same level
assert worst["gpu_bf16_autocast"] > worst["gpu_tf32"] > 10 * worst["gpu_fp32"]            # the ladder
assert all(1 < r < 100 for r in in_u.values()), in_u                                       # 1 to 100 u
assert max(in_u["gpu_tf32"], in_u["gpu_bf16_autocast"]) < min(in_u["cpu_fp32"], in_u["gpu_fp32"], in_u["gpu_fp64"])
print("worst max_rel in u:", {m: f"{r:.1f}" for m, r in in_u.items()})

# %% [markdown]
# Where the error sits: the six tensors with the largest bf16 error, with their error in the other modes
# (GPU fp64 left out).

# %% tags=["nbval-check-output"]
per = {m: {t.replace("grad:", ""): v["max_rel"] for t, v in e["per_tensor"].items()}
       for m, e in prec["errors"].items() if m != "gpu_fp64"}
per = pd.DataFrame(per).sort_values("gpu_bf16_autocast", ascending=False)
print(per.head(6).map(lambda v: f"{v:.1e}").to_string())

# %% [markdown]
# The harness's tolerances (`DEFAULT_TOLERANCE`, used by its numerical check) hold for every honest run:
# the logits within the tolerance of their format, the gradients within 10 times it.

# %% tags=["nbval-check-output"]
for m, fmt in FORMAT.items():
    if fmt != "fp64":
        e = prec["errors"][m]
        assert e["logits_max_rel"] <= DEFAULT_TOLERANCE[fmt] and e["grad_max_rel_worst"] <= 10 * DEFAULT_TOLERANCE[fmt], m
        print(f"{m:18s} logits {e['logits_max_rel']:.1e}, worst gradient {e['grad_max_rel_worst']:.1e}; "
              f"{fmt} tolerance {DEFAULT_TOLERANCE[fmt]:.0e}")

# %% [markdown]
# What the lower precisions cost in time at this size (CUDA events, median of the recorder's repetitions):
# neither TF32 nor bf16 autocast made this small step faster than fp32. Here they only add error. Where
# the matmuls are large enough to dominate a step, they do pay; notebook 31 measures that.

# %% tags=["nbval-check-output"]
step_ms = prec["gpu_step_ms_median"]
for m, ms in step_ms.items():
    print(f"{m:18s} {ms:.2f} ms per step, x{ms / step_ms['gpu_fp32']:.2f} the fp32 step")
assert step_ms["gpu_tf32"] >= step_ms["gpu_fp32"] and step_ms["gpu_bf16_autocast"] >= step_ms["gpu_fp32"]

# %% [markdown]
# ## 3 · A planted bug that only the comparison catches
#
# The bug: after the step, the loss, the logits and the gradients are brought to the host with
# `.to("cpu", non_blocking=True)` (e.g. for logging), and the host reads them straight away. On a GPU
# that copy is only *queued*. The call returns at once, and the host can read pinned memory that the copy
# engine has not written yet. On a CPU tensor, `non_blocking` means nothing and the same code is exact.
# The fix is one line: synchronise (or wait on an event recorded after the copies) before reading.

# %%
def gather_non_blocking(loss, logits, grads, sync):
    host = {"loss": loss.to("cpu", non_blocking=True), "logits": logits.to("cpu", non_blocking=True)}
    host.update({f"grad:{n}": g.to("cpu", non_blocking=True) for n, g in grads.items()})
    if sync and GPU and loss.is_cuda:
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
print("the recorder's CPU run of the same code, bitwise equal:", bug["cpu"]["bitwise_equal_to_blocking"])

# %% [markdown]
# On the H200, the recorder ran three trials: the step of section 2 (its "part 1"), then two new
# batches. Each trial ran the step, read it the buggy way, ran it again and read it the fixed way, and
# compared the two reads. "copies done" is whether an event recorded after the copies had completed
# when the host started reading.

# %% tags=["nbval-check-output"]
trials = pd.DataFrame({t["trial"]: {"batch": t["batch"], "copies done (buggy read)": t["copies_done_when_read"]["bug"],
                                    "tensors wrong": f"{t['tensors_wrong']} of {t['tensors']}",
                                    "elements wrong": f"{t['elements_wrong_fraction']:.0%}",
                                    "loss abs diff": f"{t['bug_vs_fixed']['loss_abs_diff']:.1e}",
                                    "logits max_rel": f"{t['bug_vs_fixed']['logits_max_rel']:.2f}",
                                    "grad max_rel worst": f"{t['bug_vs_fixed']['grad_max_rel_worst']:.1e}"}
                       for t in bug["gpu_trials"]}).T
trials.index.name = "trial"
print("the buggy read against the fixed read of the same step:")
print(trials.to_string())

# %% [markdown]
# The bug showed in one trial of three. In trial 0 the copies had finished before the host read, so the
# buggy read was exact. In trial 1 they had not all finished when the event was checked, yet every value
# came out right. In trial 2 the loss and the logits were wrong, while every gradient was exact. The
# wrong loss is not noise: it is, bit for bit, the loss of trial 1's batch. The pinned buffer still held
# the previous step's number. The logits were off by more than their largest value (`max_rel` above 1).
#
# So the error of a race is far larger than any precision's, but whether it shows depends on timing.
# One passing comparison does not clear the code: compare on several steps. The fixed read of trial 0 is
# the GPU fp32 row of section 2, bit for bit.

# %% tags=["nbval-check-output"]
t0, t1, t2 = bug["gpu_trials"]
shown = [t for t in bug["gpu_trials"] if t["tensors_wrong"] > 0]
assert [t["trial"] for t in shown] == [2]                                        # one trial of three
assert t0["copies_done_when_read"]["bug"] and t0["tensors_wrong"] == 0
assert not t1["copies_done_when_read"]["bug"] and t1["tensors_wrong"] == 0
assert all(t["copies_done_when_read"]["fixed"] for t in bug["gpu_trials"])
assert t2["tensors_wrong"] == 2 and t2["bug_vs_fixed"]["grad_max_rel_worst"] == 0.0     # loss + logits only
assert t2["bug_vs_fixed"]["loss_abs_diff"] > 0 and t2["bug_vs_fixed"]["logits_max_rel"] > 1
assert t2["bug_vs_fixed"]["loss"] == t1["bug_vs_fixed"]["loss"] and t1["bug_vs_fixed"]["loss_abs_diff"] == 0
assert t0["fixed_equals_part1_gpu_fp32"]
bug_err = t2["bug_vs_fixed"]["worst_max_rel"]
print(f"trial 2's buggy read of the loss: {t2['bug_vs_fixed']['loss']:.9f} = trial 1's loss "
      f"{t1['bug_vs_fixed']['loss']:.9f}; the right one differs by {t2['bug_vs_fixed']['loss_abs_diff']:.2e}")
print(f"worst max_rel of the bug: {bug_err:.2f}, x{bug_err / worst['gpu_bf16_autocast']:.0f} the bf16 error")

# %% [markdown]
# ## 4 · Deterministic algorithms
#
# Floating-point addition is not associative. A kernel that adds with atomics (`index_add_`,
# `scatter_add_`) adds in whatever order the threads arrive, so two runs can differ in the last bits.
# `torch.use_deterministic_algorithms(True)` swaps in kernels with a fixed order (slower ones). cuBLAS
# needs `CUBLAS_WORKSPACE_CONFIG=:4096:8` set before CUDA starts; the recorder sets it at the top of the
# process. On this CPU with one thread, `index_add_` is already reproducible:

# %% tags=["nbval-check-output"]
g = torch.Generator().manual_seed(3)
src = torch.randn(20_000, 16, generator=g)
idx = torch.randint(0, 64, (20_000,), generator=g)
a = torch.zeros(64, 16).index_add_(0, idx, src).numpy()
b = torch.zeros(64, 16).index_add_(0, idx, src).numpy()
print("CPU index_add_ twice, bitwise equal:", bitwise_equal(a, b))

# %% [markdown]
# On the H200, each op added 1,048,576 rows of 64 fp32 values into 1,024 output rows (1,024 adds per
# output on average). It ran twice in the default mode and twice in deterministic mode, timed with CUDA
# events (median of 10 runs), and its result was compared with the same sum in fp64. The model's whole
# step was also run twice in each mode.

# %% tags=["nbval-check-output"]
assert det["cublas_workspace_config"] == ":4096:8"
drows = {}
for op, r in det["ops"].items():
    assert (tuple(r["shape_in"]), r["out_rows"], r["mean_adds_per_output"]) == ((1_048_576, 64), 1024, 1024)
    for mode in ("default", "deterministic"):
        m = r[mode]
        drows[(op, mode)] = {"bitwise_equal": m["bitwise_equal"], "max_rel_diff": f"{m['max_rel_diff']:.1e}",
                             "elements_differ": f"{m['elements_differ_fraction']:.0%}",
                             "vs_fp64_max_rel": f"{m['vs_fp64_max_rel']:.1e}", "ms_median": f"{m['ms_median']:.3f}"}
print(pd.DataFrame(drows).T.to_string())
for op, r in det["ops"].items():
    print(f"{op}: deterministic mode x{r['deterministic_slowdown']:.1f} the time")
ms = det["model_step"]
for mode, m in ms.items():
    print(f"model step, {mode}: gradients bitwise equal across two runs: {m['bitwise_equal']}; {m['ms_median']:.2f} ms")
print(f"model step: deterministic mode x{ms['deterministic']['ms_median'] / ms['default']['ms_median']:.2f} the time")

# %% [markdown]
# In default mode most output elements differed between the two runs, but only at the level of
# rounding: far below the worst-case rounding of a 1,024-term fp32 sum (1,024 `u`). Deterministic mode
# gave the same bits twice, and its result is no closer to fp64 than the default one (within a factor
# of 2). It makes a run *repeatable*, not more *accurate*: use it to bisect a difference (the same input
# gives the same bits) and for reproducible tests. It cost time on both ops.
#
# The whole model step gave the same bits twice even in default mode, and the deterministic flag still
# made it slower. Whether a model needs the flag is therefore something to measure (run the step twice
# and compare the bits), as the recorder did.

# %% tags=["nbval-check-output"]
for op, r in det["ops"].items():
    n, d = r["default"], r["deterministic"]
    bound = r["mean_adds_per_output"] * UNIT_ROUNDOFF["fp32"]
    assert not n["bitwise_equal"] and n["elements_differ_fraction"] > 0.5, op       # most elements differ
    assert 0 < n["max_rel_diff"] < bound / 10, op                                    # ... far below n u
    assert d["bitwise_equal"] and d["max_abs_diff"] == 0.0, op                       # deterministic repeats
    assert 0.5 < d["vs_fp64_max_rel"] / n["vs_fp64_max_rel"] < 2, op                 # not more accurate
    assert r["deterministic_slowdown"] > 1, op                                       # slower
assert ms["default"]["bitwise_equal"] and ms["deterministic"]["bitwise_equal"]
assert ms["deterministic"]["ms_median"] > ms["default"]["ms_median"]
print(f"rounding bound of a {r['mean_adds_per_output']:.0f}-term fp32 sum: {bound:.1e}")

# %% [markdown]
# ## 5 · Exercise: one tolerance rule for every precision
#
# A check needs a tolerance per precision. One rule is `tolerance = K × u` of the format the matmuls
# round to (fp32, TF32 or bf16). Choose `K`. The rule must pass every honest run of section 2 (its worst
# `max_rel`), and it must flag an error as large as the bug's (trial 2, worst `max_rel` printed above)
# in any of the three formats.

# %%
K = 10          # your choice

# %% tags=["nbval-check-output"]
def check_rule(k):
    verdicts = {f"{m} passes": e["worst_max_rel"] <= k * UNIT_ROUNDOFF[FORMAT[m]] for m, e in prec["errors"].items()
                if FORMAT[m] != "fp64"}
    verdicts.update({f"bug-sized error flagged in {f}": bug_err > k * UNIT_ROUNDOFF[f] for f in ("fp32", "tf32", "bf16")})
    return verdicts


for what, ok in check_rule(K).items():
    print(f"{what:34s} {'yes' if ok else 'NO'}")
print(f"K = {K}:", "right: every honest run passes and the bug is flagged" if all(check_rule(K).values())
      else "not yet, try another K")

# %% [markdown]
# **Solution check.** The smallest K that passes every honest run is set by the honest run with the most
# `u` (GPU fp32). The largest K that still flags the bug is set by the coarsest format (bf16): above it,
# `K × u` of bf16 exceeds the bug's error. Any K between them works, and one rule scaled by each format's
# roundoff covers fp32, TF32 and bf16.

# %% tags=["nbval-check-output"]
k_min = max(in_u[m] for m in in_u if FORMAT[m] != "fp64")
k_max = bug_err / UNIT_ROUNDOFF["bf16"]
print(f"K must be at least {k_min:.1f} and below {k_max:.0f}")
assert k_min == in_u["gpu_fp32"] and k_min < k_max
for k in (k_min, float(np.sqrt(k_min * k_max))):
    assert all(check_rule(k).values()), k
assert not all(check_rule(k_min / 2).values()) and not all(check_rule(2 * k_max).values())

# %% [markdown]
# ## On a GPU: the comparison live
#
# With a CUDA device, these cells run the section-1 step on it in fp32, TF32 and bf16, compare each with
# CPU fp64, and then try the planted bug once on a GPU-bound step. The bug is a race, so one try may not
# catch it: the H200 recording caught it in 1 of its 3 trials (section 3), and the executed copy of this
# notebook in `docs/h200_notebooks/` read all copies complete (max_rel 0). Skipped on a CPU.

# %% tags=["nbval-skip"]
if GPU:
    live_gpu = {}
    for name, tf32, bf16 in (("gpu_fp32", False, False), ("gpu_tf32", True, False), ("gpu_bf16", False, True)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        live_gpu[name] = to_host(*run_step(copy_of(base, torch.float32, "cuda"), tokens.cuda(), targets.cuda(), bf16))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    live_errors = error_table({**{"cpu_fp32": cpu["cpu_fp32"]}, **live_gpu}, ref)
    display(live_errors.map(lambda v: f"{v:.1e}"))
    w = live_errors.loc["(worst)"]
    # the recording's ladder, on this GPU: fp32 at CPU fp32's level, bf16 far above both, all within 100 u
    assert w["gpu_fp32"] < 10 * w["cpu_fp32"] and w["gpu_bf16"] > 10 * w["gpu_fp32"], w
    assert w["gpu_fp32"] < 100 * UNIT_ROUNDOFF["fp32"] and w["gpu_bf16"] < 100 * UNIT_ROUNDOFF["bf16"], w

# %% tags=["nbval-skip"]
if GPU:
    # a GPU-bound step makes the race visible: the copies queue behind the backward's kernels
    torch.manual_seed(0)
    big = LM(layers=2, d=512, heads=8, vocab=2048, max_seq=256).cuda()
    tk, tg = torch.randint(0, 2048, (16, 256), device="cuda"), torch.randint(0, 2048, (16, 256), device="cuda")
    fixed = gather_non_blocking(*run_step(big, tk, tg), sync=True)
    buggy = gather_non_blocking(*run_step(big, tk, tg), sync=False)
    worst_bug = max(max_rel_err(buggy[k], fixed[k]) for k in fixed)
    print("buggy read vs fixed read, worst max_rel:", f"{worst_bug:.1e}",
          "(the race showed)" if worst_bug > 0 else "(the copies finished first this time: the race did not show)")

# %% [markdown]
# ## Takeaways
#
# - Check a new device or precision with one step against a float64 reference, tensor by tensor. Use
#   errors scaled by the tensor (`max_rel_err`, `norm_rel_err`), not elementwise ones.
# - Precision errors follow the unit roundoff: fp64 ≪ fp32 ≪ TF32 < bf16, each between 1 and 100 `u` of
#   its format. GPU fp32 is as close to fp64 as CPU fp32 is.
# - A bug shows as an error far above its precision's. The non_blocking read cannot be seen on a CPU,
#   and on the GPU it showed in one trial of three: compare more than one step.
# - Atomics make GPU runs differ at the rounding level. Deterministic mode makes them repeat bit for bit
#   at a cost in time, not in accuracy.

# %% tags=["nbval-check-output"]
assert cpu_bug_exact and bug["cpu"]["bitwise_equal_to_blocking"]         # the bug is invisible on a CPU
assert UNIT_ROUNDOFF["fp32"] / 10 < worst_live < DEFAULT_TOLERANCE["fp32"]
assert worst["gpu_fp64"] < worst["cpu_fp32"] / 1e3 and worst["gpu_fp32"] * 10 < worst["gpu_tf32"] < worst["gpu_bf16_autocast"]
assert all(1 < r < 100 for r in in_u.values())
assert worst["gpu_fp32"] < 10 * worst["cpu_fp32"] and worst["cpu_fp32"] < 10 * worst["gpu_fp32"]
assert bug_err > 100 * worst["gpu_bf16_autocast"] and len(shown) == 1 < len(bug["gpu_trials"])
assert all(r["deterministic"]["bitwise_equal"] and not r["default"]["bitwise_equal"] and r["deterministic_slowdown"] > 1
           for r in det["ops"].values())
print("ladder (worst max_rel):", {m: f"{v:.1e}" for m, v in worst.items()})
print(f"bug: {bug_err:.2f}, x{bug_err / worst['gpu_bf16_autocast']:.0f} the bf16 error, in {len(shown)} of "
      f"{len(bug['gpu_trials'])} trials")
