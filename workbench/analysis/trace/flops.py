"""FLOPs and bytes of every op and kernel of a Kineto trace recorded with shapes (``record_shapes=True``).

A trace recorded with shapes carries, for every op, its ``Input Dims``, ``Input type`` and (torch >= 2.1)
``Concrete Inputs`` (scalar arguments as text: ``is_causal``, stride, padding, dtype codes). From them:

==============  =========================================================================================
kind            ops and formula
==============  =========================================================================================
``gemm``        mm, addmm, bmm, baddbmm, matmul, linear, _scaled_mm, addmv/mv: ``2·batch·M·N·K``; bytes:
                both operands and the result once
``conv``        convolution (every aten/cudnn/miopen/mkldnn entry point): ``2·N·prod(out spatial)·numel(W)``
                (transposed: input spatial); ``convolution_backward``: that once for each of grad-input and
                grad-weight asked for in ``output_mask``
``attention``   scaled_dot_product_attention and its flash / efficient / cudnn variants (their ``_forward``
                kernels' ops too): ``2·B·H·Sq·Sk·(D + Dv)``, the masked-out share removed when ``is_causal``
                (read from Concrete Inputs; half for Sq = Sk); the backward ops count twice the forward
                (the model-FLOP convention: the kernels' recomputation of the scores is not counted)
``norm``        layer / rms / batch / group norm forward (``5·numel``, bytes 2x the input) and backward
                (``8·numel``, 3x)
``softmax``     (log_)softmax and backward: ``5·numel``, 2x / 3x the input bytes
``reduction``   sum, mean, amax, norm, nll_loss...: ``numel`` FLOPs, the input bytes
``copy``        copy_, to, clone, cat, index_select, gather, embedding...: no FLOPs, read + write bytes
``elementwise`` any other aten op with tensor inputs: ``numel(out)`` FLOPs, inputs + output bytes
==============  =========================================================================================

Only ``gemm``, ``conv`` and ``attention`` are *model FLOPs* (what MFU counts: ``6·N·tokens`` plus
attention); the rest have FLOPs for their arithmetic intensity, not for MFU.

Kernels get the FLOPs/bytes of the op that launched them, through the linking of
:func:`workbench.analysis.trace.tables.gpu_launch_owners` (kernel → runtime call by correlation id → the op
around it); when that op has no formula the nearest enclosing op that has one is used, and several kernels
of one op call share its FLOPs/bytes in proportion to their durations. :func:`trace_costs` says what share
of kernel time got a cost, and when the trace has no shapes it says so and how to record them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd

from workbench.analysis.trace import tables as ta
from workbench.analysis.trace.kernel_names import gemm_precision

__all__ = ["TraceCosts", "trace_costs", "op_cost", "MODEL_KINDS", "NO_SHAPES_NOTE", "DTYPE_BYTES"]

MODEL_KINDS = ("gemm", "conv", "attention")
NO_SHAPES_NOTE = (
    "this trace has no input shapes (recorded without record_shapes), so FLOPs, bytes and MFU cannot be "
    "computed; record with profile_steps(step, detail='standard') or torch.profiler.profile(record_shapes=True)"
)

# torch's C++ type names in "Input type" -> (dtype, bytes per element)
DTYPE_BYTES = {
    "float": ("fp32", 4), "double": ("fp64", 8), "c10::Half": ("fp16", 2), "c10::BFloat16": ("bf16", 2),
    "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "c10::Float8_e4m3fnuz": ("fp8", 1),
    "c10::Float8_e5m2fnuz": ("fp8", 1), "signed char": ("int8", 1), "unsigned char": ("uint8", 1),
    "bool": ("bool", 1), "short int": ("int16", 2), "int": ("int32", 4), "long int": ("int64", 8),
    "c10::complex<float>": ("complex64", 8), "c10::complex<double>": ("complex128", 16),
    "c10::complex<c10::Half>": ("complex32", 4),
}
# c10::ScalarType codes as Concrete Inputs write them (aten::to / _to_copy dtype argument)
_SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 15: 2,
                      23: 1, 24: 1}


@dataclass(frozen=True)
class OpCost:
    kind: str
    flops: float
    bytes: float
    dtype: str
    causal: bool | None = None


# ----------------------------------------------------------------------------------- argument parsing


class _Args:
    """One op call's arguments: dims, types and concrete values by position."""

    def __init__(self, dims, types, concrete):
        self.dims = dims if isinstance(dims, list) else []
        self.types = types if isinstance(types, list) else []
        self.concrete = concrete if isinstance(concrete, list) else []

    def tensor(self, i: int):
        """(shape, dtype, bytes per element) of argument ``i`` if it is a tensor, else None."""
        if i >= len(self.dims) or i >= len(self.types):
            return None
        d, t = self.dims[i], self.types[i]
        if not isinstance(d, list) or t not in DTYPE_BYTES or any(not isinstance(x, int) for x in d):
            return None
        name, size = DTYPE_BYTES[t]
        return d, name, size

    def tensors(self):
        out = []
        for i in range(len(self.dims)):
            t = self.tensor(i)
            if t is not None:
                out.append(t)
            elif i < len(self.types) and self.types[i] == "TensorList" and isinstance(self.dims[i], list):
                out.extend((d, "", 0) for d in self.dims[i] if isinstance(d, list))
        return out

    def value(self, i: int):
        """The concrete value of argument ``i`` parsed (bool, int, float, list) or None."""
        if i >= len(self.concrete):
            return None
        s = self.concrete[i]
        if not isinstance(s, str) or s == "":
            return None
        if s in ("True", "False"):
            return s == "True"
        try:
            return json.loads(s.replace("True", "true").replace("False", "false"))
        except ValueError:
            try:
                return float(s)
            except ValueError:
                return s


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.float64)) if shape else 1


def _bcast(shapes: list[list[int]]) -> list[int]:
    """numpy broadcasting of the shapes; the largest shape when they do not broadcast."""
    try:
        return list(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        return max(shapes, key=_numel)


# ------------------------------------------------------------------------------------------- formulas


def _gemm_general(a, b, out_extra: int = 0) -> OpCost | None:
    if a is None or b is None:
        return None
    (sa, dt, s1), (sb, _, s2) = a, b
    if not sa or not sb:
        return None
    m, k = (1, sa[0]) if len(sa) == 1 else (sa[-2], sa[-1])
    n = 1 if len(sb) == 1 else sb[-1]
    batch = _numel(_bcast([sa[:-2] or [1], sb[:-2] or [1]])) if (len(sa) > 2 or len(sb) > 2) else 1
    flops = 2.0 * batch * m * n * k
    nbytes = _numel(sa) * s1 + _numel(sb) * s2 + batch * m * n * s1 + out_extra
    return OpCost("gemm", flops, float(nbytes), dt)


def _mm(ai: int, bi: int, bias: int | None = None):
    def f(a: _Args):
        extra = 0
        if bias is not None and (t := a.tensor(bias)) is not None:
            extra = _numel(t[0]) * t[2]
        return _gemm_general(a.tensor(ai), a.tensor(bi), extra)
    return f


def _linear(a: _Args):
    x, w = a.tensor(0), a.tensor(1)
    if x is None or w is None or not x[0] or len(w[0]) != 2:
        return None
    m, k, n = _numel(x[0][:-1]), x[0][-1], w[0][0]
    bias = a.tensor(2)
    nbytes = (_numel(x[0]) + _numel(w[0]) + m * n) * x[2] + (_numel(bias[0]) * bias[2] if bias else 0)
    return OpCost("gemm", 2.0 * m * n * k, float(nbytes), x[1])


def _ints(v, n: int, default: int) -> list[int]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [int(v)] * n
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
        v = [int(x) for x in v]
        return (v * n)[:n] if len(v) == 1 else v[:n] + [default] * (n - len(v))
    return [default] * n


def _conv(stride_i, pad_i, dil_i, transposed_i=None, always_transposed=False):
    def f(a: _Args):
        x, w = a.tensor(0), a.tensor(1)
        if x is None or w is None or len(x[0]) < 3 or len(w[0]) != len(x[0]):
            return None
        spatial = x[0][2:]
        nd = len(spatial)
        ks = w[0][2:]
        transposed = always_transposed or (transposed_i is not None and a.value(transposed_i) is True)
        stride = _ints(a.value(stride_i), nd, 1)
        dil = _ints(a.value(dil_i), nd, 1)
        padv = a.value(pad_i)
        if transposed:
            flops = 2.0 * x[0][0] * _numel(spatial) * _numel(w[0])
            out = [(i - 1) * s + d * (k - 1) + 1 for i, s, d, k in zip(spatial, stride, dil, ks)]
            cout = w[0][1] * max(1, x[0][1] // max(w[0][0], 1))
        else:
            if padv == "same":
                out = list(spatial)
            else:
                pad = _ints(padv, nd, 0)
                out = [max(0, (i + 2 * p - d * (k - 1) - 1) // s + 1)
                       for i, p, d, k, s in zip(spatial, pad, dil, ks, stride)]
            flops = 2.0 * x[0][0] * _numel(out) * _numel(w[0])
            cout = w[0][0]
        nbytes = (_numel(x[0]) + _numel(w[0]) + x[0][0] * cout * _numel(out)) * x[2]
        return OpCost("conv", flops, float(nbytes), x[1])
    return f


def _conv_backward(a: _Args):
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    #                      output_padding, groups, output_mask)
    go, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if go is None or x is None or w is None or len(x[0]) < 3:
        return None
    transposed = a.value(7) is True
    fwd = 2.0 * x[0][0] * _numel((x[0] if transposed else go[0])[2:]) * _numel(w[0])
    mask = a.value(10)
    mask = mask if isinstance(mask, list) and len(mask) >= 2 else [True, True, True]
    n = int(bool(mask[0])) + int(bool(mask[1]))
    nbytes = (2 * _numel(go[0]) + 2 * _numel(x[0]) + 2 * _numel(w[0])) * x[2]
    return OpCost("conv", fwd * n, float(nbytes), x[1])


def _causal_fraction(sq: int, sk: int) -> float:
    """Share of the Sq x Sk score matrix a causal (upper-left aligned) mask keeps; 1/2 when Sq = Sk."""
    if sq <= 0 or sk <= 0:
        return 1.0
    if sq == sk:
        return 0.5
    if sq <= sk:
        kept = sq * (sq + 1) / 2
    else:
        kept = sk * (sk + 1) / 2 + (sq - sk) * sk
    return min(1.0, kept / (sq * sk))


def _attention(q_i: int, layout: str, causal_i: int | None, backward: bool, mask_type: bool = False):
    def f(a: _Args):
        q, k, v = a.tensor(q_i), a.tensor(q_i + 1), a.tensor(q_i + 2)
        if q is None or k is None or v is None or len(q[0]) < 2:
            return None
        if layout == "BSHD":
            if len(q[0]) != 4:
                return None
            b, sq, h, d = q[0]
            sk, dv = k[0][1], v[0][-1]
            bh = b * h
        else:
            bh, sq, d = _numel(q[0][:-2]), q[0][-2], q[0][-1]
            sk, dv = k[0][-2], v[0][-1]
        causal = None
        if causal_i is not None:
            val = a.value(causal_i)
            if mask_type:
                causal = bool(val) if isinstance(val, (int, float)) and not isinstance(val, bool) else None
            elif isinstance(val, bool):
                causal = val
        frac = _causal_fraction(sq, sk) if causal else 1.0
        fwd = 2.0 * bh * sq * sk * (d + dv) * frac
        tensors = [t for t in a.tensors() if t[2]]
        in_bytes = sum(_numel(t[0]) * t[2] for t in tensors)
        out_bytes = (_numel(q[0]) + _numel(k[0]) + _numel(v[0])) * q[2] if backward else bh * sq * dv * q[2]
        return OpCost("attention", fwd * (2.0 if backward else 1.0), float(in_bytes + out_bytes), q[1], causal)
    return f


def _scaled(kind: str, flops_per: float, bytes_x: float, idx: int = 0):
    def f(a: _Args):
        x = a.tensor(idx)
        if x is None:
            return None
        n = _numel(x[0])
        wbytes = sum(_numel(t[0]) * t[2] for i, t in enumerate(a.tensors()) if i > idx and t[2] and _numel(t[0]) < n)
        return OpCost(kind, flops_per * n, float(bytes_x * n * x[2] + wbytes), x[1])
    return f


_COPY_OPS = {
    "aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack", "aten::index", "aten::index_put_", "aten::_index_put_impl_",
    "aten::scatter", "aten::scatter_", "aten::scatter_add_", "aten::repeat", "aten::fill_", "aten::zero_",
    "aten::_unsafe_index", "aten::constant_pad_nd", "aten::flip", "aten::roll", "aten::narrow_copy",
    "aten::slice_backward", "aten::select_backward", "aten::_copy_from",
    "aten::masked_fill_", "aten::masked_fill", "aten::where", "aten::tril", "aten::triu", "aten::ones_like",
    "aten::zeros_like", "aten::full_like",
}
_REDUCTIONS = {
    "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::norm",
    "aten::linalg_vector_norm", "aten::var", "aten::std", "aten::var_mean", "aten::std_mean", "aten::argmax",
    "aten::argmin", "aten::prod", "aten::any", "aten::all", "aten::logsumexp", "aten::nll_loss_forward",
    "aten::nll_loss2d_forward", "aten::_foreach_norm", "aten::count_nonzero",
}


def _indexed(src_i: int, index_i: int, kind: str, per_index: str = "element"):
    """Ops that touch only the indexed part of a tensor (gather, nll_loss, embedding): bytes from the
    index count, not the source's size. ``per_index``: one element, or one row of the source."""
    def f(a: _Args):
        x, idx = a.tensor(src_i), a.tensor(index_i)
        if x is None or idx is None:
            return None
        n = _numel(idx[0])
        row = _numel(x[0][1:]) if (per_index == "row" and len(x[0]) > 1) else 1
        moved = n * row
        # an element-wise index is often a broadcast view (expand): its bytes are not counted
        index_bytes = n * idx[2] if per_index == "row" else 0
        return OpCost(kind, float(moved if kind != "copy" else 0), float(index_bytes + 2 * moved * x[2]), x[1])
    return f


def _to_copy(a: _Args):
    x = a.tensor(0)
    if x is None:
        return None
    code = a.value(1)
    out = _SCALAR_TYPE_BYTES.get(int(code), x[2]) if isinstance(code, (int, float)) else x[2]
    return OpCost("copy", 0.0, float(_numel(x[0]) * (x[2] + out)), x[1])


def _generic(name: str, a: _Args) -> OpCost | None:
    tensors = [t for t in a.tensors() if t[2] or t[0]]
    if not tensors:
        return None
    first = next((t for t in tensors if t[2]), None)
    if first is None:  # a TensorList only (torch writes no dtypes for its members)
        return None
    size = first[2]
    in_bytes = sum(_numel(t[0]) * (t[2] or size) for t in tensors)
    if name in _REDUCTIONS:
        return OpCost("reduction", float(_numel(first[0])), float(in_bytes), first[1])
    if name in _COPY_OPS or name.endswith("_copy"):
        if name in ("aten::copy_",) and len(tensors) >= 2:
            return OpCost("copy", 0.0, float(_numel(tensors[0][0]) * tensors[0][2] + _numel(tensors[1][0]) * tensors[1][2]),
                          tensors[1][1] or first[1])
        if name in ("aten::fill_", "aten::zero_"):
            return OpCost("copy", 0.0, float(_numel(first[0]) * size), first[1])
        out = in_bytes if name in ("aten::cat", "aten::stack", "aten::clone", "aten::contiguous") else _numel(first[0]) * size
        return OpCost("copy", 0.0, float(in_bytes + out), first[1])
    out = _bcast([t[0] for t in tensors])
    out_bytes = 0 if name.endswith("_") else _numel(out) * size  # in-place: the output is the first input
    return OpCost("elementwise", float(_numel(out)), float(in_bytes + out_bytes), first[1])


# name -> formula(args) ; the innermost op with a formula gets the kernels it launched
_FORMULAS = {
    "aten::mm": _mm(0, 1), "aten::bmm": _mm(0, 1), "aten::matmul": _mm(0, 1), "aten::_int_mm": _mm(0, 1),
    "aten::addmm": _mm(1, 2, 0), "aten::_addmm_activation": _mm(1, 2, 0), "aten::baddbmm": _mm(1, 2, 0),
    "aten::addbmm": _mm(1, 2, 0), "aten::_scaled_mm": _mm(0, 1), "aten::mv": _mm(0, 1),
    "aten::addmv": _mm(1, 2, 0), "aten::linear": _linear,
    "aten::convolution": _conv(3, 4, 5, 6), "aten::_convolution": _conv(3, 4, 5, 6),
    "aten::conv1d": _conv(3, 4, 5), "aten::conv2d": _conv(3, 4, 5), "aten::conv3d": _conv(3, 4, 5),
    "aten::cudnn_convolution": _conv(3, 2, 4), "aten::cudnn_convolution_transpose": _conv(4, 2, 5, always_transposed=True),
    "aten::miopen_convolution": _conv(4, 3, 5), "aten::mkldnn_convolution": _conv(4, 3, 5),
    "aten::_slow_conv2d_forward": _conv(4, 5, 99), "aten::convolution_backward": _conv_backward,
    # attention: (index of q, layout, index of is_causal, backward)
    "aten::scaled_dot_product_attention": _attention(0, "BHSD", 5, False),
    "aten::_scaled_dot_product_attention_math": _attention(0, "BHSD", 4, False),
    "aten::_scaled_dot_product_flash_attention": _attention(0, "BHSD", 4, False),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _attention(0, "BHSD", 4, False),
    "aten::_flash_attention_forward": _attention(0, "BSHD", 8, False),
    "aten::_scaled_dot_product_efficient_attention": _attention(0, "BHSD", 6, False),
    "aten::_efficient_attention_forward": _attention(0, "BSHD", 9, False, mask_type=True),
    "aten::_scaled_dot_product_cudnn_attention": _attention(0, "BHSD", 6, False),
    "aten::_cudnn_attention_forward": _attention(0, "BHSD", 10, False),
    "aten::_scaled_dot_product_fused_attention_overrideable": _attention(0, "BHSD", 5, False),
    "aten::_scaled_dot_product_flash_attention_backward": _attention(1, "BHSD", 11, True),
    "aten::_flash_attention_backward": _attention(1, "BSHD", 11, True),
    "aten::_scaled_dot_product_efficient_attention_backward": _attention(1, "BHSD", 11, True),
    "aten::_efficient_attention_backward": _attention(1, "BSHD", 14, True, mask_type=True),
    "aten::_scaled_dot_product_cudnn_attention_backward": _attention(1, "BHSD", 14, True),
    "aten::_cudnn_attention_backward": _attention(1, "BHSD", 14, True),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _attention(1, "BHSD", 7, True),
    # norms, softmax
    "aten::native_layer_norm": _scaled("norm", 5, 2), "aten::layer_norm": _scaled("norm", 5, 2),
    "aten::native_layer_norm_backward": _scaled("norm", 8, 3), "aten::_fused_rms_norm": _scaled("norm", 4, 2),
    "aten::rms_norm": _scaled("norm", 4, 2), "aten::_fused_rms_norm_backward": _scaled("norm", 6, 3),
    "aten::native_batch_norm": _scaled("norm", 5, 2), "aten::cudnn_batch_norm": _scaled("norm", 5, 2),
    "aten::_batch_norm_with_update": _scaled("norm", 5, 2), "aten::miopen_batch_norm": _scaled("norm", 5, 2),
    "aten::native_batch_norm_backward": _scaled("norm", 8, 3), "aten::cudnn_batch_norm_backward": _scaled("norm", 8, 3),
    "aten::miopen_batch_norm_backward": _scaled("norm", 8, 3), "aten::native_group_norm": _scaled("norm", 5, 2),
    "aten::native_group_norm_backward": _scaled("norm", 8, 3),
    "aten::_softmax": _scaled("softmax", 5, 2), "aten::_log_softmax": _scaled("softmax", 5, 2),
    "aten::_softmax_backward_data": _scaled("softmax", 5, 3), "aten::_log_softmax_backward_data": _scaled("softmax", 5, 3),
    "aten::_to_copy": _to_copy, "aten::to": _to_copy,
    # indexed access: bytes follow the index, not the indexed tensor
    "aten::gather": _indexed(0, 2, "copy"), "aten::nll_loss_forward": _indexed(0, 1, "reduction"),
    "aten::nll_loss2d_forward": _indexed(0, 1, "reduction"), "aten::nll_loss_backward": _indexed(1, 2, "elementwise"),
    "aten::nll_loss2d_backward": _indexed(1, 2, "elementwise"), "aten::embedding": _indexed(0, 1, "copy", "row"),
    "aten::index_select": _indexed(0, 2, "copy", "row"), "aten::embedding_dense_backward": _scaled("copy", 0, 2),
}


@lru_cache(maxsize=65536)
def op_cost(name: str, dims: str | None, types: str | None, concrete: str | None) -> OpCost | None:
    """The cost of one op call from its name and the JSON text of its Input Dims / Input type /
    Concrete Inputs (None when the op has no formula or its arguments cannot be read).

    >>> op_cost("aten::mm", "[[8192,1024],[1024,4096]]", '["c10::BFloat16","c10::BFloat16"]', None).flops
    68719476736.0
    """
    def load(s):
        if not isinstance(s, str) or not s:
            return None
        try:
            return json.loads(s)
        except ValueError:
            return None

    a = _Args(load(dims), load(types), load(concrete))
    if not a.dims:
        return None
    f = _FORMULAS.get(name)
    try:
        if f is not None:
            return f(a)
        if name.startswith("aten::"):
            return _generic(name, a)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return None


# ------------------------------------------------------------------------------------ kernels <- ops


@dataclass
class TraceCosts:
    """Per-GPU-activity and per-op-call costs of a trace.

    ``gpu``: one row per kernel/memcpy/memset: ``name, cat, ts_us, dur_us, stream`` as in the trace,
    ``matched`` (its launch is in the trace), ``op`` (name of the op whose cost it got),
    ``op_row`` (that op call's row in the host tree, -1), ``kind``, ``dtype`` (the op's input dtype; ``tf32``
    for an fp32 GEMM whose kernel runs on tensor cores), ``flops``, ``bytes`` (its share of the op's),
    ``model`` (counts toward model FLOPs), ``ev_row`` (position in ``trace.events``). ``name``, ``cat``
    and ``op`` are categorical (``op`` NaN where no op gave a cost).
    ``ops``: one row per op call that got kernels: ``op_row, name, kind, dtype, flops, bytes, gpu_us,
    in_step, causal``.
    """

    gpu: pd.DataFrame
    ops: pd.DataFrame
    has_shapes: bool
    n_steps: int
    notes: list = field(default_factory=list)

    @property
    def kernels(self) -> pd.DataFrame:
        return self.gpu[self.gpu["cat"] == "kernel"]

    def model_flops_per_step(self) -> float:
        o = self.ops
        sel = o["in_step"] & o["kind"].isin(MODEL_KINDS)
        return float(o.loc[sel, "flops"].sum()) / max(self.n_steps, 1)

    def flops_per_step(self) -> float:
        o = self.ops
        return float(o.loc[o["in_step"], "flops"].sum()) / max(self.n_steps, 1)

    def coverage(self) -> dict:
        """Shares of kernel time: with FLOPs, with a cost (FLOPs or bytes), whose launch is in the trace."""
        k = self.kernels
        total = float(k["dur_us"].sum())
        matched = k[k["matched"]]
        m_total = float(matched["dur_us"].sum())

        def share(mask):
            return float(matched.loc[mask, "dur_us"].sum()) / m_total if m_total > 0 else 0.0

        return {
            "kernel_us": total,
            "matched_fraction": m_total / total if total > 0 else 0.0,
            "flops_fraction": share(matched["flops"] > 0),
            "costed_fraction": share((matched["flops"] > 0) | (matched["bytes"] > 0)),
            "model_fraction": share(matched["model"]),
        }

    def dominant_dtype(self) -> str | None:
        """The dtype that carries most model FLOPs (kernel level: tf32 when fp32 GEMMs run on tensor cores)."""
        k = self.gpu[self.gpu["model"] & (self.gpu["flops"] > 0)]
        if k.empty:
            return None
        return str(k.groupby("dtype")["flops"].sum().idxmax())


def _codes(host: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Integer codes of a column and the text of each code (categorical columns: no string work per row)."""
    if col not in host.columns:
        return np.full(len(host), -1, np.int32), None
    c = host[col]
    if isinstance(c.dtype, pd.CategoricalDtype):
        return c.cat.codes.to_numpy(), np.asarray(c.cat.categories.astype(str), dtype=object)
    codes, uniques = pd.factorize(c)
    return codes, np.asarray(pd.Index(uniques).astype(str), dtype=object)


def _distinct_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an (n, k) array of codes (>= -1) and each row's index into them: one hashed
    int64 key per row when the codes fit in one (no sort of the rows), else ``np.unique(axis=0)``."""
    c = codes.astype(np.int64) + 1
    span = c.max(axis=0) + 1
    if math.prod(int(x) for x in span) < 2**62:
        key = c[:, 0].copy()
        for j in range(1, c.shape[1]):
            key = key * int(span[j]) + c[:, j]
        inverse, keys = pd.factorize(key)
        _, first = np.unique(inverse, return_index=True)  # the first row of each key
        return codes[first], inverse
    uniq, inverse = np.unique(codes, axis=0, return_inverse=True)
    return uniq, inverse.reshape(-1)


def trace_costs(trace) -> TraceCosts:
    """FLOPs and bytes of every op call with GPU work and of every kernel (see the module docstring)."""
    ev = ta._events(trace)
    host, parent, _ = ta._host_tree(ev)
    gpu, launch, owner = ta.gpu_launch_owners(ev, host, parent)
    n = len(host)
    is_op = host["cat"].isin(ta.HOST_OPS).to_numpy() if n else np.zeros(0, bool)
    has_shapes = bool("input_dims" in host.columns and host.loc[is_op, "input_dims"].notna().any()) if n else False
    notes = []
    if not has_shapes:
        notes.append(NO_SHAPES_NOTE)

    # cost per host op call, computed once per distinct (name, dims, types, concrete)
    cost_flops = np.zeros(n)
    cost_bytes = np.zeros(n)
    cost_kind = np.full(n, "", dtype=object)
    cost_dtype = np.full(n, "", dtype=object)
    cost_causal = np.full(n, None, dtype=object)
    has_cost = np.zeros(n, bool)
    if has_shapes:
        cols = ("name", "input_dims", "input_types", "concrete_inputs")
        coded = [_codes(host, c) for c in cols]
        codes = np.stack([c for c, _ in coded], axis=1)
        texts = [t for _, t in coded]
        rows = np.flatnonzero(is_op & (codes[:, 1] >= 0))
        if rows.size:
            uniq, inverse = _distinct_rows(codes[rows])

            def text(j, code):
                return None if code < 0 or texts[j] is None else texts[j][code]

            results = [op_cost(*(text(j, int(uniq[u, j])) for j in range(len(cols)))) for u in range(len(uniq))]
            u_has = np.array([r is not None for r in results], bool)
            u_flops = np.array([r.flops if r else 0.0 for r in results], float)
            u_bytes = np.array([r.bytes if r else 0.0 for r in results], float)
            u_kind = np.array([r.kind if r else "" for r in results], dtype=object)
            u_dtype = np.array([r.dtype if r else "" for r in results], dtype=object)
            u_causal = np.array([r.causal if r else None for r in results], dtype=object)
            has_cost[rows] = u_has[inverse]
            cost_flops[rows], cost_bytes[rows] = u_flops[inverse], u_bytes[inverse]
            cost_kind[rows], cost_dtype[rows], cost_causal[rows] = u_kind[inverse], u_dtype[inverse], u_causal[inverse]

    # each GPU activity -> the nearest op (its launcher or an enclosing one) that has a cost
    acc = owner.copy()
    for _ in range(64):
        walk = (acc >= 0) & ~has_cost[np.maximum(acc, 0)] if n else np.zeros(acc.size, bool)
        if not walk.any():
            break
        acc[walk] = parent[acc[walk]]
    if n:
        acc[(acc >= 0) & ~has_cost[np.maximum(acc, 0)]] = -1

    g_dur = np.nan_to_num(gpu["dur_us"].to_numpy(np.float64))
    ok = acc >= 0
    op_gpu_us = np.bincount(acc[ok], weights=g_dur[ok], minlength=n) if n else np.zeros(0)
    op_gpu_n = np.bincount(acc[ok], minlength=n) if n else np.zeros(0)
    share = np.zeros(len(gpu))
    if ok.any():
        tot, cnt = op_gpu_us[acc[ok]], op_gpu_n[acc[ok]]
        share[ok] = np.where(tot > 0, g_dur[ok] / np.where(tot > 0, tot, 1.0), 1.0 / cnt)
    a0 = np.maximum(acc, 0)
    kind = np.where(ok, cost_kind[a0] if n else "", "")
    dtype = np.where(ok, cost_dtype[a0] if n else "", "")
    # fp32 GEMM/conv kernels on tensor cores run TF32 (the name test runs once per distinct name)
    tc = ta._by_name(gpu["name"], lambda s: gemm_precision(s).to_numpy(), "") == "tensor_core"
    dtype = np.where((dtype == "fp32") & np.isin(kind, ("gemm", "conv")) & tc, "tf32", dtype)
    host_codes, host_texts = _codes(host, "name")
    op_codes = np.where(ok, host_codes[a0] if n else -1, -1)
    op_cat = pd.Categorical.from_codes(op_codes, categories=host_texts if host_texts is not None else [])
    host_names = host_texts[host_codes] if (n and host_texts is not None) else np.zeros(0, object)
    g = pd.DataFrame({
        "name": gpu["name"].array if isinstance(gpu["name"].dtype, pd.CategoricalDtype) else gpu["name"].astype(str).to_numpy(),
        "cat": gpu["cat"].array if isinstance(gpu["cat"].dtype, pd.CategoricalDtype) else gpu["cat"].astype(str).to_numpy(),
        "ts_us": gpu["ts_us"].to_numpy(np.float64),
        "dur_us": g_dur,
        "matched": launch >= 0,
        "op": op_cat,
        "op_row": acc,
        "kind": kind,
        "dtype": dtype,
        "flops": np.where(ok, (cost_flops[a0] if n else 0.0) * share, 0.0),
        "bytes": np.where(ok, (cost_bytes[a0] if n else 0.0) * share, 0.0),
        "model": ok & np.isin(kind, MODEL_KINDS),
        "ev_row": np.flatnonzero(ev["cat"].isin(ta.GPU_ACTIVITY).to_numpy()),
    })

    # op calls with GPU work; the dtype of an op is its kernels' (tf32 upgrades the op too)
    used = np.flatnonzero(op_gpu_n > 0) if n else np.zeros(0, np.int64)
    steps = ta._steps(ev)
    ts = host["ts_us"].to_numpy(np.float64) if n else np.zeros(0)
    if len(steps):
        s0, s1 = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
        pos = np.searchsorted(s0, ts[used], "right") - 1
        in_step = (pos >= 0) & (ts[used] < s1[np.maximum(pos, 0)])
    else:
        in_step = np.ones(used.size, bool)
    op_dtype = cost_dtype[used].copy()
    if used.size and (g["dtype"] == "tf32").any():
        tf = set(g.loc[g["dtype"] == "tf32", "op_row"].to_numpy().tolist())
        op_dtype = np.array(["tf32" if r in tf else d for r, d in zip(used, op_dtype)], dtype=object)
    ops = pd.DataFrame({
        "op_row": used, "name": host_names[used], "kind": cost_kind[used], "dtype": op_dtype,
        "flops": cost_flops[used], "bytes": cost_bytes[used], "gpu_us": op_gpu_us[used] if n else [],
        "in_step": in_step, "causal": cost_causal[used],
    })
    attn = ops[ops["kind"] == "attention"]
    if len(attn) and attn["causal"].isna().any():
        notes.append(f"{int(attn['causal'].isna().sum())} attention call(s) without a readable is_causal "
                     "(no Concrete Inputs): counted as not causal")
    return TraceCosts(g, ops, has_shapes, max(len(steps), 1), notes)
