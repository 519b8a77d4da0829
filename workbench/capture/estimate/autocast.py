"""CUDA's autocast policy on the CPU device, for the fake step (see the package docstring).

While a step is traced, the ``AutocastCPU`` kernels are replaced by Python kernels that follow CUDA's
lists (aten/src/ATen/autocast_mode.h: which ops run in bf16/fp16, which in fp32, which promote; the
cache of weight casts), route ``dropout`` to CUDA's ``native_dropout`` (1-byte mask) and
``scaled_dot_product_attention`` to the flash or memory-efficient kernel CUDA picks. Removed afterwards.

:data:`DTYPE_NAMES` names element types as the estimate and its convolution table do.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch.utils._pytree import tree_leaves

__all__ = ["DTYPE_NAMES", "AUTOCAST_DTYPES"]

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
# the autocast dtype of each precision that runs under autocast
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# element types by the names the estimate and its convolution table use (cudnn_model.conv_call_key)

DTYPE_NAMES = {torch.float32: "fp32", **{v: k for k, v in AUTOCAST_DTYPES.items()}}


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
