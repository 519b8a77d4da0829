"""cuDNN's fused LSTM, as CUDA runs ``nn.LSTM``, for the fake step.

On the CPU (and so on fake CPU tensors) nn.LSTM runs oneDNN's RNN layer, which keeps other tensors
than cuDNN's: CUDA calls _cudnn_rnn, which returns the output, h_n, c_n and a reserve space (gates
and states of every step, kept for backward), takes a workspace for the call, and under autocast
casts input, states and weights to the lower dtype and copies the weights into one flat buffer
(aten/src/ATen/native/cudnn/AutocastRNN.cpp). nn.LSTM's call to _VF.lstm is routed here while a
step is traced; the sizes come from workbench.analysis.memory.cudnn_model.
"""

from __future__ import annotations

import contextlib

import torch

from workbench.analysis.memory import cudnn_model
__all__ = ["cudnn_rnn"]


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


def _packed(args) -> bool:
    """Whether a ``_VF`` RNN call is the packed-sequence overload: its second argument is the batch sizes
    (1-d int64), not the initial state."""
    return len(args) == 9 and isinstance(args[1], torch.Tensor) and args[1].dtype == torch.int64


class _CudnnVF:
    """Stands in for ``torch._VF`` inside torch.nn.modules.rnn while a step is traced: ``lstm`` on
    unpacked input goes to :class:`_CudnnLstmFunction`, everything else to the real ``_VF``."""

    def __init__(self, real, tracker, lower):
        self._real, self._tracker, self._lower = real, tracker, lower

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _unpacked(self, name, args):
        """A packed sequence's call (``data, batch_sizes, hx, params, has_biases, layers, dropout, train,
        bidirectional``) run as the padded one it stands for (every sequence at full length, as
        :func:`_pack_padded_sequence` made it): (T*B, F) data is viewed as (T, B, F) and the output
        flattened back."""
        data, batch_sizes, hx, *rest = args
        t = int(batch_sizes.shape[0])
        b = int(data.shape[0]) // max(t, 1)
        out = getattr(self, name)(data.view(t, b, *data.shape[1:]), hx, *rest, False)
        return (out[0].reshape(t * b, *out[0].shape[2:]), *out[1:])

    def gru(self, *args):
        if _packed(args):
            return self._unpacked("gru", args)
        return self._real.gru(*args)

    def rnn_tanh(self, *args):
        if _packed(args):
            return self._unpacked("rnn_tanh", args)
        return self._real.rnn_tanh(*args)

    def rnn_relu(self, *args):
        if _packed(args):
            return self._unpacked("rnn_relu", args)
        return self._real.rnn_relu(*args)

    def lstm(self, *args):
        if _packed(args):  # a packed sequence
            return self._unpacked("lstm", args)
        if len(args) != 9:
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


class _PackingVF:
    """Stands in for ``torch._VF`` inside torch.nn.utils.rnn while a step is traced. Packing a padded batch
    needs the lengths' values, which fake tensors do not hold: every sequence is taken at full length (the
    most a packed batch holds; the record's ``data_dependent`` says so)."""

    def __init__(self, real, tracker):
        self._real, self._tracker = real, tracker

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _pack_padded_sequence(self, input, lengths, batch_first):
        x = input.transpose(0, 1) if batch_first else input
        t, b = int(x.shape[0]), int(x.shape[1])
        self._tracker.data_dependent["packed_sequences"] = self._tracker.data_dependent.get("packed_sequences", 0) + 1
        data = x.reshape(t * b, *x.shape[2:]).clone()  # a new (sum of lengths, *) tensor, as the kernel's
        return data, self._tracker.constant(torch.full((t,), b, dtype=torch.int64), b)

    def _pad_packed_sequence(self, data, batch_sizes, batch_first, padding_value, total_length):
        t = int(batch_sizes.shape[0])
        b = int(data.shape[0]) // max(t, 1)
        out = data.view(t, b, *data.shape[1:])
        if total_length > t:
            out = torch.cat([out, out.new_full((total_length - t, *out.shape[1:]), padding_value)])
        out = out.transpose(0, 1).contiguous() if batch_first else out.clone()
        return out, self._tracker.constant(torch.full((b,), t, dtype=torch.int64), t)


@contextlib.contextmanager
def cudnn_rnn(tracker, lower):
    """Route ``nn.LSTM`` to :class:`_CudnnLstmFunction`, and packed sequences to their padded form, while
    the block runs."""
    import torch.nn.modules.rnn as rnn
    import torch.nn.utils.rnn as rnn_utils

    real, real_utils = rnn._VF, rnn_utils._VF
    rnn._VF = _CudnnVF(real, tracker, lower)
    rnn_utils._VF = _PackingVF(real_utils, tracker)
    try:
        yield
    finally:
        rnn._VF = real
        rnn_utils._VF = real_utils
