"""Record the memory what-if truth on a CUDA GPU (issue 31; made for the H200; ~3-6 min).

Run from the repository root::

    python benchmarks/record_oom_whatif_h200.py --out DIR                 # all scenarios, --budget-s 480
    python benchmarks/record_oom_whatif_h200.py --out DIR --only leak     # one scenario
    python benchmarks/record_oom_whatif_h200.py --out DIR --smoke         # CPU: every code path, tiny sizes

For every scenario an out-of-memory is recorded (allocator history on, python stacks, context "all"; the
snapshot written from inside the OOM observer, local paths stripped: ``DIR/<scenario>.snapshot.pickle.gz``
+ ``DIR/<scenario>.oom.json``, the sidecar ``workbench.capture.capture_oom`` writes), and then every
candidate fix is run in a FRESH process (``PYTORCH_CUDA_ALLOC_CONF`` is read once per process) under the
same cap (``torch.cuda.set_per_process_memory_fraction(cap / total)``), for the same number of steps;
what ran is stored in ``DIR/<scenario>.json`` (``fixes``: ran or not, the step it died at, torch's
``max_memory_reserved`` / ``max_memory_allocated`` over the run, wall time, torch's first message line).
The model is ``benchmarks/oom_whatif_models.py`` (a decoder LM whose ``blocks`` are an ``nn.ModuleList``,
so the frames and the forward hooks name ``blocks.N``). Up to ``--jobs`` fix processes share the GPU at
once (each under its own per-process cap, which is what an OOM is measured against; the H200's 141 GB hold
them all, so they do not change each other's peaks; wall times are only indicative). ``DIR/env.json``:
GPU, driver, versions, per-scenario wall times, failures and what the time budget skipped;
``DIR/whatif_bundle.tar.gz`` packs everything (< 60 MiB).

Scenarios and their fixes (every fix list ends with ``no_cap``: the original with no cap, i.e. the
memory the step would need on a bigger GPU):

- ``activations``: d=1024 x 8 blocks (0.44 GiB fp32 parameters), seq 512, AdamW, batch 24 under a 6 GiB cap:
  ~0.3 GiB of saved activations per sample (~34 MiB a block: LayerNorm inputs, qkv, attention output,
  MLP up / GELU outputs; plus logits and log-softmax) make ~7.4 GiB at batch 24: dies part way through
  the first forward (about block 5-6). Fixes: smaller batches (1/2, 1/3, 1/4 of 24, then a binary search
  between the largest that ran and the smallest that failed: ``batch_search``; batch 12 is near the edge),
  activation checkpointing of every block (only block inputs kept: ~4 GiB, should run), bf16 autocast
  (LayerNorm outputs stay fp32: may not be enough), ``expandable_segments:True`` (not a fragmentation OOM:
  should change nothing), SGD instead of AdamW (saves the 0.88 GiB of state: not enough at 24).
- ``activations_expandable``: the same under ``expandable_segments:True``. Fixes: batches (fractions +
  search), checkpointing, bf16, expandable segments off.
- ``optimizer_first_step``: d=2048 x 10 blocks (2.0 GiB fp32), seq 128, batch 4, AdamW under a 6 GiB cap:
  params + grads = 4 GiB fit, AdamW's two states (4 GiB, created lazily in the first ``step``) do not.
  Loop style: ``zero_grad(set_to_none=False)`` at the top. Fixes: batch 2 and 1 (do not help: the
  activations are not the problem), SGD (no state: runs), SGD momentum (+2 GiB of buffers: 6 GiB + the
  rest), AdamW foreach=False, AdamW fused=True (same 4 GiB of state, fewer temporaries), Adafactor
  (factored state; its default foreach path may take grad-sized temporaries) and Adafactor foreach=False,
  ``zero_grad(set_to_none=True)`` after the step (changes nothing at step 1), bf16 autocast (the fp32
  parameters and states stay).
- ``leak``: d=512 x 4 blocks, seq 512, batch 8, AdamW, 60 steps under a 5 GiB cap; every step's logits
  (detached, 128 MiB) are appended to a list "for metrics later": dies around step 25-35. Fixes: the
  leak removed (~1.5 GiB a step: runs), batch 3/4, 1/2, 1/4 (the OOM moves later: ``oom_step`` says when,
  if it does within the 60 steps; then ``batch_search`` between the largest that ran 60 steps and the
  smallest that did not),
  checkpointing and bf16 (the leak stays; bf16 halves it).
- ``fragmentation``: d=1024 x 8 blocks, batch 8, AdamW, 12 steps whose sequence lengths vary
  (128..1024), expandable segments off. The cap is calibrated: uncapped runs of the padded (every step
  1024) and the variable run give the padded peaks; the caps tried for the recorded OOM are the padded
  run's peak reserved + 2%, halfway to its peak allocated, its peak allocated + 3% (the first that OOMs
  is kept; ``calibration`` stores it all). Fixes: ``expandable_segments:True``, ``max_split_size_mb:64``,
  padded fixed shape (1024 every step), batch 1/2, 1/4 and the search between them.
- ``predates_recording``: d=1024 x 8 blocks, AdamW: model, optimizer and one step at batch 2 are done
  BEFORE ``_record_memory_history`` starts (parameters, their grads' and AdamW's state predate the
  recording), then batch 20 under a 6 GiB cap dies in the first recorded forward. Fixes: batches
  (fractions + search), checkpointing, bf16, SGD.

Each JSON also has the OOM of the recorded run: the step it died at, the phase (forward / backward /
optimizer / other; the block index from forward hooks when in the forward), the requested bytes and
torch's message (first line). If the recorded run does not OOM at the planned batch the next batch of
``escalate`` is tried (stored in ``attempts``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from oom_whatif_models import WhatIfLM, lm_loss, parameter_bytes  # noqa: E402
from record_memory_h200 import _first_line, _settings, save_snapshot, strip_path, write_json  # noqa: E402
from record_oom_h200 import Observer, _driver  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
MAX_ENTRIES = 60_000
BUNDLE = "whatif_bundle.tar.gz"
BUNDLE_LIMIT = 60 * MiB


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the scenarios ------------------------------------------------------------------------------------------
M_MID = dict(d_model=1024, layers=8, heads=16, vocab=8192, max_len=1024)
M_BIG = dict(d_model=2048, layers=10, heads=16, vocab=8192, max_len=256)
M_SMALL = dict(d_model=512, layers=4, heads=8, vocab=8192, max_len=1024)
VAR_SEQ = [128, 640, 256, 896, 384, 960, 512, 768, 320, 1024, 448, 1024]

BASE = dict(seq_len=512, seq_lens=None, steps=3, optimizer="adamw", precision="fp32", checkpointing=False,
            alloc_conf="expandable_segments:False", leak=False, zero_grad="after_step", warmup_batch=None)

SCENARIOS: dict[str, dict] = {  # run in this order
    "activations": dict(
        description="activation OOM in the first forward: batch 24 of a 1024-wide 8-block LM (seq 512, AdamW)",
        model=M_MID, batch_size=24, cap_bytes=6 * GiB, escalate=[48, 96],
        fixes=["batch_fractions", "batch_search", "checkpointing", "bf16", "expandable", "sgd", "no_cap"],
        fractions=["1/2", "1/3", "1/4"]),
    "optimizer_first_step": dict(
        description="OOM in the first AdamW step: a 2 GiB fp32 model, params + grads fit the 6 GiB cap, "
                    "AdamW's lazily created state (4 GiB) does not",
        model=M_BIG, seq_len=128, batch_size=4, cap_bytes=6 * GiB, escalate=[], zero_grad="top_keep",
        fixes=["batch_fractions", "sgd", "sgd_momentum", "adamw_foreach_off", "adamw_fused", "adafactor",
               "adafactor_foreach_off", "zero_grad_none", "bf16", "no_cap"],
        fractions=["1/2", "1/4"]),
    "leak": dict(
        description="a leak: every step's logits appended to a list for metrics later; dies at a later step",
        model=M_SMALL, batch_size=8, steps=60, cap_bytes=5 * GiB, escalate=[], leak=True,
        fixes=["no_leak", "batch_fractions", "batch_search", "checkpointing", "bf16", "no_cap"],
        fractions=["3/4", "1/2", "1/4"]),
    "fragmentation": dict(
        description="fragmentation from variable sequence lengths (128..1024 per step), expandable segments off",
        model=M_MID, batch_size=8, steps=len(VAR_SEQ), seq_len=1024, seq_lens=VAR_SEQ, cap_bytes=None,
        calibrate=True, escalate=[],
        fixes=["expandable", "max_split", "padded", "batch_fractions", "batch_search", "no_cap"],
        fractions=["1/2", "1/4"]),
    "predates_recording": dict(
        description="parameters, grads and AdamW state predate the recording (one step at batch 2 before "
                    "history starts); batch 20 then dies in the first recorded forward",
        model=M_MID, batch_size=20, cap_bytes=6 * GiB, escalate=[40, 80], warmup_batch=2,
        fixes=["batch_fractions", "batch_search", "checkpointing", "bf16", "sgd", "no_cap"],
        fractions=["1/2", "1/3", "1/4"]),
    "activations_expandable": dict(
        description="the activation OOM with expandable_segments:True",
        model=M_MID, batch_size=24, cap_bytes=6 * GiB, escalate=[48, 96], alloc_conf="expandable_segments:True",
        fixes=["batch_fractions", "batch_search", "checkpointing", "bf16", "not_expandable", "no_cap"],
        fractions=["1/2", "1/3", "1/4"]),
}

# CPU smoke: tiny sizes, a simulated cap (see SmokeMeter)
S_MODEL = dict(d_model=32, layers=2, heads=2, vocab=64, max_len=32)
SMOKE = {
    "activations": dict(model=S_MODEL, seq_len=16, batch_size=24, cap_bytes=1_000_000, escalate=[48]),
    "activations_expandable": dict(model=S_MODEL, seq_len=16, batch_size=24, cap_bytes=1_000_000, escalate=[48]),
    "optimizer_first_step": dict(model=dict(S_MODEL, d_model=64), seq_len=8, batch_size=4, cap_bytes=1_600_000),
    "leak": dict(model=S_MODEL, seq_len=16, batch_size=8, steps=12, cap_bytes=1_450_000),
    "fragmentation": dict(model=S_MODEL, seq_len=32, seq_lens=[8, 32, 16, 32], steps=4, batch_size=8),
    "predates_recording": dict(model=S_MODEL, seq_len=16, batch_size=20, cap_bytes=1_000_000, escalate=[40]),
}

FIX_CHANGES = {  # fix id -> the change to the original run
    "checkpointing": {"checkpointing": True},
    "bf16": {"precision": "bf16"},
    "expandable": {"alloc_conf": "expandable_segments:True"},
    "not_expandable": {"alloc_conf": "expandable_segments:False"},
    "max_split": {"alloc_conf": "expandable_segments:False,max_split_size_mb:64"},
    "sgd": {"optimizer": "sgd"},
    "sgd_momentum": {"optimizer": "sgd_momentum"},
    "adamw_foreach_off": {"optimizer": "adamw_foreach_off"},
    "adamw_fused": {"optimizer": "adamw_fused"},
    "adafactor": {"optimizer": "adafactor"},
    "adafactor_foreach_off": {"optimizer": "adafactor_foreach_off"},
    "zero_grad_none": {"zero_grad": "after_step"},
    "no_leak": {"leak": False},
    "padded": {"seq_lens": None},
    "no_cap": {"cap_bytes": None},
}


def scenario_spec(name: str, smoke: bool) -> dict:
    sc = {**BASE, **SCENARIOS[name]}
    if smoke:
        sc.update(SMOKE[name])
    sc["name"] = name
    sc["smoke"] = smoke
    return sc


def run_fields(sc: dict) -> dict:
    """What a child process needs to run the training loop."""
    keys = ("model", "seq_len", "seq_lens", "steps", "optimizer", "precision", "checkpointing", "alloc_conf",
            "leak", "zero_grad", "warmup_batch", "batch_size", "cap_bytes", "smoke")
    return {k: sc[k] for k in keys}


# --- the child: one training run -----------------------------------------------------------------------------
class Where:
    """Phase of the step, and the block running (forward hooks)."""

    def __init__(self, model):
        self.phase, self.detail, self.block, self.done = "other", "setup", None, 0
        self.hooks = []
        for i, blk in enumerate(model.blocks):
            self.hooks.append(blk.register_forward_pre_hook(self._pre(i)))
            self.hooks.append(blk.register_forward_hook(self._post(i)))
        self.meter = None

    def _pre(self, i):
        def hook(mod, args):
            if self.phase == "forward":
                self.block = i
        return hook

    def _post(self, i):
        def hook(mod, args, out):
            if self.meter is not None:
                self.meter.check(self)
            if self.phase == "forward":
                self.block = None
                self.done = i + 1
        return hook

    def where_in_forward(self) -> str:
        if self.block is not None:
            return f"blocks.{self.block}"
        if self.detail == "loss":
            return "loss"
        return "embedding" if self.done == 0 else "final norm / lm head"

    def set(self, phase, detail=None):
        self.phase, self.detail, self.block = phase, detail, None
        if phase == "forward" and detail == "blocks":
            self.done = 0


class SmokeMeter:
    """CPU only: a simulated cap. Counted bytes: parameters, grads, optimizer state, the leak list and the
    tensors saved for backward in the current step (saved-tensor hooks); over the cap it raises torch's
    OutOfMemoryError as the allocator would."""

    def __init__(self, cap, model, opt, leak_list):
        self.cap, self.model, self.opt, self.leak_list = cap, model, opt, leak_list
        self.saved = 0
        self.peak = 0

    def pack(self, t):
        self.saved += t.numel() * t.element_size()
        return t

    def usage(self):
        b = sum(p.numel() * p.element_size() + (p.grad.numel() * p.grad.element_size() if p.grad is not None else 0)
                for p in self.model.parameters())
        for st in self.opt.state.values():
            b += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v) and v.dim() > 0)
        b += sum(t.numel() * t.element_size() for t in self.leak_list)
        return b + self.saved

    def check(self, where=None):
        u = self.usage()
        self.peak = max(self.peak, u)
        if self.cap is not None and u > self.cap:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (smoke simulation). Tried to allocate {u - self.cap} bytes over a cap of "
                f"{self.cap} bytes")


def make_optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4)
    if name == "adamw_foreach_off":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "adamw_fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3)
    if name == "adafactor_foreach_off":
        return torch.optim.Adafactor(params, lr=1e-3, foreach=False)
    raise ValueError(name)


def child_run(spec: dict) -> dict:
    """One training run as the spec says; the OOM (if any) and torch's peaks."""
    smoke = spec["smoke"]
    dev = "cpu" if smoke else "cuda"
    res: dict = {"ran": False, "oom_step": None, "steps": spec["steps"], "steps_done": 0, "error": None,
                 "max_memory_reserved": None, "max_memory_allocated": None, "oom": None,
                 "step_max_reserved": [], "step_max_allocated": []}
    obs = None
    info: dict = {}
    if not smoke:
        torch.cuda.init()
        total = torch.cuda.get_device_properties(0).total_memory
        if spec["cap_bytes"] is not None:
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_bytes"] / total), 0)
        torch.backends.cuda.matmul.allow_tf32 = False
        if spec.get("record"):
            obs = Observer(Path(spec["record"]["dir"]), spec["record"]["name"])
            obs.snap_path = Path(spec["record"]["dir"]) / f"{spec['record']['name']}.snapshot.pickle.gz"
            obs.side_path = Path(spec["record"]["dir"]) / f"{spec['record']['name']}.oom.json"

        def observe(device, alloc, limit, device_free):
            info.setdefault("requested_bytes", int(alloc))
            info.setdefault("limit_bytes", int(limit))
            info.setdefault("memory_allocated", torch.cuda.memory_allocated())
            info.setdefault("memory_reserved", torch.cuda.memory_reserved())
            if obs is not None:
                obs(device, alloc, limit, device_free)

        torch._C._cuda_attach_out_of_memory_observer(observe)
        torch.cuda.reset_peak_memory_stats()

    def history_on():
        if (spec.get("record") or spec.get("dump_history")) and not smoke:
            torch.cuda.memory._record_memory_history("all", context="all", stacks="python",
                                                     max_entries=MAX_ENTRIES)
            if obs is not None:
                obs.armed = True
        res["history_started_at"] = "after_warmup" if spec.get("warmup_batch") else "start"

    if not spec.get("warmup_batch"):
        history_on()
    torch.manual_seed(0)
    with torch.device(dev):
        model = WhatIfLM(**spec["model"])
    res["parameter_bytes"] = parameter_bytes(model)
    opt = make_optimizer(spec["optimizer"], model.parameters())
    where = Where(model)
    leak_list: list = []
    meter = SmokeMeter(spec["cap_bytes"], model, opt, leak_list) if smoke else None
    where.meter = meter
    gen = torch.Generator(device=dev).manual_seed(1)
    vocab = spec["model"]["vocab"]

    def step(batch, seq):
        if spec["zero_grad"] == "top_keep":
            where.set("other", "zero_grad")
            opt.zero_grad(set_to_none=False)
        tokens = torch.randint(0, vocab, (batch, seq), device=dev, generator=gen)
        where.set("forward", "blocks")
        if meter is not None:
            meter.saved = 0
        ctx = torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t) if meter is not None else _null()
        with ctx, torch.autocast(dev, dtype=torch.bfloat16, enabled=spec["precision"] == "bf16"):
            logits = model(tokens, checkpoint=spec["checkpointing"])
            where.set("forward", "loss")
            loss = lm_loss(logits, tokens)
        if spec["leak"]:
            where.set("other", "metrics list")
            leak_list.append(logits.detach())  # "for metrics later": the leak
            if meter is not None:
                meter.check()
        del logits
        where.set("backward")
        loss.backward()
        if meter is not None:
            meter.check()
            meter.saved = 0
        where.set("optimizer")
        opt.step()
        if meter is not None:
            meter.check()
        if spec["zero_grad"] == "after_step":
            where.set("other", "zero_grad")
            opt.zero_grad(set_to_none=True)
        where.set("other", "between steps")

    t0 = time.perf_counter()
    try:
        if spec.get("warmup_batch"):
            step(spec["warmup_batch"], spec["seq_len"])
            res["warmup_done"] = True
            history_on()
        for i in range(spec["steps"]):
            seq = spec["seq_lens"][i % len(spec["seq_lens"])] if spec["seq_lens"] else spec["seq_len"]
            try:
                step(spec["batch_size"], seq)
            except torch.OutOfMemoryError as exc:
                msg = str(exc).strip().splitlines()[0] if str(exc).strip() else "OutOfMemoryError"
                res["oom_step"] = i
                res["oom"] = {"step": i, "phase": where.phase,
                              "detail": where.where_in_forward() if where.phase == "forward" else where.detail,
                              "block": where.block if where.phase == "forward" else None,
                              "seq_len": seq, "message": msg.replace(str(ROOT), "."),
                              "requested_bytes": info.get("requested_bytes"), "limit_bytes": info.get("limit_bytes"),
                              "allocated_at_oom": info.get("memory_allocated"),
                              "reserved_at_oom": info.get("memory_reserved")}
                if obs is not None:
                    obs.add_message(exc)
                res["error"] = msg.replace(str(ROOT), ".")
                break
            res["steps_done"] = i + 1
            if not smoke:
                res["step_max_reserved"].append(torch.cuda.max_memory_reserved())
                res["step_max_allocated"].append(torch.cuda.max_memory_allocated())
        if not smoke:
            torch.cuda.synchronize()
        res["ran"] = res["oom_step"] is None
    except Exception as exc:  # anything else: recorded, not raised
        res["error"] = _first_line(exc).replace(str(ROOT), ".")
        res["traceback"] = traceback.format_exc()[-2000:].replace(str(ROOT), ".")
    res["wall_s"] = round(time.perf_counter() - t0, 3)
    res["leaked_bytes"] = sum(t.numel() * t.element_size() for t in leak_list)
    if smoke:
        res["max_memory_reserved"] = res["max_memory_allocated"] = meter.peak
        if spec.get("record"):
            _smoke_snapshot(spec, res)
    else:
        res["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        res["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        if spec.get("dump_history"):  # a fix's own history, to compare with the replayed counterfactual
            try:
                save_snapshot(torch.cuda.memory._snapshot(), Path(spec["dump_history"]))
                res["history_written"] = Path(spec["dump_history"]).name
            except Exception as exc:
                res["history_error"] = _first_line(exc)
            torch.cuda.memory._record_memory_history(enabled=None)
        if spec.get("record"):
            torch.cuda.memory._record_memory_history(enabled=None)
            res["observer"] = {k: v for k, v in obs.info.items() if k != "written"}
            res["snapshot_written"] = bool(obs.info.get("written"))
    return res


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _smoke_snapshot(spec, res):
    """CPU: a stand-in snapshot and sidecar at the real names (the stripping and writing paths run)."""
    d, name = Path(spec["record"]["dir"]), spec["record"]["name"]
    frames = [{"filename": str(Path(__file__).resolve()), "line": 1, "name": "child_run"}]
    snap = {"segments": [], "device_traces": [[{"action": "oom", "addr": 0, "size": 0, "stream": 0,
                                                 "frames": frames}]], "smoke": True}
    if res.get("oom"):
        save_snapshot(snap, d / f"{name}.snapshot.pickle.gz")
        write_json(d / f"{name}.oom.json", {"device": -1, "requested_bytes": 0, "limit_bytes": spec["cap_bytes"],
                                            "torch_message": res["oom"]["message"], "smoke": True})
        res["snapshot_written"] = True


# --- the driver --------------------------------------------------------------------------------------------
class Budget:
    def __init__(self, seconds: float):
        self.t0 = time.perf_counter()
        self.seconds = seconds
        self.skipped: list = []
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def launch(spec: dict, budget: Budget, label: str, limit: float = 120.0) -> dict:
    """Run one spec in a fresh process (its own PYTORCH_CUDA_ALLOC_CONF); its result dict."""
    left = budget.left()
    if left < 12:
        with budget.lock:
            budget.skipped.append(label)
        log(f"  {label}: skipped (time budget)")
        return {"ran": None, "skipped": "time budget", "error": "skipped: time budget"}
    timeout = min(limit, left - 2)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=spec["alloc_conf"] or "", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="whatif-") as tmp:
        sp, rp = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        sp.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child-spec", str(sp),
                                "--child-result", str(rp)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=timeout)
            tail = p.stdout[-1500:]
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc, tail = None, f"timed out after {timeout:.0f} s"
        wall = round(time.perf_counter() - t0, 2)
        if rp.exists():
            res = json.loads(rp.read_text())
        else:
            res = {"ran": False, "error": f"child failed (rc {rc}): " + tail.strip().splitlines()[-1:][0]
                   if tail.strip() else f"child failed (rc {rc})", "child_tail": tail.replace(str(ROOT), ".")}
    res["process_wall_s"] = wall
    state = "ran" if res.get("ran") else (f"OOM at step {res.get('oom_step')}" if res.get("oom_step") is not None
                                         else f"failed: {res.get('error')}")
    log(f"  {label}: {state}, max reserved {_gib(res.get('max_memory_reserved'))} ({wall} s)")
    return res


def _gib(b):
    return "-" if b is None else (f"{b / GiB:.2f} GiB" if b >= 64 * MiB else f"{b / MiB:.2f} MiB")


def fix_row(fid: str, change: dict, res: dict, steps: int) -> dict:
    return {"id": fid, "change": change, "ran": res.get("ran"), "oom_step": res.get("oom_step"), "steps": steps,
            "steps_done": res.get("steps_done"), "max_memory_reserved": res.get("max_memory_reserved"),
            "max_memory_allocated": res.get("max_memory_allocated"), "wall_s": res.get("wall_s"),
            "process_wall_s": res.get("process_wall_s"), "error": res.get("error"),
            "oom": res.get("oom"), "step_max_reserved": res.get("step_max_reserved"),
            **({"history": res["history_written"]} if res.get("history_written") else {}),
            "step_max_allocated": res.get("step_max_allocated"),
            **({"skipped": res["skipped"]} if res.get("skipped") else {})}


def batch_of(b: int, frac: str) -> int:
    return max(1, int(b * Fraction(frac)))


def run_scenario(name: str, out: Path, budget: Budget, jobs: int, smoke: bool, only_fixes=None,
                 fix_histories=()) -> dict:
    sc = scenario_spec(name, smoke)
    if only_fixes:
        sc["fixes"] = [f for f in sc["fixes"] if f in only_fixes]
    t0 = time.perf_counter()
    import oom_whatif_models

    rec = {"scenario": name, "description": sc["description"],
           "model": f"WhatIfLM ({strip_path(oom_whatif_models.__file__)})",
           "model_config": sc["model"], "seq_len": sc["seq_len"], "seq_lens": sc["seq_lens"], "steps": sc["steps"],
           "optimizer": sc["optimizer"], "precision": sc["precision"], "checkpointing": sc["checkpointing"],
           "alloc_conf": sc["alloc_conf"], "leak": sc["leak"], "zero_grad": sc["zero_grad"],
           "warmup_batch": sc["warmup_batch"], "smoke": smoke, "settings": _settings()}
    if not smoke:
        rec.update(device=torch.cuda.get_device_name(0), total_memory=torch.cuda.get_device_properties(0).total_memory)
    else:
        rec.update(device="cpu (smoke)", total_memory=None)
    rec.update(torch=torch.__version__, cuda=torch.version.cuda)
    rec["zero_grad_meaning"] = {"after_step": "opt.zero_grad(set_to_none=True) after opt.step()",
                                "top_keep": "opt.zero_grad(set_to_none=False) at the top of each step"}[sc["zero_grad"]]

    # 0. the cap, calibrated where the scenario asks (fragmentation)
    caps = [sc["cap_bytes"]]
    if sc.get("calibrate"):
        base = run_fields(sc)
        cal_specs = {"padded_uncapped": dict(base, seq_lens=None, cap_bytes=None),
                     "variable_uncapped": dict(base, cap_bytes=None)}
        with ThreadPoolExecutor(2) as ex:
            futs = {k: ex.submit(launch, v, budget, f"{name} calibration {k}") for k, v in cal_specs.items()}
            cal = {k: f.result() for k, f in futs.items()}
        rec["calibration"] = {k: {f: v.get(f) for f in ("ran", "max_memory_reserved", "max_memory_allocated",
                                                        "wall_s", "error")} for k, v in cal.items()}
        r_pad, a_pad = cal["padded_uncapped"].get("max_memory_reserved"), cal["padded_uncapped"].get("max_memory_allocated")
        if not r_pad or not a_pad:
            raise RuntimeError("calibration failed: " + json.dumps(rec["calibration"]))
        if smoke:
            caps = [int(a_pad * 0.9)]  # the simulation has no fragmentation: a capacity OOM stands in
        else:
            caps = [int(r_pad * 1.02), int((r_pad + a_pad) / 2), int(a_pad * 1.03), int(a_pad * 0.97)]
        rec["calibration"]["caps_to_try"] = caps

    # 1. the recorded OOM (next batch / next cap until it dies)
    attempts = []
    batches = [sc["batch_size"]] + list(sc.get("escalate") or [])
    plan = [(b, caps[0]) for b in batches] if len(caps) == 1 else [(sc["batch_size"], c) for c in caps]
    orig = None
    for b, cap in plan:
        spec = dict(run_fields(sc), batch_size=b, cap_bytes=cap, record={"dir": str(out), "name": name})
        res = launch(spec, budget, f"{name} recorded run (batch {b}, cap {_gib(cap)})", limit=150)
        attempts.append({"batch_size": b, "cap_bytes": cap, "ran": res.get("ran"), "oom_step": res.get("oom_step"),
                         "error": res.get("error"), "max_memory_reserved": res.get("max_memory_reserved")})
        orig = (b, cap, res)
        if res.get("oom_step") is not None or res.get("skipped"):
            break
    b, cap, res = orig
    sc["batch_size"], sc["cap_bytes"] = b, cap
    rec.update(batch_size=b, cap_bytes=cap, attempts=attempts, original=res)
    rec["oom"] = res.get("oom")
    rec["oom_happened"] = res.get("oom_step") is not None
    rec["parameter_bytes"] = res.get("parameter_bytes")
    if (out / f"{name}.snapshot.pickle.gz").exists() and rec["oom_happened"]:
        rec["snapshot"] = f"{name}.snapshot.pickle.gz"
        rec["sidecar"] = f"{name}.oom.json" if (out / f"{name}.oom.json").exists() else None
    write_json(out / f"{name}.json", rec)
    if not rec["oom_happened"]:
        log(f"  {name}: the recorded run did not OOM ({res.get('error')}); fixes still run for the record")

    # 2. the fixes, each in a fresh process under the same cap
    base = run_fields(sc)
    steps = sc["steps"]
    fixes: list = []
    lock = threading.Lock()
    batch_results: dict[int, dict] = {}

    def do_fix(fid, change):
        spec = dict(base, **change)
        if ("all" in fix_histories or fid in fix_histories) and not smoke:
            spec["dump_history"] = str(out / f"{name}.fix_{fid}.snapshot.pickle.gz")
        r = launch(spec, budget, f"{name} fix {fid}")
        with lock:
            fixes.append(fix_row(fid, change, r, steps))
            if "batch_size" in change and set(change) <= {"batch_size", "batch_fraction"} and r.get("ran") is not None:
                batch_results[change["batch_size"]] = r
        return r

    fraction_runs = {}
    for f in (sc.get("fractions") or []) if "batch_fractions" in sc["fixes"] else []:
        bb = batch_of(b, f)
        if bb < b and bb not in fraction_runs.values():
            fraction_runs[f] = bb

    def do_search():
        tried = []
        while budget.left() > 12:
            with lock:
                known = dict(batch_results)
            ok = [k for k, v in known.items() if v.get("ran")]
            bad = [k for k, v in known.items() if v.get("ran") is False] + ([b] if rec["oom_happened"] else [])
            lo, hi = (max(ok) if ok else 0), (min(bad) if bad else None)
            if hi is None or hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            tried.append(mid)
            do_fix(f"batch_{mid}", {"batch_size": mid})
        with lock:
            known = dict(batch_results)
        ok = [k for k, v in known.items() if v.get("ran")]
        bad = [k for k, v in known.items() if v.get("ran") is False] + ([b] if rec["oom_happened"] else [])
        rec["batch_search"] = {"largest_ran": max(ok) if ok else None, "smallest_failed": min(bad) if bad else None,
                               "tried": sorted(set(known) | {b}), "bisection": tried,
                               "complete": bool(bad) and (min(bad) - (max(ok) if ok else 0)) <= 1}

    simple = [f for f in sc["fixes"] if f in FIX_CHANGES]
    with ThreadPoolExecutor(max(1, jobs)) as ex:
        fb = [ex.submit(do_fix, f"batch_{f.replace('/', '_of_')}", {"batch_size": bb, "batch_fraction": f})
              for f, bb in fraction_runs.items()]
        futs = [ex.submit(do_fix, f, FIX_CHANGES[f]) for f in simple]
        for f in fb:
            f.result()
        if "batch_search" in sc["fixes"]:
            futs.append(ex.submit(do_search))
        for f in futs:
            f.result()
    if "batch_search" not in rec and "batch_fractions" in sc["fixes"]:  # the brackets of the fractions alone
        ok = [k for k, v in batch_results.items() if v.get("ran")]
        bad = [k for k, v in batch_results.items() if v.get("ran") is False] + ([b] if rec["oom_happened"] else [])
        rec["batch_search"] = {"largest_ran": max(ok) if ok else None, "smallest_failed": min(bad) if bad else None,
                               "tried": sorted(set(batch_results) | {b}), "bisection": [],
                               "complete": bool(bad) and (min(bad) - (max(ok) if ok else 0)) <= 1}
    order = {f: i for i, f in enumerate(sc["fixes"])}
    fixes.sort(key=lambda r: (order.get(r["id"], -1 if r["id"].startswith("batch") else 99),
                              r["change"].get("batch_size", 0)))
    rec["fixes"] = fixes
    rec["fix_ids_planned"] = sc["fixes"]
    rec["fixes_that_ran"] = [r["id"] for r in fixes if r["ran"]]
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(out / f"{name}.json", rec)
    log(f"{name}: OOM {'yes' if rec['oom_happened'] else 'NO'} ({(rec['oom'] or {}).get('phase')}, step "
        f"{(rec['oom'] or {}).get('step')}); fixes that ran: {rec['fixes_that_ran']}; {rec['wall_s']} s")
    return rec


def bundle(out: Path) -> dict:
    files = sorted(p for p in out.iterdir() if p.is_file() and p.name != BUNDLE)
    dropped = []
    while True:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for p in files:
                tar.add(p, arcname=f"whatif/{p.name}")
        if buf.tell() < BUNDLE_LIMIT or not any(p.name.endswith(".pickle.gz") for p in files):
            break
        big = max((p for p in files if p.name.endswith(".pickle.gz")), key=lambda p: p.stat().st_size)
        files.remove(big)
        dropped.append(big.name)
    (out / BUNDLE).write_bytes(buf.getvalue())
    return {"bundle": BUNDLE, "bundle_bytes": buf.tell(), "files": [p.name for p in files], "dropped": dropped}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--smoke", action="store_true", help="CPU: every code path with tiny sizes and a simulated cap")
    ap.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time budget (default 480)")
    ap.add_argument("--jobs", type=int, default=6, help="fix processes at once (default 6)")
    ap.add_argument("--fixes", default="", help="comma-separated fix ids to run (default: every fix of the "
                    "scenario; batch_fractions and batch_search name the batch runs)")
    ap.add_argument("--fix-histories", default="", help="comma-separated fix ids whose runs also record the "
                    "allocator history from the start and write it as DIR/<scenario>.fix_<id>.snapshot.pickle.gz "
                    "('all': every fix)")
    ap.add_argument("--child-spec", help=argparse.SUPPRESS)
    ap.add_argument("--child-result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_spec:
        spec = json.loads(Path(args.child_spec).read_text())
        if spec.get("smoke"):
            torch.set_num_threads(1)
        res = child_run(spec)
        write_json(Path(args.child_result), res)
        return 0
    if not args.out:
        ap.error("--out is required")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; known: {list(SCENARIOS)}")
    if not args.smoke and not torch.cuda.is_available():
        log("record_oom_whatif_h200: no CUDA device; run this on the GPU machine (or --smoke)")
        return 2
    budget = Budget(args.budget_s)
    env = {"smoke": args.smoke, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "budget_s": args.budget_s, "jobs": args.jobs, "scenarios": {}, "failures": {}}
    if not args.smoke:
        env.update(device=torch.cuda.get_device_name(0), total_memory=torch.cuda.get_device_properties(0).total_memory,
                   driver=_driver(), cudnn=torch.backends.cudnn.version())
    else:
        env.update(device="cpu (smoke)", total_memory=None, driver=None, cudnn=None)
    for name in names:
        if budget.left() < 25:
            env["scenarios"][name] = {"skipped": "time budget"}
            log(f"{name}: skipped (time budget)")
            continue
        log(f"{name}: ({budget.left():.0f} s left)")
        t0 = time.perf_counter()
        try:
            rec = run_scenario(name, out, budget, args.jobs, args.smoke,
                               only_fixes=[f for f in args.fixes.split(",") if f] or None,
                               fix_histories=[f for f in args.fix_histories.split(",") if f])
            env["scenarios"][name] = {"wall_s": round(time.perf_counter() - t0, 1), "oom": rec["oom_happened"],
                                      "fixes": len(rec["fixes"]), "fixes_that_ran": rec["fixes_that_ran"]}
        except Exception:
            tb = traceback.format_exc()[-3000:].replace(str(ROOT), ".")
            env["failures"][name] = tb
            env["scenarios"][name] = {"wall_s": round(time.perf_counter() - t0, 1), "failed": True}
            log(f"{name}: FAILED\n{tb}")
        env["skipped_by_budget"] = list(budget.skipped)
        write_json(out / "env.json", env)
    env["wall_s"] = round(time.perf_counter() - budget.t0, 1)
    env["skipped_by_budget"] = list(budget.skipped)
    write_json(out / "env.json", env)
    env["bundle"] = bundle(out)
    write_json(out / "env.json", env)
    env["bundle"] = bundle(out)  # once more, so the bundle holds the env.json that names it
    log(f"wrote {len(list(out.iterdir()))} files to {out} in {env['wall_s']} s; bundle {env['bundle']['bundle_bytes']} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
