"""What cuDNN takes from the caching allocator that fake tensors do not see: convolution workspaces
and the RNN reserve space and workspaces (plain arithmetic on shapes; no torch).

Fake tensors see every tensor an ATen op returns, but not the scratch memory a cuDNN call allocates
through torch's caching allocator for the call's duration (the convolution *workspace*, the RNN
*workspace*), nor what cuDNN's fused RNN keeps for its backward (the *reserve space*: gates and cell
states of every time step, returned by ``_cudnn_rnn`` as a uint8 tensor; torch's meta kernel returns
it with size 0). The estimator (:mod:`workbench.capture.estimate`) asks these functions for the bytes
and adds them as events: a workspace is allocated after the op's outputs and freed when it returns;
the reserve space lives as long as the autograd graph.

The rules and their constants come from what cuDNN asked for on an H200 (torch 2.11, cuDNN 9.19,
``torch.backends.cudnn.benchmark=False``): the families' per-op rows (tests/data/h200_memory/families.json)
and the per-call convolution sweep of benchmarks/record_cudnn_fp32_h200.py (cudnn_conv_sweep.json: 220
shapes x fp32 / TF32 / bf16 x forward / backward-data / backward-weight, every third shape held out); the
fit and its held-out check: benchmarks/fit_cudnn_fp32_h200.py, benchmarks/RESULTS.md ("Accuracy v4").
"""

from __future__ import annotations

import json
import math
from pathlib import Path

__all__ = [
    "CONV_BOUND_SOURCE",
    "ConvWorkspaces",
    "as_cudnn_shape",
    "conv_call_key",
    "conv_workspace_bytes",
    "conv_workspace_upper_bytes",
    "lstm_reserve_bytes",
    "lstm_workspace_bytes",
    "RNN_GATES",
]

# gates per cell: LSTM 4, GRU 3, vanilla RNN 1
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


# Tensor-core convolutions (16-bit, and fp32 with TF32) run NHWC kernels: cuDNN copies the NCHW input, output
# and weight into that layout in its workspace (see conv_workspace_bytes for the exceptions). fp32 without
# TF32 runs NCHW kernels: the heuristics' first choice takes no workspace for most shapes and cuDNN's FFT
# (1 MiB to 9 GiB in the sweep) for some, with no rule on shapes for which (the same layer flips with the batch): not
# predicted (0), bounded by conv_workspace_upper_bytes.
_TENSOR_CORE_ALIGN = 8
CONV_BOUND_SOURCE = ("fp32 cuDNN convolutions: FFT / non-fused Winograd workspace, the largest cuDNN took "
                     "on the H200 (tests/data/h200_memory/families.json)")
# LSTM reserve space: 5.5 elements per (time step, sample, hidden unit, layer, direction) plus 256 B,
# exact for the four recorded configurations (fp32 and 16-bit, batch 16 and 64, T=256, H=1024, 2 layers).
RESERVE_ELEMS_PER_STATE = 5.5
RESERVE_EXTRA_BYTES = 256
# LSTM workspace (forward and backward alike: RNN.cpp asks cudnnGetRNNTempSpaceSizes in training mode for
# both): 2.79 elements per (step, sample, unit, layer, direction), plus 1.03 x the weight buffer's bytes,
# plus 15.1 MiB. The recorded transients hold the workspace and the time-major copies of a batch-first
# input (forward; backward-weight) and of the incoming gradient (backward-input), which the estimator
# allocates itself; without them the four recorded calls (fp32 and 16-bit, batch 16 and 64) agree within
# 0.1% forward and backward.
WORKSPACE_ELEMS_PER_STATE = 2.791
WORKSPACE_WEIGHT_BYTES_FACTOR = 1.027
WORKSPACE_EXTRA_BYTES = int(15.13 * 2**20)


def conv_workspace_upper_bytes(direction: str, x_shape, w_shape, y_shape, dtype_bytes: int, *,
                               transposed: bool = False, groups: int = 1, math: str = "fp32") -> int:
    """The most workspace one cuDNN convolution call may take where :func:`conv_workspace_bytes` cannot
    predict it (fp32: which algorithm cuDNN's heuristics pick is not a rule on shapes); the point estimate
    elsewhere. The bound: the larger of the FFT and the non-fused Winograd workspace of the convolution
    (for a transposed one, of the convolution it is the gradient of), which covers all 280 fp32 calls of
    the families recorded on the H200 (tests/test_cudnn_model.py). On the sweep it covers 656 of 660 fp32 calls
    and all 660 TF32 calls (TF32 gets it too: its heuristics may pick a non-tensor-core algorithm)."""
    point = conv_workspace_bytes(direction, x_shape, w_shape, y_shape, dtype_bytes, transposed=transposed,
                                 groups=groups, math=math)
    if dtype_bytes != 4 or groups != 1:
        return point
    x, w, y = (as_cudnn_shape(s) for s in (x_shape, w_shape, y_shape))
    if transposed:  # conv_transpose(x) is the data gradient of conv(y): swap input and output, w is (C_in, C_out)
        x, w = [x[0], x[1], *y[2:]], [w[1], w[0], *w[2:]]
    return max(point, fft_workspace_bytes(x, w), winograd_nonfused_workspace_bytes(x, w, y))


def as_cudnn_shape(shape) -> list[int]:
    """The shape cuDNN sees: torch runs a 1-d convolution as a 2-d one of height 1 (``(N, C, L)`` ->
    ``(N, C, 1, L)``, Convolution.cpp's ``view1d_as_2d``); 2-d and 3-d shapes are kept."""
    s = [int(v) for v in shape]
    return [s[0], s[1], 1, s[2]] if len(s) == 3 else s


def _pad(c: int) -> int:
    return -(-int(c) // _TENSOR_CORE_ALIGN) * _TENSOR_CORE_ALIGN


def conv_workspace_bytes(direction: str, x_shape, w_shape, y_shape, dtype_bytes: int, *, transposed: bool = False,
                         groups: int = 1, math: str = "fp32") -> int:
    """Bytes of workspace cuDNN takes for one convolution call.

    ``direction``: ``forward``, ``backward_data`` or ``backward_weight``; shapes are the input, the weight
    and the output of the forward convolution (NCHW; for ``backward_*`` the output is the incoming
    gradient's shape). Tensor-core math (16-bit, or fp32 with ``math="tf32"``) runs NHWC kernels: the
    workspace holds NHWC copies of input, output and weight, channels padded to multiples of 8 (the
    incoming gradient twice in a transposed convolution's backward). Exceptions, as the H200 sweep has
    them: a 1x1 stride-1 kernel's forward and data gradient take none (a GEMM on the NCHW tensors), and a forward
    whose channel counts are not multiples of 8 takes none (cuDNN picks a kernel without the copies).
    fp32 without TF32: 0 (the heuristics' choice is not a rule on shapes; see
    :func:`conv_workspace_upper_bytes`). Fit and held-out check: benchmarks/fit_cudnn_fp32_h200.py.
    """
    tensor_core = dtype_bytes == 2 or (dtype_bytes == 4 and math == "tf32")
    if not tensor_core or groups != 1:
        return 0
    same_size = [int(v) for v in x_shape[2:]] == [int(v) for v in y_shape[2:]]
    if all(int(k) == 1 for k in w_shape[2:]) and same_size and direction != "backward_weight":
        return 0  # a 1x1 stride-1 convolution: a GEMM on the NCHW tensors
    c_in, c_out = int(x_shape[1]), int(y_shape[1])
    if direction == "forward" and (c_in % _TENSOR_CORE_ALIGN or c_out % _TENSOR_CORE_ALIGN):
        return 0
    x = _prod(x_shape) // c_in * _pad(c_in)
    y = _prod(y_shape) // c_out * _pad(c_out)
    w = _prod(w_shape[2:]) * _pad(w_shape[0]) * _pad(w_shape[1])
    if transposed and direction != "forward":
        y *= 2  # a transposed convolution's backward: the incoming gradient is copied twice (recorded: x + 2 gy + w)
    return (x + y + w) * dtype_bytes


def lstm_reserve_bytes(mode: str, seq_len: int, batch: int, input_size: int, hidden: int, layers: int,
                       bidirectional: bool, dtype_bytes: int) -> int:
    """Bytes of the reserve space ``_cudnn_rnn`` returns in training (0 in inference)."""
    states = seq_len * batch * hidden * layers * (2 if bidirectional else 1)
    return int(math.ceil(RESERVE_ELEMS_PER_STATE * states)) * dtype_bytes + RESERVE_EXTRA_BYTES


def lstm_workspace_bytes(direction: str, mode: str, seq_len: int, batch: int, input_size: int, hidden: int,
                         layers: int, bidirectional: bool, dtype_bytes: int, weight_elems: int = 0) -> int:
    """Bytes of transient workspace of one ``_cudnn_rnn`` (``forward``) or ``_cudnn_rnn_backward``
    (``backward``) call."""
    states = seq_len * batch * hidden * layers * (2 if bidirectional else 1)
    return int(WORKSPACE_ELEMS_PER_STATE * states * dtype_bytes
               + WORKSPACE_WEIGHT_BYTES_FACTOR * weight_elems * dtype_bytes + WORKSPACE_EXTRA_BYTES)


# --- algorithms, named by the kernels a call ran (H200 sweep: benchmarks/fit_cudnn_fp32_h200.py) ------------
def conv_algorithm(kernel_names) -> str:
    """The cuDNN algorithm family a convolution call ran, from the CUDA kernel names the profiler saw."""
    names = " ".join(kernel_names).lower()
    if not names:
        return "unknown"
    if "fft" in names:
        return "fft"
    if "winograd" in names and ("nonfused" in names or "forwarddata" in names or "forwardoutput" in names):
        return "winograd_nonfused"
    if "winograd" in names:
        return "winograd"
    if "im2col" in names:
        return "im2col_gemm"
    if "xmma" in names or "cutlass" in names or "sm90" in names or "sm80" in names:
        return "xmma"
    if "implicit_convolve" in names or "implicit" in names:
        return "implicit_gemm"
    return "other"


def _next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def fft_workspace_bytes(x_shape, w_shape) -> int:
    """cuDNN's (untiled) FFT convolution: the zero-padded input and the filter in the frequency domain,
    complex64 planes of next-pow2(H + 2 pad) x (next-pow2(W + 2 pad) / 2 + 1), twice each (N*C + K*C planes),
    plus one fp32 copy of the filter. A 1-d convolution is a 2-d one of height 1 (:func:`as_cudnn_shape`); a
    3-d one gets the same form over D, H and W (not recorded: a bound). Within 1 MiB (a block the allocator hands out unsplit) of the ten fp32
    forward calls of the families that took it (families.json)."""
    x, w = as_cudnn_shape(x_shape), as_cudnn_shape(w_shape)
    n, c, k = x[0], x[1], w[0]
    padded = [_next_pow2(d + 2 * (kd // 2)) for d, kd in zip(x[2:], w[2:])]  # H, W (and D for 3-d: FFT tiling)
    planes = math.prod(padded[:-1]) * (padded[-1] // 2 + 1)
    return 2 * 8 * planes * (n * c + k * c) + 4 * k * c * math.prod(w[2:])


def winograd_nonfused_workspace_bytes(x_shape, w_shape, y_shape) -> int:
    """cuDNN's non-fused Winograd (4x4 output tiles, 6x6 transforms, fp32): the transformed input and
    output tiles of every image and channel plus the transformed filter, 36 floats each."""
    y = as_cudnn_shape(y_shape)
    if len(y) != 4:
        return 0  # cuDNN's Winograd is 2-d only
    n, c = int(x_shape[0]), int(x_shape[1])
    k = int(w_shape[0])
    tiles = -(-y[2] // 4) * -(-y[3] // 4)
    return 36 * 4 * (tiles * n * (c + k) + k * c)


def conv_algorithm_workspace_bytes(algorithm: str, direction: str, x_shape, w_shape, y_shape, dtype_bytes: int, *,
                                   stride: int = 1, transposed: bool = False) -> int | None:
    """The workspace formula of one algorithm family (None where none is known)."""
    if algorithm == "fft" and not transposed:
        return fft_workspace_bytes(x_shape, w_shape)
    if algorithm == "winograd_nonfused" and not transposed:
        return winograd_nonfused_workspace_bytes(x_shape, w_shape, y_shape)
    if algorithm in ("implicit_gemm", "winograd"):
        return 0
    return None


# --- measured workspaces (workbench.capture.cudnn_calibration) -----------------------------------------------
DIRECTIONS = ("forward", "backward_data", "backward_weight")
CALIBRATION_FORMAT = "gpu-workbench/conv-workspaces/1"


def conv_call_key(direction: str, x_shape, w_shape, y_shape, stride, padding, dilation, transposed: bool,
                  output_padding, groups: int, dtype: str, math: str = "fp32", channels_last: bool = False) -> str:
    """One string naming a convolution call as cuDNN's heuristics see it: the direction, the shapes, the
    geometry, the element type (``fp32``, ``bf16``, ``fp16``), the math of a fp32 call (``fp32`` or
    ``tf32``; 16-bit calls are always tensor-core) and the memory format. Two calls with the same key get
    the same algorithm and the same workspace (benchmark=False: the heuristics' pick is a function of these)."""
    def ints(v):
        return "x".join(str(int(i)) for i in v)

    m = math if dtype == "fp32" else "tc"
    return (f"{direction}|x{ints(x_shape)}|w{ints(w_shape)}|y{ints(y_shape)}|s{ints(stride)}|p{ints(padding)}"
            f"|d{ints(dilation)}|t{int(bool(transposed))}|o{ints(output_padding)}|g{int(groups)}|{dtype}|{m}"
            f"|{'nhwc' if channels_last else 'nchw'}")


class ConvWorkspaces:
    """Workspaces measured on a GPU, one per convolution call (:func:`conv_call_key`): what the estimator
    uses in place of :func:`conv_workspace_bytes` for the calls it holds. Made by
    :func:`workbench.capture.cudnn_calibration.calibrate`; saved and loaded as JSON. ``meta`` says where it
    was measured (device, torch, cuDNN): a table only holds for the GPU and cuDNN it came from."""

    def __init__(self, entries: dict[str, int] | None = None, meta: dict | None = None):
        self.entries: dict[str, int] = {str(k): int(v) for k, v in (entries or {}).items()}
        self.meta: dict = dict(meta or {})

    def get(self, key: str) -> int | None:
        return self.entries.get(key)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def to_dict(self) -> dict:
        return {"format": CALIBRATION_FORMAT, "meta": self.meta, "entries": dict(sorted(self.entries.items()))}

    @classmethod
    def from_dict(cls, d: dict, source: str = "the table") -> "ConvWorkspaces":
        """The table of :meth:`to_dict`'s form; ValueError saying what is wrong otherwise."""
        if not isinstance(d, dict) or d.get("format") != CALIBRATION_FORMAT or not isinstance(d.get("entries"), dict):
            raise ValueError(f"{source}: not a convolution workspace table (format {CALIBRATION_FORMAT!r})")
        entries = d["entries"]
        bad = [k for k, v in entries.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0
               or len(str(k).split("|")) != 13 or str(k).split("|")[0] not in DIRECTIONS]
        if bad:
            raise ValueError(f"{source}: entry {str(bad[0])[:80]!r} is not 'direction|shapes...': bytes >= 0")
        return cls(entries, d.get("meta") if isinstance(d.get("meta"), dict) else {})

    def save(self, path) -> Path:
        """Write the table as JSON (atomically; the path is checked first)."""
        from workbench.io._files import atomic_write

        data = (json.dumps(self.to_dict(), indent=1) + "\n").encode()
        return Path(str(atomic_write(path, lambda f: f.write(data))))

    @classmethod
    def load(cls, path) -> "ConvWorkspaces":
        """Read a table written by :meth:`save`; a file that is not one raises BadArtifact naming it."""
        from workbench.errors import BadArtifact
        from workbench.io._files import read_input

        hint = "Give a table written by `workbench estimate --calibrate --workspaces PATH` on the GPU"
        raw = read_input(path, "a convolution workspace table", hint)
        try:
            return cls.from_dict(json.loads(raw), "")
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise BadArtifact(path, "is not JSON", hint) from None
        except ValueError as exc:
            raise BadArtifact(path, str(exc).removeprefix(": "), hint) from None
