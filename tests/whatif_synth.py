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
    """``block``: list of (kind, bytes) per block forward: kind ``keep`` (saved for the backward) or ``tmp``
    (freed at the end of the block); ``params_per_block``: parameter sizes of one block."""

    def __init__(self, cap, blocks=4, params_per_block=(4 * MiB, 4 * MiB), block=(("keep", 8 * MiB),
                 ("tmp", 8 * MiB), ("keep", 8 * MiB)), head_bytes=16 * MiB, input_bytes=1 * MiB,
                 states=2, leak=False, zero_grad_none=True):
        self.cap, self.blocks, self.ppb, self.block = cap, blocks, list(params_per_block), list(block)
        self.head_bytes, self.input_bytes, self.states, self.leak = head_bytes, input_bytes, states, leak
        self.zero_grad_none = zero_grad_none
        self.ev, self.t, self.addr, self.live = [], 0, 1 << 40, {}
        self.allocated = 0
        self.params, self.grads, self.state = [], {}, []
        self.step_no = 0

    # -- the allocator (one segment per tensor) --------------------------------------------------------
    def alloc(self, size, frames):
        if self.allocated + size > self.cap:
            self.ev.append({"action": "oom", "addr": 0, "size": size, "stream": 0, "time_us": self.t,
                            "device_free": 0, "frames": frames})
            raise OOM
        a = self.addr
        self.addr += size + (1 << 21)
        for act in ("segment_alloc", "alloc"):
            self.ev.append({"action": act, "addr": a, "size": size, "stream": 0, "time_us": self.t, "frames": frames})
            self.t += 1
        self.live[a] = (size, frames)
        self.allocated += size
        return a

    def free(self, a, frames):
        size, _ = self.live.pop(a)
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
        self.params.append((self.alloc(self.head_bytes // 4, [LINEAR_INIT, _f("model.py", 52, "__init__"),
                                                               _f("train.py", 20, "main")]), self.head_bytes // 4, -1))

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
        # backward
        if not self.leak:
            self.free(head, BACKWARD)
        for b in reversed(range(self.blocks)):
            tr = [self.alloc(self.live[a][0], BACKWARD) for a in saved[b]]
            for (pa, p, pb) in self.params:
                if pb == b and pa not in self.grads:
                    self.grads[pa] = self.alloc(p, ACCUM)
            for a in saved[b] + tr:
                self.free(a, BACKWARD)
        for (pa, p, pb) in self.params:
            if pa not in self.grads:
                self.grads[pa] = self.alloc(p, ACCUM)
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

    def run(self, steps=50):
        """Build the model and run steps until the OOM; the step it died in (1-based) or None."""
        try:
            self.build()
            for _ in range(steps):
                self.step()
        except OOM:
            return self.step_no or None
        return None

    def snapshot(self):
        segs = []
        for a, (size, frames) in sorted(self.live.items()):
            segs.append({"device": 0, "address": a, "total_size": size, "allocated_size": size, "active_size": size,
                         "requested_size": size, "stream": 0, "segment_type": "large" if size > MiB else "small",
                         "is_expandable": False, "frames": [],
                         "blocks": [{"address": a, "size": size, "requested_size": size, "state": "active_allocated",
                                     "frames": frames}]})
        snap = snapshot_from_dict({"segments": segs, "device_traces": [self.ev], "allocator_settings": {
            "expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}}, "synthetic-whatif")
        snap.extra["oom"] = {"limit_bytes": self.cap, "torch_message": None}
        return snap
