"""Predict a training step's peak GPU memory without a GPU: run it on fake tensors and record when
each tensor storage is born and dies.

    >>> from workbench.capture.estimate import estimate
    >>> e = estimate(lambda: torch.nn.Linear(1024, 1024), lambda bs: torch.randn(bs, 1024),
    ...              lambda p: torch.optim.AdamW(p), batch_size=64)          # doctest: +SKIP
    >>> e = estimate(workload, amp_bf16(), batch_size=64)   # the harness's Workload/Configuration  # doctest: +SKIP
    >>> e.peak_allocated_bytes, e.by_category                                # doctest: +SKIP

The one-call API (:func:`estimate`, :func:`largest_batch_that_fits`, :func:`compare_configurations`,
:func:`load_estimate_file`) chains the fake step here with the caching-allocator replay and tables of
:mod:`workbench.analysis.estimate` (no torch). The step is described by the harness's
:class:`~workbench.capture.configurations.Workload` and
:class:`~workbench.capture.configurations.Configuration` (:func:`step_description` turns the
function form into them).

No device and no real memory are touched: the model is built on the ``meta`` device, its
parameters become :class:`torch._subclasses.fake_tensor.FakeTensor`\\ s, and forward, loss,
backward, ``optimizer.step()`` and ``zero_grad()`` run under ``FakeTensorMode``. A
``TorchDispatchMode`` sees every ATen op and notes each *new* storage in its outputs (views and
in-place results share an old one); a weak reference on the storage notes when it is released.
The result is a plain record (lists and dicts, no torch objects) that
:func:`workbench.analysis.estimate.estimate_from_record` turns into peaks with the caching
allocator model.

Why the fake tensors live on the CPU device, and what is done so that the step still behaves as
it would on CUDA:

* A CPU-only torch build cannot run autograd on fake *CUDA* tensors (the engine asks for the CUDA
  device guard, which such a build does not have), so the fake device is ``cpu`` and sizes are
  accounted exactly the same way.
* Autocast: CUDA's autocast policy (which ops run in bf16/fp16, which in fp32, which promote,
  the cache of weight casts) differs from the CPU one (e.g. ``layer_norm`` and ``softmax`` run in
  fp32 on CUDA). While the step is traced, the ``AutocastCPU`` kernels are replaced by Python
  kernels that follow the CUDA lists of aten/src/ATen/autocast_mode.h; they are removed afterwards.
* Dropout: on CUDA ``dropout`` runs the fused ``native_dropout`` and keeps a 1-byte mask; the CPU
  path keeps a full-precision noise tensor. The same replaced kernel routes ``dropout`` to
  ``native_dropout``.
* Optimizers: on CUDA an optimizer left at ``foreach=None`` picks the foreach implementation,
  whose temporaries (e.g. one ``sqrt`` per parameter for Adam) count; it is set explicitly here.
* Host-side step counters of non-fused optimizers are not device memory and are dropped.

Not seen by fake tensors (see docs/architecture.md): workspaces that kernels take internally
(cuDNN convolution, flash attention), and the CUDA context. The cuBLAS workspace is added as a
modelled constant (:data:`CUBLAS_WORKSPACE_BYTES` per cuBLAS handle: one for the forward thread,
one for the autograd engine's device thread).
"""

from __future__ import annotations

import contextlib
import gc
import json
import runpy
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from workbench.analysis import cudnn_model
from workbench.analysis.estimate import Estimate, estimate_from_record, estimate_table, fits_table
from workbench.analysis.experiment import HEADROOM_COLUMNS, PRECISIONS, Headroom, search_largest
from workbench.capture.configurations import (
    Configuration,
    Workload,
    _split_loss,
    apply_checkpointing,
    check_precision,
    checkpointed_modules,
)
from workbench.errors import BadArgument, BadArtifact

__all__ = [
    # the one-call API
    "estimate",
    "largest_batch_that_fits",
    "compare_configurations",
    "load_estimate_file",
    "EstimateFile",
    # the fake step and its parts
    "PRECISIONS",
    "CUBLAS_WORKSPACE_BYTES",
    "trace_step_memory",
    "trace_workload_memory",
    "step_description",
    "apply_checkpointing",
    "checkpointed_modules",
    "measure_step_memory",
    "warm_up_cublas",
]

# Modelled constant: torch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG=:4096:8,
# i.e. 8 chunks of 4096 KiB), taken through the caching allocator once per (handle, stream).
CUBLAS_WORKSPACE_BYTES = 32 << 20
_MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "dot", "vdot", "_addmm_activation"}

# --- CUDA autocast policy (aten/src/ATen/autocast_mode.h, CUDA lists) --------------------------------
_LOWER = """_convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc conv_transpose1d
conv_transpose2d.input conv_transpose3d.input convolution cudnn_convolution cudnn_convolution_transpose
prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul
linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
_scaled_dot_product_flash_attention scaled_dot_product_attention""".split()
_FP32 = """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar
pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm rms_norm frobenius_norm.dim
nuclear_norm nuclear_norm.dim cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss
multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy
binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp upsample_nearest1d
_upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d
_upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa
upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa norm.Scalar norm.ScalarOpt_dim""".split()
_FP32_SET_OPT_DTYPE = """prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList""".split()
_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add".split()
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# element types by the names the estimate and its convolution table use (cudnn_model.conv_call_key)
DTYPE_NAMES = {torch.float32: "fp32", **{v: k for k, v in _DTYPES.items()}}


def _op(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base)
    return getattr(packet, overload or "default")


class _CudaAutocastOnCpu:
    """Replace the AutocastCPU kernels by ones that follow CUDA's policy (and CUDA's dropout).

    ``lower`` is the autocast dtype, or None for fp32/tf32 (no casts; dropout is still routed to
    the CUDA kernel). Active only while an ``AutocastCPU`` key is enabled, i.e. inside
    ``torch.autocast("cpu")`` (which the tracer enters around forward and loss).
    """

    def __init__(self, lower: torch.dtype | None):
        self.lower = lower
        self.cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self.lib = None

    def _eligible(self, t) -> bool:
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64

    def _cast(self, to, t):
        if isinstance(t, (list, tuple)):
            return type(t)(self._cast(to, x) for x in t)
        if not self._eligible(t) or t.dtype == to:
            return t
        cacheable = (to == self.lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                     and torch.is_autocast_cache_enabled())
        if cacheable:
            hit = self.cache.get(id(t))
            if hit is not None and hit[0]() is t:
                return hit[1]
        out = t.to(to)
        if cacheable:
            self.cache[id(t)] = (weakref.ref(t), out)
        return out

    def _kernel(self, name: str, policy: str):
        op = _op(name)
        no_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        dtype_pos = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)
        dtype_kwonly = dtype_pos is not None and op._schema.arguments[dtype_pos].kwarg_only

        def kernel(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(no_autocast):
                if self.lower is None or policy == "passthrough":
                    return op(*args, **kwargs)
                if policy == "lower":
                    return op(*self._cast(self.lower, args), **{k: self._cast(self.lower, v) for k, v in kwargs.items()})
                if policy == "fp32":
                    return op(*self._cast(torch.float32, args), **kwargs)
                if policy == "fp32_set_opt_dtype":
                    if args and self._eligible(args[0]) and dtype_pos is not None:
                        if dtype_kwonly or len(args) <= dtype_pos:
                            kwargs.setdefault("dtype", torch.float32)
                        elif args[dtype_pos] is None:
                            args = args[:dtype_pos] + (torch.float32,) + args[dtype_pos + 1:]
                    return op(*args, **kwargs)
                # promote: the widest floating type among the arguments
                floats = [t for t in tree_leaves((args, kwargs)) if self._eligible(t)]
                to = torch.float32 if any(t.dtype == torch.float32 for t in floats) else self.lower
                return op(*self._cast(to, args), **kwargs)

        return kernel

    def _dropout(self, input, p, train):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
            if train and 0 < p < 1 and input.numel() > 0:
                return torch.ops.aten.native_dropout.default(input, p, train)[0]
            return torch.ops.aten.dropout.default(input, p, train)

    def _sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        # CUDA's choice on sm80+/sm90 (torch's default backend order): flash attention for 16-bit
        # inputs without a mask, memory-efficient attention otherwise. Both keep the output and a
        # float32 log-sum-exp for backward, never the L x L attention matrix that the CPU math
        # fallback (taken for dropout on the CPU) would save.
        no_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
        with torch._C._ExcludeDispatchKeyGuard(no_autocast):
            if self.lower is not None:
                query, key, value = (self._cast(self.lower, t) for t in (query, key, value))
            d = query.shape[-1]
            if query.dim() == 4 and not enable_gqa:
                need_grad = any(t.requires_grad for t in (query, key, value)) and torch.is_grad_enabled()
                if (attn_mask is None and query.dtype in (torch.float16, torch.bfloat16) and d <= 256
                        and d % 8 == 0):
                    return torch.ops.aten._scaled_dot_product_flash_attention.default(
                        query, key, value, dropout_p, is_causal, False, scale=scale)[0]
                if d % 8 == 0 or query.dtype == torch.float32:
                    return torch.ops.aten._scaled_dot_product_efficient_attention.default(
                        query, key, value, attn_mask, need_grad, dropout_p, is_causal, scale=scale)[0]
            return torch.ops.aten.scaled_dot_product_attention.default(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    def _kernels(self) -> dict:
        """One Python kernel per aten op that has an AutocastCPU kernel or a CUDA policy entry."""
        policies: dict[str, str] = {}
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"):
            if name.startswith("aten::"):
                policies[name[len("aten::"):]] = "passthrough"
        for names, policy in ((_LOWER, "lower"), (_FP32, "fp32"), (_FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype"),
                              (_PROMOTE, "promote")):
            for n in names:
                policies[n] = policy
        kernels: dict = {}
        for name, policy in policies.items():
            try:
                kernels[_op(name)] = self._kernel(name, policy)
            except (AttributeError, RuntimeError):
                continue  # not in this torch version
        # Keyed by OpOverload, so these replace the policy kernels above: every op is registered once
        # (before 2.13, torch refuses a second Python kernel for one op and key, even from one Library).
        kernels[torch.ops.aten.dropout.default] = self._dropout
        kernels[torch.ops.aten.scaled_dot_product_attention.default] = self._sdpa
        return kernels

    def __enter__(self):
        import inspect

        lib = torch.library.Library("aten", "IMPL")
        # A Python kernel that another live Library holds for the same op and key: torch refuses a
        # second one unless ``allow_override=True`` is passed (absent in 2.4, the default from 2.13).
        taken = getattr(torch.library, "_impls", set())
        can_override = "allow_override" in inspect.signature(lib.impl).parameters
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Overriding a previously registered kernel"
                for op, fn in self._kernels().items():
                    overload = op._schema.overload_name
                    key = f"aten/{op._schema.name.split('::')[-1]}{'.' + overload if overload else ''}/AutocastCPU"
                    if key in taken:
                        if not can_override:
                            continue  # leave the other Python kernel in place
                        lib.impl(op, fn, "AutocastCPU", allow_override=True)
                    else:
                        lib.impl(op, fn, "AutocastCPU")
        except BaseException:
            lib._destroy()  # nothing of a half-made registration stays behind
            raise
        self.lib = lib
        # torch.autocast.__exit__ calls torch.clear_autocast_cache() when the outermost region
        # closes (after the forward, and after each checkpoint recomputation): clear ours with it.
        self._clear_original = torch.clear_autocast_cache

        def clear_both():
            self._clear_original()
            self.cache.clear()

        torch.clear_autocast_cache = clear_both
        return self

    def __exit__(self, *exc):
        self.cache.clear()
        if getattr(self, "_clear_original", None) is not None:
            torch.clear_autocast_cache = self._clear_original
            self._clear_original = None
        if self.lib is not None:
            self.lib._destroy()
            self.lib = None
        return False


# --- checkpointing: the harness's (workbench.capture.configurations), so all three checkpoint alike ---
# checkpointed_modules(model, spec) and apply_checkpointing(model, spec) are imported above.


# --- the tracer ---------------------------------------------------------------------------------------
class _StorageTracker(TorchDispatchMode):
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
        # FLOPs per step and kind, with the formulas the trace roofline uses (workbench.analysis.flops)
        self.flops: dict[int, dict[str, float]] = {}
        self.cudnn = True  # model cuDNN's convolution workspaces (cudnn_model)
        self.conv_math = "fp32"  # fp32 convolutions: "fp32" (no TF32) or "tf32"
        self.upper: dict[int, int] = {}  # synthetic key -> the most an unpredictable workspace may take
        # measured convolution workspaces (cudnn_model.ConvWorkspaces; None: the rules only), and every
        # distinct convolution call seen: key -> (direction, the call's geometry), for calibration
        self.conv_table = None
        self.conv_calls: dict[str, dict] = {}
        self.conv_measured = 0
        self.conv_ruled = 0
        # gradient sums the GPU does in place (see _maybe_accumulation)
        self.alloc_index: dict[int, int] = {}
        self.free_index: dict[int, int] = {}
        self.producer: dict[int, int] = {}
        self.pending_sum = None

    def _module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""

    def note(self, t: torch.Tensor, op: str) -> int:
        """Record ``t``'s storage if it is new; return the storage's id for this lifetime."""
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
                or not all(isinstance(t, torch.Tensor) for t in (args[0], args[1], out))):
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

    def uid_of(self, t: torch.Tensor) -> int | None:
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

    def _conv_call(self, direction: str, x, w, y, stride, padding, dilation, transposed, output_padding,
                   groups) -> tuple[int, int | None]:
        """(bytes, upper bound or None) of one cuDNN convolution call's workspace: the measured table's
        entry when it holds the call, else the rule of cudnn_model (with its bound where unpredictable)."""
        dtype = DTYPE_NAMES.get(x.dtype, str(x.dtype))
        channels_last = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        key = cudnn_model.conv_call_key(direction, x.shape, w.shape, y.shape, stride, padding, dilation, transposed,
                                        output_padding, groups, dtype, self.conv_math, channels_last)
        if key not in self.conv_calls:
            self.conv_calls[key] = {
                "direction": direction, "x": list(x.shape), "x_stride": list(x.stride()), "w": list(w.shape),
                "y": list(y.shape), "stride": [int(v) for v in stride], "padding": [int(v) for v in padding],
                "dilation": [int(v) for v in dilation], "transposed": bool(transposed),
                "output_padding": [int(v) for v in output_padding], "groups": int(groups), "dtype": dtype,
                "math": self.conv_math if dtype == "fp32" else "tc"}
        measured = self.conv_table.get(key) if self.conv_table is not None else None
        if measured is not None:
            self.conv_measured += 1
            return int(measured), None
        self.conv_ruled += 1
        kw = dict(transposed=bool(transposed), groups=int(groups), math=self.conv_math)
        el = x.element_size()
        return (cudnn_model.conv_workspace_bytes(direction, x.shape, w.shape, y.shape, el, **kw),
                cudnn_model.conv_workspace_upper_bytes(direction, x.shape, w.shape, y.shape, el, **kw))

    def _layout_copies(self, x, w, *others) -> list:
        """cuDNN convolutions run on tensors contiguous in one memory format (channels-last when the input ``x``
        or the weight ``w`` is, else NCHW): Convolution.cpp copies any operand that is not (a slice of a
        concatenation's gradient, a transposed view) for the call's duration. Opens one scratch block per copy."""
        fmt = torch.contiguous_format
        if any(t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
               for t in (x, w)):
            fmt = torch.channels_last
        keys = []
        for t in (*others, w, x):
            if isinstance(t, torch.Tensor) and not t.is_contiguous(memory_format=fmt if t.dim() == 4 else
                                                                    torch.contiguous_format):
                keys.append(self.open_scratch(t.numel() * t.element_size(), "conv_operand_copy"))
        return keys

    def _conv_forward(self, args, out, name: str) -> None:
        """convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups): the
        operand copies, the output, the workspace (freed at return), the copies freed."""
        x, w = args[0], args[1]
        copies = self._layout_copies(x, w)
        self.note(out, name)
        nbytes, upper = self._conv_call("forward", x, w, out, *args[3:9])
        self.transient(nbytes, "cudnn_conv_workspace", upper)
        for k in copies:
            self.close_scratch(k)

    def _conv_backward(self, args, out, name: str) -> None:
        """convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        output_padding, groups, output_mask) in the order cuDNN's backward allocates: the operand copies (a
        non-contiguous incoming gradient), the input gradient then its workspace, the weight gradient then its
        workspace, then the bias gradient; the copies are freed at return."""
        gy, x, w = args[0], args[1], args[2]
        geometry = args[4:10]
        mask = list(args[10])
        copies = self._layout_copies(x, w, gy)
        for i, t in enumerate(out):
            if isinstance(t, torch.Tensor):
                self.note(t, name)
            if i < 2 and mask[i]:
                direction = ("backward_data", "backward_weight")[i]
                nbytes, upper = self._conv_call(direction, x, w, gy, *geometry)
                self.transient(nbytes, "cudnn_conv_workspace", upper)
        for k in copies:
            self.close_scratch(k)

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
        from workbench.analysis.flops import op_cost

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


# ops whose FLOPs the estimate counts (the model FLOPs of workbench.analysis.flops: GEMMs, convolutions,
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


# --- cuDNN's fused LSTM, as CUDA runs nn.LSTM ------------------------------------------------------
# On the CPU (and so on fake CPU tensors) nn.LSTM runs oneDNN's RNN layer, which keeps other tensors
# than cuDNN's: CUDA calls _cudnn_rnn, which returns the output, h_n, c_n and a reserve space (gates
# and states of every step, kept for backward), takes a workspace for the call, and under autocast
# casts input, states and weights to the lower dtype and copies the weights into one flat buffer
# (aten/src/ATen/native/cudnn/AutocastRNN.cpp). nn.LSTM's call to _VF.lstm is routed here while a
# step is traced; the sizes come from workbench.analysis.cudnn_model.
class _CudnnLstmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, h0, c0, meta, flat, *weights):
        tracker, info = meta
        b, t = (input.shape[0], input.shape[1]) if info["batch_first"] else (input.shape[1], input.shape[0])
        hid, dirs, layers = info["hidden"], 2 if info["bidirectional"] else 1, info["layers"]
        out_shape = (b, t, hid * dirs) if info["batch_first"] else (t, b, hid * dirs)
        el = input.element_size()
        n_w = sum(w.numel() for w in weights)
        # in the order of aten/src/ATen/native/cudnn/RNN.cpp's _cudnn_rnn: the time-major copy of a
        # batch-first input (input.transpose(0, 1).contiguous()), the outputs, the workspace, the reserve
        # space; the workspace and the copy die when the call returns
        ws = cudnn_model.lstm_workspace_bytes(
            "forward", "LSTM", t, b, input.shape[-1], hid, layers, info["bidirectional"], el, n_w)
        copy_key = tracker.open_scratch(input.numel() * el if info["batch_first"] else 0, "cudnn_rnn_input_copy")
        output = input.new_empty(out_shape)
        hy = h0.new_empty(h0.shape)
        cy = c0.new_empty(c0.shape)
        ws_key = tracker.open_scratch(ws, "cudnn_rnn_workspace")
        reserve = None
        if info["train"]:
            reserve = input.new_empty((cudnn_model.lstm_reserve_bytes(
                "LSTM", t, b, input.shape[-1], hid, layers, info["bidirectional"], el),), dtype=torch.uint8)
        tracker.close_scratch(ws_key)
        tracker.close_scratch(copy_key)
        ctx.info, ctx.tracker = info, tracker
        ctx.save_for_backward(input, h0, c0, output, reserve, flat, *weights)
        return output, hy, cy

    @staticmethod
    def backward(ctx, g_out, g_hy, g_cy):
        input, h0, c0, output, reserve, flat, *weights = ctx.saved_tensors
        info, tracker = ctx.info, ctx.tracker
        b, t = (input.shape[0], input.shape[1]) if info["batch_first"] else (input.shape[1], input.shape[0])
        el = input.element_size()
        n_w = sum(w.numel() for w in weights)
        ws = cudnn_model.lstm_workspace_bytes(
            "backward", "LSTM", t, b, input.shape[-1], info["hidden"], info["layers"], info["bidirectional"], el, n_w)
        bf = info["batch_first"]
        # RNN.cpp's _cudnn_rnn_backward = _cudnn_rnn_backward_input (time-major copies of a batch-first
        # input and incoming gradient, dx, dhx, dcx, a workspace; copies and workspace die at return), then
        # _cudnn_rnn_backward_weight (another input copy, dw: one flat buffer in the weight buffer's layout
        # whose views are the weight gradients, the workspace again)
        kx = tracker.open_scratch(input.numel() * el if bf else 0, "cudnn_rnn_input_copy")
        kg = tracker.open_scratch(g_out.numel() * g_out.element_size() if bf else 0, "cudnn_rnn_grad_copy")
        dx = torch.empty_like(input)
        dh = torch.empty_like(h0)
        dc = torch.empty_like(c0)
        tracker.transient(ws, "cudnn_rnn_workspace")
        tracker.close_scratch(kg)
        tracker.close_scratch(kx)
        kx = tracker.open_scratch(input.numel() * el if bf else 0, "cudnn_rnn_input_copy")
        dw = (flat if flat is not None else weights[0]).new_empty((n_w,))
        tracker.transient(ws, "cudnn_rnn_workspace")
        tracker.close_scratch(kx)
        grads, off = [], 0
        for w in weights:
            grads.append(dw[off:off + w.numel()].view(w.shape))
            off += w.numel()
        return (dx, dh, dc, None, None, *grads)


class _CudnnVF:
    """Stands in for ``torch._VF`` inside torch.nn.modules.rnn while a step is traced: ``lstm`` on
    unpacked input goes to :class:`_CudnnLstmFunction`, everything else to the real ``_VF``."""

    def __init__(self, real, tracker, lower):
        self._real, self._tracker, self._lower = real, tracker, lower

    def __getattr__(self, name):
        return getattr(self._real, name)

    def lstm(self, *args):
        if len(args) != 9 or isinstance(args[1], torch.Tensor):  # packed sequences: the real path
            return self._real.lstm(*args)
        input, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
        h0, c0 = hx
        per_layer = (4 if has_biases else 2) * (2 if bidirectional else 1)
        if len(params) != per_layer * layers or h0.shape[-1] != c0.shape[-1]:  # projections: the real path
            return self._real.lstm(*args)
        info = {"hidden": int(c0.shape[-1]), "layers": int(layers), "bidirectional": bool(bidirectional),
                "batch_first": bool(batch_first), "train": bool(train) and torch.is_grad_enabled()}
        lower = self._lower if (self._lower is not None and torch.is_autocast_enabled("cpu")) else None
        flat = None
        weights = list(params)
        if lower is not None and input.is_floating_point():
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
                input, h0, c0 = input.to(lower), h0.to(lower), c0.to(lower)
                # the weights are cast straight into one re-flattened buffer (no per-weight copies: the
                # H200 recordings hold one 16-bit copy of the LSTM's weights); their gradients come back
                # in 16 bit and autograd casts them to the fp32 parameters' dtype
                flat = torch.empty((sum(w.numel() for w in weights),), dtype=lower)
        output, hy, cy = _CudnnLstmFunction.apply(input, h0, c0, (self._tracker, info), flat, *weights)
        return output, hy, cy


@contextlib.contextmanager
def _cudnn_rnn(tracker, lower):
    import torch.nn.modules.rnn as rnn

    real = rnn._VF
    rnn._VF = _CudnnVF(real, tracker, lower)
    try:
        yield
    finally:
        rnn._VF = real


def _to_fake(model: torch.nn.Module, mode, tracker: _StorageTracker) -> dict[int, str]:
    """Replace meta parameters and buffers by fake CPU tensors (ties kept); returns storage key -> name."""
    memo: dict[int, torch.Tensor] = {}
    keys: dict[int, str] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            table = getattr(mod, kind)
            for n, t in list(table.items()):
                if t is None:
                    continue
                fake = memo.get(id(t))
                if fake is None:
                    with mode:
                        data = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                    fake = torch.nn.Parameter(data, requires_grad=t.requires_grad) if kind == "_parameters" else data
                    memo[id(t)] = fake
                    key = tracker.note(fake, "parameter" if kind == "_parameters" else "buffer")
                    keys[key] = f"{mod_name}.{n}" if mod_name else n
                table[n] = fake
    return keys


def _forward_loss(model, inputs, loss_fn):
    """The model run on ``inputs`` as they come (a dict of keyword arguments, a sequence of positional
    ones, or one tensor) and the loss of its output: ``loss_fn(out)``, or the mean square of its first
    tensor. The output is dropped on return, as a training step drops it before backward."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    return loss_fn(out) if loss_fn is not None else _first_tensor(out).float().pow(2).mean()


def _first_tensor(out):
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t
    raise TypeError("the model's output holds no floating-point tensor to take a loss from; pass loss_fn")


def _call(fn: Callable, batch_size):
    return fn(batch_size) if batch_size is not None else fn()


def _no_optimizer(params):
    return None


def step_description(
    model_fn: Callable[[], torch.nn.Module],
    inputs_fn: Callable[..., Any],
    optimizer_fn: Callable | None = None,
    *,
    precision: str = "fp32",
    batch_size: int | None = None,
    loss_fn: Callable | None = None,
    checkpointing=False,
) -> tuple[Workload, Configuration]:
    """The harness's :class:`Workload` and :class:`Configuration` for a step given as functions:
    ``inputs_fn(batch_size)`` (or ``inputs_fn()`` when ``batch_size`` is None) gives the model's inputs,
    ``loss_fn(output)`` the loss (default: the mean square of the output's first floating tensor, in
    float32), ``optimizer_fn=None`` means no optimizer step. ``precision`` ``bf16``/``fp16`` is CUDA
    autocast around forward and loss (the Configuration's rule: autocast follows the precision)."""
    p = check_precision(precision)
    workload = Workload(
        model=model_fn,
        batch=lambda n, device: _call(inputs_fn, n),
        loss=lambda model, inputs: _forward_loss(model, inputs, loss_fn),
        optimizer=optimizer_fn if optimizer_fn is not None else _no_optimizer,
        batch_size=batch_size,
    )
    name = p + ("+checkpointing" if checkpointing else "")
    config = Configuration(name, precision=p, checkpointing=checkpointing)
    return workload, config


def trace_step_memory(
    model_fn: Callable[[], torch.nn.Module],
    inputs_fn: Callable[..., Any],
    optimizer_fn: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] | None = None,
    *,
    precision: str = "fp32",
    batch_size: int | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    checkpointing=False,
    steps: int = 2,
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_BYTES,
    conv_workspaces=None,
) -> dict:
    """Run ``steps`` training steps on fake tensors; return the record of storage births and deaths.

    ``model_fn()`` builds the ``nn.Module`` (it runs under ``torch.device("meta")``, so build on the
    default device); ``inputs_fn(batch_size)`` (or ``inputs_fn()`` when ``batch_size`` is None)
    returns a tensor, a tuple of positional inputs or a dict of keyword inputs; ``optimizer_fn``
    gets the parameters (None: no optimizer step); ``loss_fn(output)`` defaults to the mean of the
    output's squares in float32. ``precision``: ``fp32``/``tf32`` (same memory) or ``bf16``/``fp16``
    (CUDA autocast around forward and loss). The functions become a Workload and a Configuration
    (:func:`step_description`) and go through :func:`trace_workload_memory`.
    """
    workload, config = step_description(model_fn, inputs_fn, optimizer_fn, precision=precision,
                                        batch_size=batch_size, loss_fn=loss_fn, checkpointing=checkpointing)
    return trace_workload_memory(workload, config, batch_size=batch_size, steps=steps,
                                 cublas_workspace_bytes=cublas_workspace_bytes, conv_workspaces=conv_workspaces)


def trace_workload_memory(
    workload: Workload,
    configuration: Configuration | None = None,
    *,
    batch_size: int | None = None,
    steps: int = 2,
    cublas_workspace_bytes: int = CUBLAS_WORKSPACE_BYTES,
    conv_workspaces=None,
) -> dict:
    """Run ``steps`` steps of the harness's ``workload`` under ``configuration`` on fake tensors; return
    the record of storage births and deaths (:func:`workbench.analysis.estimate.estimate_from_record`
    turns it into peaks).

    As in the harness: the model comes from ``workload.model()`` (here under ``torch.device("meta")``),
    then ``configuration.transform`` (checkpointing, a dtype cast, a memory format; a ``torch_compile``
    configuration is estimated eager), inputs from ``workload.batch(batch_size, torch.device("cpu"))``
    then ``batch_transform``, the loss from ``workload.loss(model, batch)`` under the configuration's
    ``context`` and, with ``autocast``, CUDA's autocast policy at its ``precision``; the optimizer from
    ``workload.optimizer`` (AdamW at lr 1e-3 when None; a factory returning None means no optimizer
    step). ``workload.train=False`` runs forward only, under ``torch.no_grad()``. ``batch_size``
    defaults to the configuration's, then the workload's. ``conv_workspaces``: a
    :class:`~workbench.analysis.cudnn_model.ConvWorkspaces` measured on the GPU
    (:func:`workbench.capture.cudnn_calibration.calibrate`); the calls it holds take its bytes instead of
    the rules'. The record's ``conv_calls`` lists every distinct convolution call (what a calibration measures).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    config = configuration if configuration is not None else Configuration("fp32")
    if batch_size is None:
        batch_size = config.batch_size or workload.batch_size
    device = torch.device("cpu")  # the fake tensors' device (see the module's docstring)
    with torch.device("meta"):
        model = workload.model()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model_fn must return a torch.nn.Module, not {type(model).__name__}")
    model.train(workload.train)
    n_ckpt = len(checkpointed_modules(model, config.checkpointing))
    if config.transform is not None and not config.torch_compile:
        model = config.transform(model, device)
    names = {id(m): (n or type(m).__name__) for n, m in model.named_modules()}

    tracker = _StorageTracker()
    tracker.workspace_bytes = int(cublas_workspace_bytes)
    tracker.conv_math = "tf32" if config.precision == "tf32" else "fp32"
    tracker.conv_table = conv_workspaces
    mode = FakeTensorMode()
    param_keys = _to_fake(model, mode, tracker)
    params = [p for p in model.parameters()]
    n_params = sum(p.numel() for p in params)
    param_bytes = sum(p.untyped_storage().nbytes() for p in params)

    def pre_hook(module, args):
        tracker.module_stack.append(names.get(id(module), type(module).__name__))

    def post_hook(module, args, output):
        if tracker.module_stack:
            tracker.module_stack.pop()

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    h2 = torch.nn.modules.module.register_module_forward_hook(post_hook, always_call=True)
    autocast = _CudaAutocastOnCpu(_DTYPES.get(config.precision) if config.autocast else None)
    categories: dict[int, str] = {k: "parameters" for k in param_keys}
    grad_keys: set[int] = set()
    state_keys: set[int] = set()
    host_keys: set[int] = set()
    input_keys: set[int] = set()
    optimizer_name = None
    phase_marks: list[tuple[int, str, int]] = []  # (event index, phase, step)
    try:
        with mode, tracker, autocast, _cudnn_rnn(tracker, autocast.lower):
            opt = None
            if workload.train:
                trainable = [p for p in params if p.requires_grad]
                opt = (workload.optimizer(trainable) if workload.optimizer is not None
                       else torch.optim.AdamW(trainable, lr=1e-3))
            if opt is not None:
                optimizer_name = type(opt).__name__
                for group in opt.param_groups:
                    # CUDA default for foreach=None (the tensors here are on the fake CPU device)
                    if group.get("foreach", "absent") is None and not group.get("fused"):
                        group["foreach"] = True
            for step in range(steps):
                tracker.step = step
                tracker.phase = "inputs"
                phase_marks.append((len(tracker.events), "inputs", step))
                start = len(tracker.events)
                inputs = workload.batch(batch_size, device)
                if config.batch_transform is not None:
                    inputs = config.batch_transform(inputs)
                input_keys |= {e[1] for e in tracker.events[start:] if e is not None and e[0] == "alloc"}
                tracker.phase = "forward"
                phase_marks.append((len(tracker.events), "forward", step))
                with contextlib.ExitStack() as forward:
                    if not workload.train:
                        forward.enter_context(torch.no_grad())
                    forward.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
                    if config.context is not None:
                        forward.enter_context(config.context(device))
                    loss = _split_loss(workload.loss(model, inputs))[0]
                del inputs
                if workload.train:
                    tracker.phase = "backward"
                    phase_marks.append((len(tracker.events), "backward", step))
                    loss.backward()
                    tracker.settle_accumulation()
                del loss
                gc.collect()
                for p in params:
                    if p.grad is not None:
                        grad_keys.add(tracker.uid_of(p.grad))
                if opt is not None:
                    tracker.phase = "optimizer"
                    phase_marks.append((len(tracker.events), "optimizer", step))
                    opt.step()
                    for p, state in opt.state.items():
                        for name, v in state.items():
                            if isinstance(v, torch.Tensor):
                                k = tracker.uid_of(v)
                                fused = opt.defaults.get("fused") or opt.defaults.get("capturable")
                                if name == "step" and v.dim() == 0 and not fused:
                                    host_keys.add(k)  # a host-side counter on CUDA
                                else:
                                    state_keys.add(k)
                    opt.zero_grad(set_to_none=True)
                gc.collect()
            tracker.phase = "end"
            del opt
    finally:
        h1.remove()
        h2.remove()
    for k in grad_keys:
        categories.setdefault(k, "gradients")
    for k in state_keys:
        categories.setdefault(k, "optimizer_state")
    events = [e for e in tracker.events if e is not None and e[1] not in host_keys]
    # Host tensors that an inputs function builds and then copies to the device (x.cuda()) die
    # inside the inputs phase: they were never device memory.
    born_in_inputs = {e[1] for e in events if e[0] == "alloc" and e[3] == "inputs"}
    died_in_inputs = {e[1] for e in events if e[0] == "free" and e[3] == "inputs"} & born_in_inputs
    events = [e for e in events if e[1] not in died_in_inputs]
    for k in input_keys - died_in_inputs:
        categories.setdefault(k, "activations")
    for e in events:
        if e[1] < 0:
            categories[e[1]] = "workspace"
    return {
        "meta": {
            "precision": config.precision,
            "batch_size": batch_size,
            "checkpointing": bool(config.checkpointing),
            "checkpointed_modules": n_ckpt,
            "configuration": config.name,
            "optimizer": optimizer_name,
            "parameters": int(n_params),
            "parameter_bytes": int(param_bytes),
            "model": type(model).__name__,
            "steps": steps,
            "train": bool(workload.train),
            "cublas_workspace_bytes": int(cublas_workspace_bytes),
            "workspace_bound_source": cudnn_model.CONV_BOUND_SOURCE if tracker.upper else "",
            # where each convolution call's workspace came from: measured (a calibration table) or the rules
            "conv_workspaces": {"calls": tracker.conv_measured + tracker.conv_ruled,
                                "measured": tracker.conv_measured, "ruled": tracker.conv_ruled,
                                "table": dict(conv_workspaces.meta) if conv_workspaces is not None else None},
            "torch_version": torch.__version__,
            "fake_device": "cpu",
            **_flops_meta(tracker.flops, steps),
        },
        "events": {
            "action": [e[0] for e in events],
            "key": [e[1] for e in events],
            "nbytes": [e[2] for e in events],
            "phase": [e[3] for e in events],
            "module": [e[4] for e in events],
            "op": [e[5] for e in events],
            # where a workspace is not predictable (fp32 cuDNN convolutions): the most each may take
            **({"nbytes_upper": [tracker.upper.get(e[1], e[2]) if e[0] == "alloc" else e[2] for e in events]}
               if tracker.upper else {}),
        },
        "categories": categories,
        "step_of_event": _steps_of(events, tracker.events, phase_marks),
        "conv_calls": {k: tracker.conv_calls[k] for k in sorted(tracker.conv_calls)},
    }


def _flops_meta(flops: dict[int, dict[str, float]], steps: int) -> dict:
    """Model FLOPs a step (GEMMs, convolutions, attention; causal attention halved) from the last step
    traced (the first may differ: lazily built optimizer state)."""
    last = flops.get(max(flops)) if flops else {}
    model = sum(v for k, v in last.items() if k in ("gemm", "conv", "attention"))
    return {"model_flops_per_step": float(model), "flops_by_kind": {k: float(v) for k, v in sorted(last.items())}}


def _steps_of(kept, all_events, marks) -> list[int]:
    """Training-step index of each kept event (events are filtered, so map through identity)."""
    order = {id(e): i for i, e in enumerate(all_events)}
    starts = [(i, s) for i, ph, s in marks if ph == "inputs"]
    out = []
    j = 0
    for e in kept:
        i = order[id(e)]
        while j + 1 < len(starts) and starts[j + 1][0] <= i:
            j += 1
        out.append(starts[j][1] if starts and i >= starts[0][0] else 0)
    return out


# --- the real thing, for checking the estimate on a GPU ---------------------------------------------
def warm_up_cublas(device: str = "cuda") -> int:
    """Run a tiny forward and backward GEMM so cuBLAS takes its workspaces (forward thread and
    autograd thread); returns the bytes the caching allocator then holds (the workspaces)."""
    from workbench.errors import NoDevice

    if not torch.cuda.is_available():
        raise NoDevice("no CUDA device: measuring a real step needs one; the estimate itself runs without")
    lin = torch.nn.Linear(64, 64, device=device)
    x = torch.randn(8, 64, device=device, requires_grad=True)
    lin(x).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = lin(x)
    y.float().sum().backward()
    del lin, x, y
    gc.collect()
    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


def measure_step_memory(model_fn, inputs_fn, optimizer_fn=None, *, precision="fp32", batch_size=None, loss_fn=None,
                        checkpointing=False, steps: int = 2, device: str = "cuda") -> dict:
    """Run the same steps as :func:`trace_step_memory` for real on CUDA; return the allocator's peaks.

    Keys: ``max_allocated_bytes`` / ``max_reserved_bytes`` (``torch.cuda.max_memory_*`` over the
    whole run, model creation included), ``base_allocated_bytes`` / ``base_reserved_bytes`` (what
    was held before: the cuBLAS workspaces after :func:`warm_up_cublas`). Memory is released after.
    """
    from workbench.errors import NoDevice

    precision = check_precision(precision)
    if not torch.cuda.is_available():
        raise NoDevice("no CUDA device: measuring a real step needs one; the estimate itself runs without")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_alloc = torch.cuda.memory_allocated()
    base_res = torch.cuda.memory_reserved()
    dtype = _DTYPES.get(precision)
    with torch.device(device):
        model = model_fn()
    model.train()
    apply_checkpointing(model, checkpointing)
    opt = optimizer_fn(list(model.parameters())) if optimizer_fn is not None else None
    for _ in range(steps):
        with torch.device(device):
            inputs = _call(inputs_fn, batch_size)
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = _forward_loss(model, inputs, loss_fn)
        del inputs
        loss.backward()
        del loss
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    result = {
        "max_allocated_bytes": int(torch.cuda.max_memory_allocated()),
        "max_reserved_bytes": int(torch.cuda.max_memory_reserved()),
        "base_allocated_bytes": int(base_alloc),
        "base_reserved_bytes": int(base_res),
    }
    del model, opt
    gc.collect()
    torch.cuda.empty_cache()
    return result


# --- the one-call API ---------------------------------------------------------------------------------
def _describe(step, configuration, optimizer_fn, precision, batch_size, loss_fn, checkpointing):
    """(Workload, Configuration) from either form of the estimator's arguments."""
    if isinstance(step, Workload):
        if not (configuration is None or isinstance(configuration, Configuration)):
            raise TypeError("with a Workload, the second argument is a Configuration (or None: fp32)")
        if optimizer_fn is not None or loss_fn is not None:
            raise TypeError("with a Workload, the optimizer and the loss come from it; "
                            "do not pass optimizer_fn or loss_fn")
        config = configuration if configuration is not None else Configuration("fp32")
        changes = {}
        if precision is not None:  # checked by the Configuration; autocast follows it (bf16: autocast bf16)
            changes.update(precision=precision, autocast=None)
        if checkpointing is not None:
            changes["checkpointing"] = checkpointing
        return step, (config.replace(**changes) if changes else config)
    if configuration is None:
        raise TypeError("estimate(model_fn, inputs_fn, ...) needs inputs_fn, or pass a Workload")
    return step_description(step, configuration, optimizer_fn, precision=precision or "fp32",
                            batch_size=batch_size, loss_fn=loss_fn, checkpointing=checkpointing or False)


def estimate(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    precision: str | None = None,
    batch_size: int | None = None,
    loss_fn: Callable | None = None,
    checkpointing=None,
    device: str = "cuda",
    steps: int = 2,
    cublas_workspace_bytes: int | None = None,
    conv_workspaces=None,
) -> Estimate:
    """Peak GPU memory of ``steps`` training steps, predicted on fake tensors.

    Two ways to say what the step is::

        estimate(workload, configuration, batch_size=64)    # the harness's Workload and Configuration
        estimate(model_fn, inputs_fn, optimizer_fn, precision="bf16", batch_size=64, checkpointing=True)

    The second is turned into the first by :func:`step_description`. With a Workload, ``precision``
    and ``checkpointing`` (when given) replace the configuration's.

    Returns :class:`workbench.analysis.estimate.Estimate`: ``peak_allocated_bytes`` (what
    ``torch.cuda.max_memory_allocated()`` would report), ``peak_reserved_bytes``
    (``max_memory_reserved()``), ``by_phase``, ``by_category``, ``by_module`` and a ``timeline``.
    Neither includes the CUDA context (~0.5 GiB on an H200, outside the caching allocator).
    ``device`` must be ``"cuda"``: the allocator modelled is CUDA's. ``conv_workspaces``: cuDNN
    convolution workspaces measured on the GPU (:func:`workbench.capture.cudnn_calibration.calibrate`, or
    ``ConvWorkspaces.load(path)``), used for the calls they hold; ``meta["conv_workspaces"]`` says how many.
    """
    if device not in ("cuda", "cuda:0"):
        raise BadArgument(f"device={device!r}: only the CUDA caching allocator is modelled; use device='cuda'")
    workload, config = _describe(model_fn, inputs_fn, optimizer_fn, precision, batch_size, loss_fn, checkpointing)
    record = trace_workload_memory(
        workload, config, batch_size=batch_size, steps=steps,
        cublas_workspace_bytes=CUBLAS_WORKSPACE_BYTES if cublas_workspace_bytes is None else cublas_workspace_bytes,
        conv_workspaces=conv_workspaces,
    )
    return estimate_from_record(record)


def largest_batch_that_fits(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    budget_bytes: int = 80 * 2**30,
    *,
    low: int = 1,
    high: int = 1 << 16,
    use: str = "reserved",
    progress: bool = False,
    **kwargs,
) -> Headroom:
    """Largest batch size in ``[low, high]`` whose estimated peak fits ``budget_bytes``: doubling from
    ``low``, then bisecting (:func:`~workbench.analysis.experiment.search_largest`, the harness's search).

    ``model_fn, inputs_fn, optimizer_fn`` or ``workload, configuration`` as in :func:`estimate`; other
    keyword arguments go to it. ``use`` is ``"reserved"`` (default, what the process holds) or
    ``"allocated"``. Returns a :class:`~workbench.analysis.experiment.Headroom` (the type
    :func:`~workbench.capture.runner.find_max_batch_size` returns) whose ``estimate`` is the estimate at
    ``batch_size``; it unpacks as ``batch_size, estimate``. When even ``low`` does not fit:
    ``batch_size`` 0 and the estimate at ``low``. Assumes the peak grows with the batch size (checked by
    the tests on the model families of the benchmark).
    """
    if use not in ("reserved", "allocated"):
        raise BadArgument("use must be 'reserved' or 'allocated'")
    if isinstance(model_fn, Workload) and isinstance(optimizer_fn, (int, float)) and budget_bytes == 80 * 2**30:
        optimizer_fn, budget_bytes = None, optimizer_fn  # largest_batch_that_fits(workload, config, budget)
    attr = f"peak_{use}_bytes"
    cache: dict[int, Estimate] = {}
    tries: list[dict] = []

    def fits(bs: int) -> bool:
        if bs not in cache:
            e = estimate(model_fn, inputs_fn, optimizer_fn, batch_size=bs, **kwargs)
            cache[bs] = e
            ok = getattr(e, attr) <= budget_bytes
            tries.append({"batch_size": bs, "fits": ok, "peak_allocated_bytes": int(e.peak_allocated_bytes),
                          "peak_reserved_bytes": int(e.peak_reserved_bytes),
                          "reason": "fits" if ok else f"{use} over budget"})
            if progress:
                import sys

                print(f"estimate: batch {bs}: {getattr(e, attr) / 2**30:.2f} GiB {use}", file=sys.stderr)
        return getattr(cache[bs], attr) <= budget_bytes

    best = search_largest(fits, low, high, below_start=False)
    est = cache[best] if best else cache[low]
    return Headroom(
        batch_size=best,
        peak_allocated_bytes=int(est.peak_allocated_bytes) if best else None,
        peak_reserved_bytes=int(est.peak_reserved_bytes) if best else None,
        limit_bytes=int(budget_bytes),
        limit_source=f"budget ({use}, estimated)",
        tries=pd.DataFrame(tries, columns=HEADROOM_COLUMNS),
        estimate=est,
    )


def compare_configurations(
    model_fn,
    inputs_fn=None,
    optimizer_fn: Callable | None = None,
    budget_bytes: int | None = None,
    *,
    batch_size: int | None = None,
    precisions: Iterable[str] = ("fp32", "bf16"),
    checkpointing: Iterable = (False, True),
    **kwargs,
):
    """Estimate several configurations; a DataFrame (one row each, see
    :func:`workbench.analysis.estimate.estimate_table`), with ``fits`` columns if ``budget_bytes`` is
    given (:func:`workbench.analysis.estimate.fits_table`).

    ``compare_configurations(workload, [config, ...], budget_bytes=...)`` estimates those
    configurations; ``compare_configurations(model_fn, inputs_fn, optimizer_fn, ...)`` every
    ``precisions`` × ``checkpointing`` combination.
    """
    if isinstance(model_fn, Workload):
        configs = list(inputs_fn) if inputs_fn is not None else [Configuration("fp32")]
        if isinstance(optimizer_fn, (int, float)) and budget_bytes is None:
            budget_bytes = optimizer_fn  # compare_configurations(workload, configs, budget)
        ests = [estimate(model_fn, c, batch_size=batch_size, **kwargs) for c in configs]
    else:
        ests = [
            estimate(model_fn, inputs_fn, optimizer_fn, precision=p, batch_size=batch_size, checkpointing=c,
                     **kwargs)
            for p in precisions
            for c in checkpointing
        ]
    return fits_table(ests, budget_bytes) if budget_bytes is not None else estimate_table(ests)


class EstimateFile:
    """The functions a model file for ``workbench estimate FILE.py`` defines."""

    def __init__(self, path: Path, model, batch, optimizer, loss):
        self.path, self.model, self.batch, self.optimizer, self.loss = path, model, batch, optimizer, loss

    def step(self, precision: str = "fp32", batch_size: int | None = None, checkpointing=False
             ) -> tuple[Workload, Configuration]:
        """The file's step as the harness's Workload and Configuration (see :func:`step_description`)."""
        return step_description(self.model, self.batch, self.optimizer, precision=precision,
                                batch_size=batch_size, loss_fn=self.loss, checkpointing=checkpointing)


def load_estimate_file(path) -> EstimateFile:
    """Run a model file and take its ``model()``, ``batch(batch_size)``, ``optimizer(parameters)``
    and optional ``loss(output)``. Raises :class:`BadArtifact` naming the file and what is missing.

    The file is Python and runs with your permissions: only pass files you trust.
    """
    from workbench.io._files import check_input

    p = check_input(path, "a model file", "give the path of a .py file that defines model(), batch(batch_size) "
                    "and optimizer(parameters)")
    try:
        ns = runpy.run_path(str(p), run_name="workbench_estimate_model")
    except SyntaxError as exc:
        raise BadArtifact(p, f"syntax error on line {exc.lineno}: {exc.msg}", "fix the file and run again") from None
    except (Exception, SystemExit) as exc:  # the user's module failed (or exited) at import time
        msg = " ".join(str(exc).split())[:300]
        raise BadArtifact(p, f"running the file raised {type(exc).__name__}: {msg}",
                          "fix the file so that importing it succeeds") from None
    missing = [n for n in ("model", "batch", "optimizer") if not callable(ns.get(n))]
    if missing:
        raise BadArtifact(p, f"does not define {', '.join(f'{m}()' for m in missing)}",
                          "define model() -> nn.Module, batch(batch_size) -> tuple of inputs, "
                          "optimizer(parameters) -> optimizer, and optionally loss(output)")
    loss = ns.get("loss")
    return EstimateFile(p, ns["model"], ns["batch"], ns["optimizer"], loss if callable(loss) else None)
