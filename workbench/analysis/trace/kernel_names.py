"""What a GPU kernel's name says about it: whether it is a GEMM or convolution, and whether it runs on
tensor cores or on plain fp32 FMA units.

:func:`gemm_precision` is shared by the ``fp32_matmul`` finding (:mod:`workbench.analysis.trace.findings`)
and the roofline's tensor-core peak per kernel (:mod:`workbench.analysis.trace.flops`); it sits below both so
that neither imports the other.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

__all__ = ["gemm_precision"]

# --- GEMM / convolution kernels and whether they use tensor cores --------------------------------
# Names seen from cuBLAS/cuBLASLt, CUTLASS, cuDNN and rocBLAS/Tensile: ampere_sgemm_*, volta_sgemm_*,
# cutlass_80_simt_sgemm_*, sm80_xmma_gemm_f32f32_..._ffma_* (SIMT fp32); cutlass_80_tensorop_s1688gemm_*,
# *_tf32f32_*, *h884*/*h1688*/*s884*, nvjet_* (Hopper cuBLASLt), *_bf16*, *wgmma*/*gmma* (tensor cores).
_GEMM_RE = re.compile(
    r"gemm|matmul|cublas|cutlass|xmma|nvjet|scudnn|hcudnn|implicit_?gemm|fprop|dgrad|wgrad|Cijk_", re.I
)
_TENSOR_CORE_RE = re.compile(
    r"tf32|bf16|f16|fp16|half|h884|h1688|h16816|s884|s1688|s16816|i8816|imma|hmma|tensorop|tensor\d|"
    r"wgmma|gmma|nvjet|e4m3|e5m2|fp8|int8|_hgemm|hcudnn|_MI\d+x\d+x\d+_?(?:HB|BB|HH|BS|HS)",
    re.I,
)
_FP32_RE = re.compile(r"sgemm|scudnn|_ffma_|f32f32_f32f32_f32|simt|gcgemm|cgemm", re.I)
# not GEMMs even though they say cutlass/cublas: attention, reductions, epilogues
_NOT_GEMM_RE = re.compile(r"fmha|attention|splitKreduce|epilogue|reduce_kernel|computeOffsets", re.I)


def gemm_precision(names: pd.Series) -> pd.Series:
    """For each kernel name: 'tensor_core' (a GEMM/convolution on tensor cores), 'fp32' (a GEMM/
    convolution on plain fp32 FMA units) or '' (not a GEMM/convolution, or unknown)."""
    s = pd.Series(names, dtype=object).astype(str)
    return pd.Series(np.asarray([_precision(n) for n in s], dtype=str), index=s.index)


@lru_cache(maxsize=1 << 16)
def _precision(name: str) -> str:
    """gemm_precision of one name (kept: the roofline and the fp32 finding ask for the same names)."""
    if not _GEMM_RE.search(name) or _NOT_GEMM_RE.search(name):
        return ""
    if _TENSOR_CORE_RE.search(name):
        return "tensor_core"
    return "fp32" if _FP32_RE.search(name) else ""
