"""The fake step's dispatch mode: the record of when each tensor storage is born and dies.

:class:`StorageTracker` notes each new storage an op returns (views and in-place results share an old
one) and its release, turns the fake tensors' out-of-place gradient sums back into the engine's in-place
ones, adds the cuBLAS workspaces (:data:`CUBLAS_WORKSPACE_BYTES` per handle) and cuDNN's convolution
workspaces and layout copies (:mod:`.convolution`), and counts model FLOPs with the trace roofline's
formulas (:func:`workbench.analysis.trace.flops.op_cost`).
"""

from __future__ import annotations

import json
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.capture.estimate.convolution import ConvolutionCalls

__all__ = ["StorageTracker", "CUBLAS_WORKSPACE_BYTES"]

# Modelled constant: torch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG=:4096:8,
# i.e. 8 chunks of 4096 KiB), taken through the caching allocator once per (handle, stream).
CUBLAS_WORKSPACE_BYTES = 32 << 20
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "dot", "vdot", "_addmm_activation"}


class StorageTracker(ConvolutionCalls, TorchDispatchMode):
    """Sees every ATen op of the fake step: notes each new storage in its outputs (``alloc``) and, through a
    weak reference, its release (``free``), with the phase, module and op; adds what kernels take that
    fake tensors do not show (cuBLAS and cuDNN workspaces, layout copies: scratch blocks) and counts the
    model FLOPs per step."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int, int, str, str, str]] = []  # action, key, nbytes, phase, module, op
        self.live: dict[int, tuple[int, weakref.ref]] = {}  # storage address -> (uid, weakref)
        self._next_uid = 0
        self.phase = "setup"
        self.module_stack: list[str] = []
        self.step = 0
        self.workspace_handles: set[str] = set()
        self.workspace_bytes = 0
        self._next_synthetic = -1
        # FLOPs per step and kind, with the formulas the trace roofline uses (workbench.analysis.trace.flops)
        self.flops: dict[int, dict[str, float]] = {}
        self.upper: dict[int, int] = {}  # synthetic key -> the most an unpredictable workspace may take
        self.data_dependent: dict[str, int] = {}  # values fake tensors do not hold, and what was assumed
        self.constants: dict[int, tuple] = {}  # storage -> (tensor, the value of all its elements)
        self._init_convolutions()  # cuDNN's workspaces and layout copies (convolution.py)
        # gradient sums the GPU does in place (see _maybe_accumulation)
        self.alloc_index: dict[int, int] = {}
        self.free_index: dict[int, int] = {}
        self.producer: dict[int, int] = {}
        self.pending_sum = None

    def _module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""

    def note(self, t: torch.Tensor, op: str) -> int:
        """Record ``t``'s storage if it is new; return the storage's id for this lifetime. A sparse tensor (an
        embedding's sparse gradient) is its indices' and values' storages."""
        if t.layout == torch.sparse_coo:
            self.note(t._indices(), op)
            return self.note(t._values(), op)
        if t.layout != torch.strided:
            return -1  # other layouts (nested, compressed sparse): not seen in a training step here
        st = t.untyped_storage()
        addr = st._cdata
        entry = self.live.get(addr)
        if entry is not None:
            uid, ref = entry
            if ref() is st:
                return uid
            self._release(addr)  # its callback has not run yet; the address was reused
        uid = self._next_uid
        self._next_uid += 1

        def released(ref, addr=addr):
            entry = self.live.get(addr)
            if entry is not None and entry[1] is ref:  # this lifetime's weak reference, whatever uid it now has
                self._release(addr)

        self.live[addr] = (uid, weakref.ref(st, released))
        self.alloc_index[uid] = len(self.events)
        self.events.append(("alloc", uid, st.nbytes(), self.phase, self._module(), op))
        if self.phase == "backward":
            self.producer[uid] = id(torch._C._current_autograd_node())
        return uid

    def _release(self, addr: int) -> None:
        uid, _ = self.live.pop(addr)
        self.free_index[uid] = len(self.events)
        self.events.append(("free", uid, 0, self.phase, "", ""))

    # --- the autograd engine's gradient accumulation ---------------------------------------------------
    # Where two gradients reach one input, the engine sums them (InputBuffer::accumulate): in place into the
    # old one (or else the new one) when it holds the last reference to that tensor and its storage, out of
    # place otherwise; a tensor subclass on either side always gets the out-of-place sum. On fake tensors
    # (a subclass) every sum is therefore out of place: a new block the GPU never allocates (a residual
    # network's backward: one per skip connection, the size of the block's activation). The tracker notes such
    # a sum (an ``add`` in the backward of two same-shape dense gradients, the older one made by an earlier
    # autograd node) and, at the next op, if the engine dropped one of the two right after (the real engine
    # would then have held the last reference), rewrites the events as the in-place sum: the result keeps
    # that operand's block (no allocation, no free).
    def _maybe_accumulation(self, func, args, kwargs, out) -> None:
        if (self.phase != "backward" or torch.is_grad_enabled() or len(args) < 2 or kwargs.get("alpha", 1) != 1
                or not all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in (args[0], args[1], out))):
            return
        a, b = args[0], args[1]
        if not (a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype
                and a.is_contiguous() and b.is_contiguous()):
            return
        ua, ub, uo = self.uid_of(a), self.uid_of(b), self.uid_of(out)
        node = id(torch._C._current_autograd_node())
        if None in (ua, ub, uo) or self.producer.get(ua) == node and self.producer.get(ub) == node:
            return  # both made by the node running now: a sum inside its backward formula
        if a.untyped_storage().nbytes() != out.untyped_storage().nbytes():
            return
        self.pending_sum = (uo, ua, ub, out.untyped_storage()._cdata)

    def settle_accumulation(self) -> None:
        """Resolve the sum noted by :meth:`_maybe_accumulation` (called before the next op and at the end of
        the backward)."""
        if self.pending_sum is None:
            return
        uo, ua, ub, addr = self.pending_sum
        self.pending_sum = None
        entry = self.live.get(addr)
        if entry is None or entry[0] != uo:
            return
        for kept in (ua, ub):  # the engine tries the old gradient first, then the new one
            fi = self.free_index.get(kept)
            if fi is not None and fi > self.alloc_index[uo]:
                self.events[self.alloc_index[uo]] = None  # no block for the sum ...
                self.events[fi] = None  # ... which lives on in the operand's
                self.free_index.pop(kept)
                self.live[addr] = (kept, entry[1])
                self.producer[kept] = self.producer.get(uo)
                return

    def constant(self, t: torch.Tensor, value) -> torch.Tensor:
        """Note that every element of the fake ``t`` (and of its views) is ``value``: what ``.item()`` on it
        answers (the batch sizes of a packed sequence). Returns ``t``."""
        self.constants[t.untyped_storage()._cdata] = (t, value)
        return t

    def uid_of(self, t: torch.Tensor) -> int | None:
        if t.layout == torch.sparse_coo:
            t = t._values()
        elif t.layout != torch.strided:
            return None
        entry = self.live.get(t.untyped_storage()._cdata)
        return entry[0] if entry is not None else None

    def _workspace(self, name: str):
        # cuBLAS workspace: taken by the first GEMM of each thread (forward: the caller's thread;
        # backward: the autograd engine's device thread); never released.
        if self.workspace_bytes and name in _MATMUL_OPS:
            handle = "backward" if self.phase == "backward" else "forward"
            if handle not in self.workspace_handles:
                self.workspace_handles.add(handle)
                self.events.append(("alloc", self._next_synthetic, self.workspace_bytes, self.phase, "",
                                    f"cublas_workspace_{handle}"))
                self._next_synthetic -= 1

    def transient(self, nbytes: int, op: str, upper: int | None = None) -> None:
        """A scratch allocation that lives for one op (a cuDNN workspace): allocated after the op's
        outputs, freed before the next op. ``upper``: the most it may take where the size is not
        predictable (the record's ``nbytes_upper`` replays that case)."""
        self.close_scratch(self.open_scratch(nbytes, op, upper))

    def open_scratch(self, nbytes: int, op: str, upper: int | None = None) -> int | None:
        """Allocate scratch memory inside an op (freed by :meth:`close_scratch`); None for 0 bytes."""
        bound = int(upper) if upper is not None and upper > nbytes else None
        if nbytes <= 0 and bound is None:
            return None
        k = self._next_synthetic
        self._next_synthetic -= 1
        self.events.append(("alloc", k, max(int(nbytes), 0), self.phase, self._module(), op))
        if bound is not None:
            self.upper[k] = bound
        return k

    def close_scratch(self, key: int | None) -> None:
        if key is not None:
            self.events.append(("free", key, 0, self.phase, "", ""))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = dict(kwargs, device=torch.device("cpu"))  # fake "cuda" lives on the CPU device
        name = func._schema.name.split("::")[-1]
        self.settle_accumulation()
        self._workspace(name)
        if self.phase in ("forward", "backward", "optimizer"):
            self._count_flops(func, args, kwargs)
        special = _DATA_DEPENDENT.get(name)
        if special is not None:  # ops whose outputs fake tensors cannot size (they depend on the data)
            out = special(self, func, args, kwargs)
            if out is NotImplemented:
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        if self.cudnn and name == "convolution_backward":
            self._conv_backward(args, out, name)
            return out
        if self.cudnn and name == "convolution" and isinstance(out, torch.Tensor):
            self._conv_forward(args, out, name)
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.note(t, name)
        if func is torch.ops.aten.add.Tensor:
            self._maybe_accumulation(func, args, kwargs, out)
        return out


    def _count_flops(self, func, args, kwargs) -> None:
        from workbench.analysis.trace.flops import op_cost

        name = func._schema.name
        if name.split("::")[-1] not in _FLOP_OPS:
            return
        values = list(args) + [kwargs[a.name] for a in func._schema.arguments[len(args):] if a.name in kwargs]
        dims, types, concrete = [], [], []
        for v in values:
            if isinstance(v, torch.Tensor):
                dims.append(list(v.shape))
                types.append(_CPP_TYPES.get(v.dtype, str(v.dtype)))
                concrete.append("")
            else:
                dims.append([])
                types.append("Scalar" if v is not None else "")
                concrete.append("" if v is None else str(v))
        c = op_cost(name, json.dumps(dims), json.dumps(types), json.dumps(concrete))
        if c is not None:
            per = self.flops.setdefault(self.step, {})
            per[c.kind] = per.get(c.kind, 0.0) + c.flops


# --- ops whose outputs depend on the data (fake tensors hold none) -----------------------------------------
# Each returns what the op returns on CUDA, sized with the stated assumption, or NotImplemented (run the op).
def _scalar(tracker, func, args, kwargs):
    """``.item()``, ``float(t)``, ``if t:`` on a fake tensor: the value is not known. Torch's own code asks for
    one in input checks (``gaussian_nll_loss``: any negative variance?) and in BatchNorm with
    ``momentum=None`` (1 / batches seen): the answer is the check passing (False) and 1 for a number;
    counted in the record's ``data_dependent`` (shapes made from such a value would be wrong)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException

    t = args[0]
    known = tracker.constants.get(t.untyped_storage()._cdata) if t.layout == torch.strided else None
    if known is not None:
        return known[1]
    try:
        return func(*args, **kwargs)  # a constant fake tensors keep (the optimizer's step count) has its value
    except DataDependentOutputException:
        pass
    tracker.data_dependent["scalars"] = tracker.data_dependent.get("scalars", 0) + 1
    if t.dtype == torch.bool:
        return False
    return 1 if not (t.is_floating_point() or t.is_complex()) else 1.0


def _ctc(tracker, func, args, kwargs):
    """``_ctc_loss`` with length tensors: log_alpha is (N, T, 2 S + 1) for the longest target S. S is taken
    at its most: the targets' width (2-d targets), or the concatenated targets shared evenly (1-d)."""
    log_probs, targets = args[0], args[1]
    n = log_probs.shape[1] if log_probs.dim() == 3 else 1
    s = targets.shape[-1] if targets.dim() == 2 else -(-targets.numel() // max(n, 1))
    tracker.data_dependent["ctc_target_length"] = int(s)
    nll = log_probs.new_empty((n,) if log_probs.dim() == 3 else ())
    alpha = log_probs.new_empty((n, log_probs.shape[0], 2 * int(s) + 1))
    return nll, alpha


def _ctc_backward(tracker, func, args, kwargs):
    """``_ctc_loss_backward`` with length tensors: the gradient of log_probs; log_beta (log_alpha's shape) is
    a temporary of the CUDA kernel."""
    log_probs, log_alpha = args[1], args[6]
    grad = torch.empty_like(log_probs)
    tracker.note(grad, "_ctc_loss_backward")
    tracker.transient(log_alpha.numel() * log_alpha.element_size(), "ctc_log_beta")
    return grad


def _embedding_bag(tracker, func, args, kwargs):
    """``_embedding_bag``: the CPU kernel (which fake tensors follow) leaves offset2bag empty on its sum fast
    path; CUDA's returns offset2bag (one per index), bag_size (one per offset) and, for mode max, max_indices
    (bags x dim), which the backward reads."""
    out = func(*args, **kwargs)
    weight, indices, offsets = args[0], args[1], args[2]
    mode = args[4] if len(args) > 4 else kwargs.get("mode", 0)
    bags = out[0].shape[0]
    return (out[0], indices.new_empty(indices.numel()), indices.new_empty(offsets.shape),
            indices.new_empty((bags, weight.shape[1])) if mode == 2 else indices.new_empty(0))


_DATA_DEPENDENT = {
    "_local_scalar_dense": _scalar,
    "_ctc_loss": lambda tr, f, a, k: _ctc(tr, f, a, k) if f.__name__.endswith("Tensor") else NotImplemented,
    "_ctc_loss_backward": lambda tr, f, a, k: (_ctc_backward(tr, f, a, k) if f.__name__.endswith("Tensor")
                                               else NotImplemented),
    "_embedding_bag": _embedding_bag,
    "_embedding_bag_forward_only": _embedding_bag,
}


# ops whose FLOPs the estimate counts (the model FLOPs of workbench.analysis.trace.flops: GEMMs, convolutions,
# attention); each is seen once, at the ATen level the fake step dispatches
_FLOP_OPS = {
    "mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_int_mm", "addmv", "mv", "convolution",
    "convolution_backward", "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
}
_CPP_TYPES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
              torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int", torch.int8: "signed char",
              torch.uint8: "unsigned char", torch.bool: "bool"}
