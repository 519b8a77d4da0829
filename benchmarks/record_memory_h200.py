"""Record the memory v2 test data on a CUDA GPU (issue 21; made for the H200).

Run from the repository root (torch only, no other package; about 1-2 minutes)::

    python benchmarks/record_memory_h200.py --out DIR
    python benchmarks/record_memory_h200.py --out DIR --parts sweep     # the cuDNN sweep alone (< 60 s)

Everything goes to ``DIR`` (local paths are stripped from stacks: repository files become relative,
site-packages files ``site-packages/...``, the standard library ``python/lib/python3.X/...``):

- ``oom_*.snapshot.pickle.gz`` + ``oom_*.json``: out-of-memory snapshots written from inside the OOM
  observer, each in its own process with ``PYTORCH_CUDA_ALLOC_CONF`` set and a per-process cap
  (``torch.cuda.set_per_process_memory_fraction``), allocator history on (python stacks):

  * ``oom_forward`` / ``oom_forward_expandable``: a 16-block decoder-only LM (examples/estimate_families.py
    ``DecoderLM``, d=1024) trained with AdamW at a batch that dies part way through the first forward; the
    JSON says in which block it died (forward pre-hooks), torch's message, and the largest batch whose
    two full training steps fit under the same cap (searched for real afterwards: the truth for the
    post-mortem's batch advice). Expandable segments off / on.
  * ``oom_fragmented`` / ``oom_fragmented_expandable`` / ``oom_fragmented_settings``: a request that fails
    although the free memory inside reserved segments is larger than it (holes between live blocks);
    the same pattern with expandable segments on (does it still fail? the truth for the advice), and with
    ``max_split_size_mb``, ``garbage_collection_threshold`` and ``roundup_power2_divisions`` set (so a
    post-mortem has all four settings to read).
- ``pair_fp32.snapshot.pickle.gz`` / ``pair_bf16.snapshot.pickle.gz`` + ``pair_*.json``: before/after pair,
  3 AdamW steps of one decoder-only LM in fp32 and in bf16 autocast, each step inside
  ``record_function("ProfilerStep#N")`` (so the snapshot's ``external_annotations`` mark the steps);
  history starts after the model and optimizer exist (parameters predate the recording, AdamW's state is
  born inside it). JSON: ``torch.cuda.max_memory_allocated/reserved`` over the run and per step, parameter
  and optimizer-state addresses and sizes (the truth for inferring what predates the recording).
- ``families.json``: for the estimator's families (MLP, CNN, U-Net, LSTM, transformer encoder,
  decoder-only LM) in fp32 and bf16, ``max_memory_allocated/reserved`` of two AdamW steps
  (``workbench.capture.estimate.measure_step_memory``), and per op, from a second run under a dispatch
  mode, what each convolution / cuDNN RNN op allocated: outputs, and the transient peak above them
  (the workspace cuDNN asked for).
- ``cudnn_sweep.json``: the same per-op numbers for a sweep of convolution shapes (forward and backward)
  and of LSTM shapes (``_cudnn_rnn`` reserve space, workspace, weight buffer), fp32 and bf16.
- ``env.json``: GPU, torch, CUDA, cuDNN version and ``torch.backends.cudnn`` settings, wall times.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import json
import os
import pickle
import platform
import subprocess
import sys
import sysconfig
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

# --- path stripping ---------------------------------------------------------------------------------
_STDLIB = sysconfig.get_paths().get("stdlib", "")
_PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"


def strip_path(fn: str) -> str:
    if not isinstance(fn, str) or not fn:
        return fn
    root = str(ROOT) + os.sep
    if fn.startswith(root):
        return fn[len(root):]
    for marker in ("site-packages/", "dist-packages/"):
        i = fn.find(marker)
        if i >= 0:
            return "site-packages/" + fn[i + len(marker):]
    if _STDLIB and fn.startswith(_STDLIB + os.sep):
        return f"python/lib/{_PYVER}/" + fn[len(_STDLIB) + 1:]
    if fn.startswith("<"):
        return fn
    return os.path.basename(fn)


def _strip_frames(frames):
    for fr in frames or ():
        if isinstance(fr, dict) and "filename" in fr:
            fr["filename"] = strip_path(fr["filename"])


def strip_snapshot(snap: dict) -> dict:
    for seg in snap.get("segments", ()):
        _strip_frames(seg.get("frames"))
        for blk in seg.get("blocks", ()):
            _strip_frames(blk.get("frames"))
    for trace in snap.get("device_traces", ()):
        for e in trace:
            _strip_frames(e.get("frames"))
    return snap


def save_snapshot(snap: dict, path: Path) -> None:
    with gzip.open(path, "wb", compresslevel=9) as f:
        pickle.dump(strip_snapshot(snap), f, protocol=4)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _settings() -> dict:
    b = torch.backends
    return {
        "cudnn_enabled": b.cudnn.enabled, "cudnn_benchmark": b.cudnn.benchmark,
        "cudnn_deterministic": b.cudnn.deterministic, "cudnn_allow_tf32": b.cudnn.allow_tf32,
        "matmul_allow_tf32": b.cuda.matmul.allow_tf32, "cudnn_version": b.cudnn.version(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


# --- per-op memory under a dispatch mode ---------------------------------------------------------------
_CUDNN_OPS = {"convolution", "convolution_backward", "cudnn_convolution", "cudnn_convolution_transpose",
              "_cudnn_rnn", "_cudnn_rnn_backward", "_cudnn_rnn_flatten_weight", "cudnn_batch_norm",
              "cudnn_batch_norm_backward", "_convolution"}


def _describe(x):
    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""), "nbytes": x.untyped_storage().nbytes()}
    if isinstance(x, (list, tuple)):
        if len(x) > 12:
            return f"<{len(x)} items>"
        return [_describe(v) for v in x]
    if isinstance(x, (int, float, bool, str)) or x is None:
        return x
    return str(x)


class OpMemory(TorchDispatchMode):
    """For each cuDNN-family op (and any other op whose transient peak passes ``min_transient``):
    allocated before, the peak during, allocated after, the bytes of its new output storages."""

    def __init__(self, min_transient: int = MiB):
        super().__init__()
        self.rows: list[dict] = []
        self.min_transient = min_transient
        self.phase = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        in_storages = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        peak = torch.cuda.max_memory_allocated()
        after = torch.cuda.memory_allocated()
        seen, out_bytes = set(), 0
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                key = t.untyped_storage()._cdata
                if key not in in_storages and key not in seen:
                    seen.add(key)
                    out_bytes += t.untyped_storage().nbytes()
        transient = peak - after
        if name in _CUDNN_OPS or transient >= self.min_transient:
            self.rows.append({
                "op": name, "phase": self.phase, "allocated_before": before, "peak": peak, "allocated_after": after,
                "output_bytes": out_bytes, "transient_bytes": transient,
                "args": _describe(list(args)), "kwargs": {k: _describe(v) for k, v in kwargs.items()},
                "outputs": _describe(list(out) if isinstance(out, (list, tuple)) else [out]),
            })
        return out


# --- the OOM children ------------------------------------------------------------------------------------
def _cap(fraction_bytes: int) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, fraction_bytes / total), 0)


def _observer(out_path: Path, holder: dict):
    def observe(device, alloc, device_alloc, device_free):
        if holder.get("written"):
            return
        holder["written"] = True
        holder["observer_args"] = {"device": device, "alloc": alloc, "device_allocated": device_alloc,
                                   "device_free": device_free}
        holder["memory_allocated"] = torch.cuda.memory_allocated()
        holder["memory_reserved"] = torch.cuda.memory_reserved()
        save_snapshot(torch.cuda.memory._snapshot(), out_path)
    return observe


OOM_MODEL = dict(d_model=1024, layers=16, heads=16, vocab=8192, max_len=1024)
OOM_SEQ = 512
OOM_CAP = 6 * GiB


def _train_steps(model, opt, batch, steps, seq=OOM_SEQ, vocab=OOM_MODEL["vocab"]):
    from estimate_families import lm_loss

    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
        loss = lm_loss(model(tokens))
        loss.backward()
        del loss, tokens
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _largest_batch(model, opt, hi: int) -> tuple[int, list]:
    """Largest batch in [1, hi] whose two training steps fit (binary search on real runs)."""
    tried = []
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            _train_steps(model, opt, mid, 2)
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        opt.zero_grad(set_to_none=True)
        opt.state.clear()  # each trial starts as a fresh run would: no optimizer state yet
        gc.collect()
        torch.cuda.empty_cache()
        tried.append({"batch": mid, "fits": ok})
        if ok:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best, tried


def child_oom_forward(out: Path, case: str) -> dict:
    from estimate_families import DecoderLM, _DecoderBlock, lm_loss

    rec: dict = {"case": case, "model": "DecoderLM", "model_config": OOM_MODEL, "seq_len": OOM_SEQ,
                 "optimizer": "AdamW(lr=1e-4)", "cap_bytes": OOM_CAP, "settings": _settings()}
    _cap(OOM_CAP)
    # batch: so that the forward dies around the middle of the 16 blocks. Measure what one block keeps
    # per sample (a probe block, before any recording), then size the batch for ~9 blocks of what the
    # parameters leave free under the cap.
    with torch.device("cuda"):
        probe = _DecoderBlock(OOM_MODEL["d_model"], OOM_MODEL["heads"])
    x = torch.randn(1, OOM_SEQ, OOM_MODEL["d_model"], device="cuda", requires_grad=True)
    probe(x).sum().backward()  # the first matmuls take the cuBLAS workspaces: not activations
    gc.collect()
    base = torch.cuda.memory_allocated()
    y = probe(x)
    per_block_per_sample = torch.cuda.memory_allocated() - base
    del x, y, probe
    gc.collect()
    torch.cuda.empty_cache()
    with torch.device("meta"):
        param_bytes = sum(p.numel() * p.element_size() for p in DecoderLM(**OOM_MODEL).parameters())
    # forward only in this first step (no gradients or optimizer state yet): ~9 blocks' worth fits
    batch = max(2, int((OOM_CAP - param_bytes - 64 * MiB) / (9.0 * per_block_per_sample)))
    rec.update(probe_block_bytes_per_sample=per_block_per_sample, batch=batch, parameter_bytes=param_bytes)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    with torch.device("cuda"):
        model = DecoderLM(**OOM_MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rec["parameters"] = sum(p.numel() for p in model.parameters())
    rec["parameter_addresses"] = sorted(p.data_ptr() for p in model.parameters())

    where = {"stack": [], "phase": "setup"}
    names = {id(m): n for n, m in model.named_modules()}

    def pre(mod, args):
        where["stack"].append(names.get(id(mod), type(mod).__name__))

    def post(mod, args, output):
        if where["stack"]:
            where["stack"].pop()

    hooks = [m.register_forward_pre_hook(pre) for m in model.modules()]
    hooks += [m.register_forward_hook(post, always_call=True) for m in model.modules()]
    holder: dict = {}
    snap_path = out / f"{case}.snapshot.pickle.gz"
    torch._C._cuda_attach_out_of_memory_observer(_observer(snap_path, holder))

    def attempt():  # its locals (the live activations) die with it
        tokens = torch.randint(0, OOM_MODEL["vocab"], (batch, OOM_SEQ), device="cuda")
        where["phase"] = "forward"
        logits = model(tokens)
        where["phase"] = "loss"
        loss = lm_loss(logits)
        del logits
        where["phase"] = "backward"
        loss.backward()
        where["phase"] = "optimizer"
        opt.step()

    try:
        attempt()
        rec["oom"] = False
    except torch.OutOfMemoryError as exc:
        rec["oom"] = True
        rec["message"] = _first_line(exc)
        rec["oom_phase"] = where["phase"]
        rec["oom_module_stack"] = list(where["stack"])
        blocks = [n for n in where["stack"] if n.startswith("blocks.")]
        rec["oom_block"] = blocks[0] if blocks else None
        rec["oom_block_index"] = int(blocks[0].split(".")[1]) if blocks else None
    rec["blocks"] = OOM_MODEL["layers"]
    torch.cuda.memory._record_memory_history(enabled=None)
    for h in hooks:
        h.remove()
    rec.update({k: v for k, v in holder.items() if k != "written"})
    rec["snapshot"] = snap_path.name if holder.get("written") else None
    rec["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    rec["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    stats = torch.cuda.memory_stats()
    rec["memory_stats"] = {k: stats.get(k) for k in ("num_ooms", "num_alloc_retries", "num_device_alloc",
                                                      "num_device_free")}
    # the truth for the batch advice: what actually fits under the same cap, from a fresh state
    opt.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    best, tried = _largest_batch(model, opt, batch)
    rec["largest_batch_that_fits"] = best
    rec["largest_batch_search"] = tried
    rec["search_s"] = round(time.perf_counter() - t0, 2)
    return rec


FRAG_CAP = 1200 * MiB  # 1000 MiB reserved + a 400 MiB segment does not fit; 600 + 400 would


def child_fragmented(out: Path, case: str) -> dict:
    """Holes inside one big segment: 1 GiB allocated and freed (one cached segment), then 5 x 200 MiB
    carved out of it, every other one freed (400 MiB free, as 200 MiB holes), then 400 MiB asked."""
    rec: dict = {"case": case, "cap_bytes": FRAG_CAP, "settings": _settings()}
    _cap(FRAG_CAP)
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    holder: dict = {}
    snap_path = out / f"{case}.snapshot.pickle.gz"
    torch._C._cuda_attach_out_of_memory_observer(_observer(snap_path, holder))
    keep = []
    try:
        big = torch.empty(1000 * MiB, dtype=torch.uint8, device="cuda")
        del big
        parts = [torch.empty(200 * MiB, dtype=torch.uint8, device="cuda") for _ in range(5)]
        keep = parts[0::2]
        del parts
        rec["free_in_reserved_before_request"] = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        request = torch.empty(400 * MiB, dtype=torch.uint8, device="cuda")
        rec["oom"] = False
        # no OOM (the settings made it fit): keep the allocator's state with its settings all the same
        save_snapshot(torch.cuda.memory._snapshot(), snap_path)
        rec["snapshot_without_oom"] = snap_path.name
        del request
    except torch.OutOfMemoryError as exc:
        rec["oom"] = True
        rec["message"] = _first_line(exc)
    rec["request_bytes"] = 400 * MiB
    torch.cuda.memory._record_memory_history(enabled=None)
    del keep
    rec.update({k: v for k, v in holder.items() if k != "written"})
    rec["snapshot"] = snap_path.name if (holder.get("written") or rec.get("snapshot_without_oom")) else None
    rec["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    rec["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    return rec


PAIR_MODEL = dict(d_model=512, layers=6, heads=8, vocab=8192, max_len=1024)
PAIR_BATCH, PAIR_SEQ, PAIR_STEPS = 8, 512, 3


def child_pair(out: Path, case: str) -> dict:
    from estimate_families import DecoderLM, lm_loss

    precision = case.split("_", 1)[1]
    rec: dict = {"case": case, "precision": precision, "model": "DecoderLM", "model_config": PAIR_MODEL,
                 "batch": PAIR_BATCH, "seq_len": PAIR_SEQ, "steps": PAIR_STEPS, "optimizer": "AdamW(lr=1e-4)",
                 "settings": _settings()}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.device("cuda"):
        model = DecoderLM(**PAIR_MODEL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.cuda.synchronize()
    rec["before_recording_allocated"] = torch.cuda.memory_allocated()
    rec["parameters"] = [{"name": n, "addr": p.data_ptr(), "nbytes": p.untyped_storage().nbytes()}
                         for n, p in model.named_parameters()]
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    per_step = []
    for i in range(PAIR_STEPS):
        torch.cuda.reset_peak_memory_stats()
        with torch.profiler.record_function(f"ProfilerStep#{i}"):
            tokens = torch.randint(0, PAIR_MODEL["vocab"], (PAIR_BATCH, PAIR_SEQ), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = lm_loss(model(tokens))
            del tokens
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        per_step.append({"max_memory_allocated": torch.cuda.max_memory_allocated(),
                         "max_memory_reserved": torch.cuda.max_memory_reserved()})
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    save_snapshot(snap, out / f"{case}.snapshot.pickle.gz")
    rec["snapshot"] = f"{case}.snapshot.pickle.gz"
    rec["per_step"] = per_step
    rec["max_memory_allocated"] = max(s["max_memory_allocated"] for s in per_step)
    rec["max_memory_reserved"] = max(s["max_memory_reserved"] for s in per_step)
    rec["end_allocated"] = torch.cuda.memory_allocated()
    rec["end_reserved"] = torch.cuda.memory_reserved()
    rec["optimizer_state"] = [{"param": n, "state": k, "addr": v.data_ptr(), "nbytes": v.untyped_storage().nbytes()}
                              for n, p in model.named_parameters() for k, v in opt.state[p].items()
                              if isinstance(v, torch.Tensor) and v.is_cuda]
    return rec


CHILDREN = {
    "oom_forward": (child_oom_forward, "expandable_segments:False"),
    "oom_forward_expandable": (child_oom_forward, "expandable_segments:True"),
    "oom_fragmented": (child_fragmented, "expandable_segments:False"),
    "oom_fragmented_expandable": (child_fragmented, "expandable_segments:True"),
    "oom_fragmented_settings": (child_fragmented, "max_split_size_mb:128,garbage_collection_threshold:0.6,"
                                                  "roundup_power2_divisions:4"),
    "pair_fp32": (child_pair, ""),
    "pair_bf16": (child_pair, ""),
}


def run_child(case: str, out: Path, timeout: float) -> dict:
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=CHILDREN[case][1])
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", case, "--out", str(out)],
                           env=env, capture_output=True, text=True, timeout=timeout)
        ok, tail = p.returncode == 0, (p.stdout + p.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {timeout:.0f} s"
    wall = round(time.perf_counter() - t0, 1)
    print(f"  {case}: {'ok' if ok else 'FAILED'} in {wall} s", flush=True)
    if not ok:
        print(tail, file=sys.stderr)
    return {"case": case, "ok": ok, "wall_s": wall, "tail": None if ok else tail.replace(str(ROOT), ".")}


# --- families and sweeps (in this process) ------------------------------------------------------------
OP_FAMILIES = ("cnn", "unet", "lstm")  # the per-op run: where cuDNN takes workspace / reserve space
FAMILY_BATCHES = {"mlp": (256,), "cnn": (32, 128), "unet": (8, 32), "lstm": (16, 64), "encoder": (8,),
                  "decoder_lm": (4,)}


def families(budget_s: float, precisions=("fp32", "bf16")) -> dict:
    from estimate_families import FAMILIES, adamw
    from workbench.capture.estimate import measure_step_memory, warm_up_cublas
    from workbench.capture.estimate.fake_step import _forward_loss

    rows = []
    warm_up_cublas()  # as benchmarks/estimate_accuracy.py: the two cuBLAS workspaces are held from here on
    t_end = time.perf_counter() + budget_s
    for fam, batches in FAMILY_BATCHES.items():
        build, batch_fn, loss_fn = FAMILIES[fam]
        for bs in batches:
            for prec in precisions:
                if time.perf_counter() > t_end:
                    rows.append({"family": fam, "batch_size": bs, "precision": prec, "skipped": "time budget"})
                    continue
                row = {"family": fam, "batch_size": bs, "precision": prec, "checkpointing": False, "steps": 2}
                try:
                    real = measure_step_memory(build, batch_fn, adamw, precision=prec, batch_size=bs, loss_fn=loss_fn,
                                               strict_fp32=prec == "fp32")
                    row.update(real)
                    if fam not in OP_FAMILIES:
                        rows.append(row)
                        print(f"  {fam} bs={bs} {prec}: allocated {row['max_allocated_bytes'] / GiB:.3f} GiB, "
                              f"reserved {row['max_reserved_bytes'] / GiB:.3f} GiB", flush=True)
                        continue
                    # the same step again under the per-op dispatch mode (its peak resets spoil the totals)
                    ops = OpMemory()
                    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
                    torch.backends.cudnn.allow_tf32 = prec == "tf32"
                    with torch.device("cuda"):
                        model = build()
                    opt = adamw(list(model.parameters()))
                    for _ in range(2):
                        with torch.device("cuda"):
                            inputs = batch_fn(bs)
                        with ops:
                            ops.phase = "forward"
                            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
                                loss = _forward_loss(model, inputs, loss_fn)
                            ops.phase = "backward"
                            loss.backward()
                        del loss, inputs
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                    row["ops"] = ops.rows
                    del model, opt
                except Exception as exc:  # keep the rows measured so far
                    row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
                gc.collect()
                torch.cuda.empty_cache()
                rows.append(row)
                print(f"  {fam} bs={bs} {prec}: allocated {row.get('max_allocated_bytes', 0) / GiB:.3f} GiB, "
                      f"reserved {row.get('max_reserved_bytes', 0) / GiB:.3f} GiB, {len(row.get('ops', []))} op rows"
                      + (f" ({row['error']})" if "error" in row else ""), flush=True)
    return {"rows": rows}


CONV_SHAPES = [  # (batch, c_in, c_out, hw, kernel, stride, transposed)
    (32, 3, 64, 64, 3, 1, False), (32, 64, 64, 64, 3, 1, False), (32, 64, 128, 64, 3, 2, False),
    (32, 128, 128, 32, 3, 1, False), (32, 128, 256, 32, 3, 2, False), (32, 256, 256, 16, 3, 1, False),
    (32, 256, 512, 16, 3, 2, False), (32, 512, 512, 8, 3, 1, False), (32, 64, 128, 64, 1, 2, False),
    (128, 64, 64, 64, 3, 1, False), (128, 256, 256, 16, 3, 1, False), (128, 512, 512, 8, 3, 1, False),
    (8, 3, 32, 128, 3, 1, False), (8, 32, 32, 128, 3, 1, False), (8, 64, 64, 64, 3, 1, False),
    (8, 128, 128, 32, 3, 1, False), (8, 256, 256, 16, 3, 1, False), (8, 512, 512, 8, 3, 1, False),
    (8, 64, 32, 128, 3, 1, False), (32, 32, 32, 128, 3, 1, False), (32, 64, 64, 64, 3, 1, False),
    (8, 512, 256, 8, 2, 2, True), (8, 64, 32, 64, 2, 2, True), (32, 512, 256, 8, 2, 2, True),
    (32, 64, 32, 64, 2, 2, True), (8, 32, 2, 128, 1, 1, False), (16, 16, 16, 256, 3, 1, False),
    (64, 128, 128, 56, 3, 1, False), (64, 256, 256, 28, 3, 1, False), (64, 64, 64, 112, 3, 1, False),
]
LSTM_SHAPES = [  # (batch, seq, input, hidden, layers)
    (16, 256, 512, 1024, 2), (64, 256, 512, 1024, 2), (16, 256, 512, 1024, 1), (16, 128, 256, 512, 1),
    (32, 64, 128, 256, 2), (8, 512, 1024, 1024, 1), (64, 128, 512, 512, 3), (16, 256, 1024, 2048, 1),
]


def cudnn_sweep(budget_s: float, out_path: Path | None = None) -> dict:
    """Per-op cuDNN numbers for the shapes above; written to ``out_path`` after every shape (a run cut
    short keeps what it measured). One call per shape and direction."""
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t_end = time.perf_counter() + budget_s
    conv_rows, lstm_rows = [], []
    for dtype in (torch.float32, torch.bfloat16):
        for (n, t, i, h, layers) in LSTM_SHAPES:
            if time.perf_counter() > t_end:
                break
            row = {"batch": n, "seq": t, "input": i, "hidden": h, "layers": layers,
                   "dtype": str(dtype).replace("torch.", "")}
            try:
                with torch.device("cuda"):
                    rnn = torch.nn.LSTM(i, h, num_layers=layers, batch_first=True)
                rnn.to(dtype)
                x = torch.randn(n, t, i, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(1):
                    ops = OpMemory(min_transient=0)
                    with ops:
                        y, _ = rnn(x)
                        y.backward(torch.ones_like(y))
                    rnn.zero_grad(set_to_none=True)
                    x.grad = None
                    del y
                storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in rnn.parameters()}
                row["weight_storages"] = len(storages)  # 1: flattened into one cuDNN weight buffer
                row["weight_bytes"] = sum(storages.values())
                row["parameter_count"] = sum(p.numel() for p in rnn.parameters())
                row["ops"] = [{k2: r[k2] for k2 in ("op", "output_bytes", "transient_bytes", "args", "outputs")}
                              for r in ops.rows if r["op"] in _CUDNN_OPS or r["transient_bytes"] > 0]
                # the autocast path (bf16 casts and a re-flattened weight copy each call), fp32 model
                if dtype == torch.bfloat16:
                    with torch.device("cuda"):
                        rnn32 = torch.nn.LSTM(i, h, num_layers=layers, batch_first=True)
                    x32 = torch.randn(n, t, i, device="cuda", requires_grad=True)
                    ops = OpMemory(min_transient=0)
                    with ops:
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            y, _ = rnn32(x32)
                        y.float().backward(torch.ones_like(y, dtype=torch.float32))
                    row["autocast_ops"] = [{k2: r[k2] for k2 in ("op", "output_bytes", "transient_bytes", "args",
                                                                  "outputs")} for r in ops.rows]
                    del rnn32, x32, y
                del rnn, x
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
            gc.collect()
            torch.cuda.empty_cache()
            lstm_rows.append(row)
            if out_path is not None:
                write_json(out_path, {"conv": conv_rows, "lstm": lstm_rows, "complete": False})
    for dtype in (torch.float32, torch.bfloat16):
        for (n, ci, co, hw, k, s, tr) in CONV_SHAPES:
            if time.perf_counter() > t_end:
                break
            row = {"batch": n, "c_in": ci, "c_out": co, "hw": hw, "kernel": k, "stride": s, "transposed": tr,
                   "dtype": str(dtype).replace("torch.", "")}
            try:
                x = torch.randn(n, ci, hw, hw, device="cuda", dtype=dtype, requires_grad=True)
                if tr:
                    w = torch.randn(ci, co, k, k, device="cuda", dtype=dtype, requires_grad=True)
                else:
                    w = torch.randn(co, ci, k, k, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(1):
                    ops = OpMemory(min_transient=0)
                    with ops:
                        y = (F.conv_transpose2d(x, w, stride=s) if tr else F.conv2d(x, w, stride=s, padding=k // 2))
                        g = torch.ones_like(y)
                        y.backward(g)
                    x.grad = None
                    w.grad = None
                    del y, g
                row["ops"] = [{k2: r[k2] for k2 in ("op", "output_bytes", "transient_bytes", "args", "outputs")}
                              for r in ops.rows if r["op"] in _CUDNN_OPS]
                del x, w
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
            conv_rows.append(row)
            if out_path is not None:
                write_json(out_path, {"conv": conv_rows, "lstm": lstm_rows, "complete": False})
    return {"conv": conv_rows, "lstm": lstm_rows, "complete": True}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for everything recorded")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--parts", default="children,families,sweep",
                    help="comma-separated subset of children,families,sweep (default: all; the sweep alone: ~40 s)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("record_memory_h200: no CUDA device; run this on the GPU machine", file=sys.stderr)
        return 2
    if args.child:
        fn = CHILDREN[args.child][0]
        try:
            rec = fn(out, args.child)
        except Exception:
            rec = {"case": args.child, "error": traceback.format_exc()[-3000:].replace(str(ROOT), ".")}
        write_json(out / f"{args.child}.json", rec)
        return 0 if "error" not in rec else 1
    t0 = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(0), "total_memory": torch.cuda.get_device_properties(0).total_memory,
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "date": _dt.date.today().isoformat(), "settings": _settings(), "children": []}
    parts = set(args.parts.split(","))
    print("OOM and pair recordings (one process each):", flush=True)
    for case in (CHILDREN if "children" in parts else ()):
        remaining = 80 - (time.perf_counter() - t0)  # children until 80 s, families until 105 s, sweep until 142 s
        if remaining < 8:
            env["children"].append({"case": case, "ok": False, "skipped": "time budget"})
            continue
        env["children"].append(run_child(case, out, timeout=min(30.0, remaining)))
    print("estimator families (fp32, bf16):", flush=True)
    t1 = time.perf_counter()
    try:
        if "families" in parts:
            fam_budget = (120 if parts == {"families"} else 105) - (t1 - t0)
            write_json(out / "families.json", families(budget_s=max(10.0, fam_budget)))
    except Exception:
        env["families_error"] = traceback.format_exc()[-3000:].replace(str(ROOT), ".")
    env["families_s"] = round(time.perf_counter() - t1, 1)
    write_json(out / "env.json", env)  # again at the end, with the wall times
    print("cuDNN LSTM and convolution sweep:", flush=True)
    t2 = time.perf_counter()
    try:
        if "sweep" in parts:
            sweep_path = out / "cudnn_sweep.json"
            write_json(sweep_path, cudnn_sweep(budget_s=max(8.0, (50 if parts == {"sweep"} else 142) - (t2 - t0)),
                                               out_path=sweep_path))
    except Exception:
        env["sweep_error"] = traceback.format_exc()[-3000:].replace(str(ROOT), ".")
    env["sweep_s"] = round(time.perf_counter() - t2, 1)
    env["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / "env.json", env)
    print(f"wrote {len(list(out.iterdir()))} files to {out} in {env['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
