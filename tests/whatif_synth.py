"""Small synthetic allocator histories of a training loop, with torch-like Python frames (issue 31 tests).

:class:`Sim` runs a toy model of ``blocks`` identical blocks through steps of forward, backward, optimizer
step and zero_grad, allocating as torch would (every tensor its own segment: no caching, so allocated ==
reserved), and stops with an ``oom`` event as soon as a request would pass the cap. The frames name what
workbench's stack features look for: parameters made in ``torch/nn/modules/linear.py __init__`` under a
``<genexpr>`` loop that builds the blocks, block allocations under the model's ``for blk in self.blocks``
line, gradients in autograd's AccumulateGrad, optimizer state in ``torch/optim/adamw.py _init_group``,
frees in ``zero_grad``.
"""

from __future__ import annotations

from workbench.analysis.memory.allocator_model import CachingAllocatorModel
from workbench.io.snapshot import snapshot_from_dict

MiB = 2**20


def _f(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


MAIN = _f("train.py", 30, "main")
CALL = _f("torch/nn/modules/module.py", 1750, "_call_impl")
LOOP = _f("model.py", 60, "forward")  # for blk in self.blocks: x = blk(x)
EMBED = _f("model.py", 58, "forward")
HEAD = _f("model.py", 62, "forward")
LINEAR_FWD = _f("torch/nn/modules/linear.py", 125, "forward")
LINEAR_INIT = _f("torch/nn/modules/linear.py", 106, "__init__")
BACKWARD = [_f("torch::autograd::generated::MmBackward0::apply(...)", 0, "torch::autograd::generated::MmBackward0::apply(...)"),
            _f("torch/autograd/graph.py", 825, "_engine_run_backward"), _f("torch/_tensor.py", 626, "backward"),
            _f("train.py", 40, "main")]
ACCUM = [_f("??", 0, "torch::autograd::AccumulateGrad::apply(...)")] + BACKWARD[1:]
STATE = [_f("torch/optim/adamw.py", 150, "_init_group"), _f("torch/optim/adamw.py", 200, "step"),
         _f("train.py", 42, "main")]
OPT_TMP = [_f("torch/optim/adamw.py", 500, "_multi_tensor_adamw"), _f("torch/optim/adamw.py", 200, "step"),
           _f("train.py", 42, "main")]
ZERO = [_f("torch/optim/optimizer.py", 900, "zero_grad"), _f("train.py", 44, "main")]
INPUT = [_f("train.py", 36, "main")]
LEAK = [_f("train.py", 38, "main")]


class OOM(Exception):
    pass


class Sim:
    """A training loop whose allocations go through :class:`CachingAllocatorModel` (the OOM is decided
    there) and are written as a history in which every tensor has a segment of its own.

    ``block``: list of (kind, bytes) per block forward: kind ``keep`` (saved for the backward) or ``tmp``
    (freed at the end of the block); ``params_per_block``: parameter sizes of one block."""

    def __init__(self, cap, blocks=4, params_per_block=(4 * MiB, 4 * MiB), block=(("keep", 8 * MiB),
                 ("tmp", 8 * MiB), ("keep", 8 * MiB)), head_bytes=16 * MiB, input_bytes=1 * MiB,
                 states=2, leak=False, zero_grad_none=True, scale=1.0, warmup_scale=None):
        # scale: the batch as a fraction of the recorded one (activations, inputs and the head scale)
        block = [(kind, int(b * scale) // 512 * 512) for kind, b in block]
        head_bytes, input_bytes = int(head_bytes * scale) // 512 * 512, max(512, int(input_bytes * scale) // 512 * 512)
        self.cap, self.blocks, self.ppb, self.block = cap, blocks, list(params_per_block), list(block)
        self.head_bytes, self.input_bytes, self.states, self.leak = head_bytes, input_bytes, states, leak
        self.zero_grad_none = zero_grad_none
        self.head_param = 4 * MiB
        # warmup_scale: one step at that batch fraction before the history starts (what predates it has no stack)
        self.warmup = None if warmup_scale is None else Sim(cap, blocks, params_per_block, block, head_bytes,
                                                            input_bytes, states, leak, zero_grad_none,
                                                            warmup_scale / scale if scale else warmup_scale)
        self.cut = 0
        self.born: dict = {}
        self.ev, self.t, self.addr, self.live = [], 0, 1 << 40, {}
        self.allocated = 0
        # what torch's caching allocator would hold: the OOM is decided there (a new segment past the cap
        # first releases the cached free segments, as torch does before it raises)
        self.model, self.handles = CachingAllocatorModel(), {}
        self.params, self.grads, self.state = [], {}, []
        self.step_no = 0

    # -- the allocator (one segment per tensor) --------------------------------------------------------
    def alloc(self, size, frames):
        m = self.model
        grow = m.would_grow(size)
        if grow and m.reserved_bytes + grow > self.cap:
            m.empty_cache()
        if grow and m.reserved_bytes + m.would_grow(size) > self.cap:
            self.ev.append({"action": "oom", "addr": 0, "size": size, "stream": 0, "time_us": self.t,
                            "device_free": 0, "frames": frames})
            raise OOM
        a = self.addr
        self.addr += size + (1 << 21)
        for act in ("segment_alloc", "alloc"):
            self.ev.append({"action": act, "addr": a, "size": size, "stream": 0, "time_us": self.t, "frames": frames})
            self.t += 1
        self.live[a] = (size, frames)
        self.born[a] = len(self.ev)
        self.allocated += size
        self.handles[a] = m.malloc(size)
        return a

    def free(self, a, frames):
        size, _ = self.live.pop(a)
        self.model.free(self.handles.pop(a))
        for act in ("free_requested", "free_completed", "segment_free"):
            self.ev.append({"action": act, "addr": a, "size": size, "stream": 0, "time_us": self.t, "frames": frames})
            self.t += 1
        self.allocated -= size

    # -- the loop ----------------------------------------------------------------------------------------
    def build(self):
        for b in range(self.blocks):
            for j, p in enumerate(self.ppb):
                fr = [LINEAR_INIT, _f("model.py", 10 + j, "__init__"), _f("model.py", 50, "<genexpr>"),
                      _f("model.py", 50, "__init__"), _f("train.py", 20, "main")]
                self.params.append((self.alloc(p, fr), p, b))
        self.params.append((self.alloc(self.head_param, [LINEAR_INIT, _f("model.py", 52, "__init__"),
                                                               _f("train.py", 20, "main")]), self.head_param, -1))

    def step(self):
        self.step_no += 1
        x = self.alloc(self.input_bytes, INPUT)
        saved = []
        e = self.alloc(self.input_bytes * 2, [_f("torch/nn/modules/sparse.py", 190, "forward"), CALL, EMBED, CALL, MAIN])
        for b in range(self.blocks):
            kept, tmp = [], []
            for j, (kind, size) in enumerate(self.block):
                fr = [LINEAR_FWD, CALL, _f("model.py", 40 + j, "forward"), CALL, LOOP, CALL, MAIN]
                a = self.alloc(size, fr)
                (kept if kind == "keep" else tmp).append(a)
            for a in tmp:
                self.free(a, [_f("model.py", 40 + len(self.block), "forward"), CALL, LOOP, CALL, MAIN])
            saved.append(kept)
        head = self.alloc(self.head_bytes, [LINEAR_FWD, CALL, HEAD, CALL, MAIN])
        # backward, op by op as autograd runs it: the loss' gradient of the head's output, then each saved
        # tensor (the last first) meets the gradient flowing back: the gradient of its input (as large as it)
        # is made while both are there, then the flowing one and the saved tensor go
        flow = self.alloc(self.head_bytes, BACKWARD)
        g = self.alloc(self.head_bytes, BACKWARD)
        self.free(flow, BACKWARD)
        flow = g
        if not self.leak:
            self.free(head, BACKWARD)
        for b in reversed(range(self.blocks)):
            for n, a in enumerate(reversed(saved[b])):
                g = self.alloc(self.live[a][0], BACKWARD)
                if n == 0:
                    self._block_grads(b)
                self.free(flow, BACKWARD)
                flow = g
                self.free(a, BACKWARD)
            if not saved[b]:
                self._block_grads(b)
        for (pa, p, pb) in self.params:
            if pa not in self.grads:
                self.grads[pa] = self.alloc(p, ACCUM)
        self.free(flow, BACKWARD)
        self.free(e, BACKWARD)
        self.free(x, BACKWARD)
        # optimizer
        if self.states and not self.state:
            for (pa, p, pb) in self.params:
                for _ in range(self.states):
                    self.state.append(self.alloc(p, STATE))
        if self.states:
            tmp = [self.alloc(p, OPT_TMP) for (pa, p, pb) in self.params]
            for a in tmp:
                self.free(a, OPT_TMP)
        if self.zero_grad_none:
            for a in list(self.grads.values()):
                self.free(a, ZERO)
            self.grads = {}

    def _block_grads(self, b):
        for (pa, p, pb) in self.params:
            if pb == b and pa not in self.grads:
                self.grads[pa] = self.alloc(p, ACCUM)

    def run(self, steps=50):
        """Build the model and run steps until the OOM; the step it died in (1-based) or None."""
        try:
            self.build()
            if self.warmup is not None:  # the same tensors for the parameters, one step at the warmup batch
                saved = (self.block, self.head_bytes, self.input_bytes)
                self.block, self.head_bytes, self.input_bytes = (self.warmup.block, self.warmup.head_bytes,
                                                                  self.warmup.input_bytes)
                self.step()
                self.block, self.head_bytes, self.input_bytes = saved
                self.cut, self.step_no = len(self.ev), 0
            for _ in range(steps):
                self.step()
        except OOM:
            return self.step_no or None
        return None

    def raw(self):
        """The torch-style snapshot dict (``torch.cuda.memory._snapshot()``'s shape)."""
        segs = []
        for a, (size, frames) in sorted(self.live.items()):
            if self.born.get(a, 0) < self.cut:
                frames = []  # made before the history started: no stack
            segs.append({"device": 0, "address": a, "total_size": size, "allocated_size": size, "active_size": size,
                         "requested_size": size, "stream": 0, "segment_type": "large" if size > MiB else "small",
                         "is_expandable": False, "frames": [],
                         "blocks": [{"address": a, "size": size, "requested_size": size, "state": "active_allocated",
                                     "frames": frames}]})
        return {"segments": segs, "device_traces": [list(self.ev[self.cut:])], "allocator_settings": {
            "expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}

    def snapshot(self):
        snap = snapshot_from_dict(self.raw(), "synthetic-whatif")
        snap.extra["oom"] = {"limit_bytes": self.cap, "torch_message": None}
        return snap


def write_recording(out, name: str, kw: dict, batch_size: int, steps: int, fixes: dict) -> dict:
    """A recording in the shape benchmarks/record_oom_whatif_h200.py writes, made by the simulation:
    ``<name>.json``, ``<name>.snapshot.pickle.gz``, ``<name>.oom.json``. ``fixes``: fix id -> (change dict,
    Sim keyword changes); a change that is only ``batch_size`` scales the batch."""
    import json
    from pathlib import Path

    from workbench.io.snapshot import save_snapshot

    out = Path(out)
    sim = Sim(**kw)
    died = sim.run(steps)
    assert died is not None, "the recorded run must OOM"
    save_snapshot(sim.raw(), out / f"{name}.snapshot.pickle.gz")
    (out / f"{name}.oom.json").write_text(json.dumps({"limit_bytes": kw["cap"], "requested_bytes":
                                                      sim.ev[-1]["size"]}))
    rows, batches = [], {}
    for fid, (change, skw) in fixes.items():
        run_kw = dict(kw, **skw)
        if "batch_size" in change:
            run_kw["scale"] = change["batch_size"] / batch_size
        if change.get("cap_bytes", 0) is None:
            run_kw["cap"] = 1 << 50
        f = Sim(**run_kw)
        d = f.run(steps)
        res, alloc = f.model.peak_reserved_bytes, f.model.peak_allocated_bytes
        rows.append({"id": fid, "change": change, "ran": d is None, "oom_step": None if d is None else d - 1,
                     "steps": steps, "max_memory_reserved": res, "max_memory_allocated": alloc})
        if set(change) <= {"batch_size", "batch_fraction"}:
            batches[change["batch_size"]] = d is None
    ok = [b for b, r in batches.items() if r]
    bad = [b for b, r in batches.items() if not r] + [batch_size]
    rec = {"scenario": name, "batch_size": batch_size, "steps": steps, "leak": bool(kw.get("leak")),
           "cap_bytes": kw["cap"], "oom_happened": True, "oom": {"step": died - 1}, "smoke": False,
           "snapshot": f"{name}.snapshot.pickle.gz", "sidecar": f"{name}.oom.json", "fixes": rows,
           "batch_search": {"largest_ran": max(ok) if ok else None, "smallest_failed": min(bad)}}
    (out / f"{name}.json").write_text(json.dumps(rec))
    return rec
