"""A generated corpus of small models, one or a few torch.nn layer families each, for the estimator's
coverage test (tests/test_estimate_corpus.py): every one must run through ``estimate`` at every precision.

Each entry is a :class:`Case`: a name, ``model()`` (built on the meta device by the estimator),
``batch(batch_size)``, optionally ``loss(output)`` and ``optimizer(parameters)``. Shapes are tiny: the
corpus checks that the fake step runs (and that its convolution, RNN and attention rules accept every
shape family), not how much memory it takes.

The families: Conv1d/2d/3d and their transposes (grouped, depthwise, strided, dilated, channels-last);
batch/group/instance/layer/RMS/local-response norms in 1d-3d; RNN/GRU/LSTM (bidirectional, multi-layer,
projections, packed sequences); Embedding/EmbeddingBag (dense and sparse gradients); MultiheadAttention,
scaled_dot_product_attention, Transformer encoder/decoder; pooling 1d-3d (max, average, adaptive, LP,
fractional, unpooling); interpolate/upsample (every mode); pixel (un)shuffle, channel shuffle; dropouts;
the usual losses (cross-entropy with indices, probabilities and smoothing, CTC, NLL 1d/2d, BCE, ...);
FFTs (fft, rfft, rfftn, irfft, stft); padding, fold/unfold, grid_sample, bilinear, activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def sgd(params):
    return torch.optim.SGD(params, lr=1e-2)


@dataclass(frozen=True)
class Case:
    name: str
    model: Callable[[], nn.Module]
    batch: Callable[[int], tuple]
    loss: Callable | None = None
    optimizer: Callable = adamw
    family: str = ""


class Lambda(nn.Module):
    """A module around a function of its input (and its own parameters through ``self``)."""

    def __init__(self, fn, *modules: nn.Module):
        super().__init__()
        self.fn = fn
        self.inner = nn.ModuleList(modules)

    def forward(self, *xs):
        return self.fn(self, *xs)


def _x(*shape, dtype=torch.float32):
    return lambda bs: (torch.randn(bs, *shape, dtype=dtype),)


def _seq(layers):
    return lambda: nn.Sequential(*layers())


class _FunctionalConv(nn.Module):
    """F.conv1d, then F.conv2d and F.conv_transpose1d on parameters of its own."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(6, 4, 3))
        self.w2 = nn.Parameter(torch.randn(2, 1, 3, 3))
        self.wt = nn.Parameter(torch.randn(6, 3, 2))

    def forward(self, x):
        y = F.conv1d(x, self.w1, padding=1)
        return F.conv2d(y.unsqueeze(1), self.w2).sum() + F.conv_transpose1d(y, self.wt, stride=2).sum()


# --- convolutions -------------------------------------------------------------------------------------
def _conv_cases() -> list[Case]:
    cases = []
    specs = [  # name, layers, input shape (no batch)
        ("conv1d", lambda: [nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv1d(8, 8, 5, stride=2)], (4, 32)),
        ("conv1d_dilated_nobias", lambda: [nn.Conv1d(3, 6, 3, dilation=2, bias=False)], (3, 40)),
        ("conv1d_depthwise", lambda: [nn.Conv1d(8, 8, 3, groups=8, padding="same"), nn.Conv1d(8, 16, 1)], (8, 24)),
        ("conv2d", lambda: [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2)], (3, 16, 16)),
        ("conv2d_grouped", lambda: [nn.Conv2d(8, 16, 3, groups=4, padding=1), nn.Conv2d(16, 8, 1, groups=2)],
         (8, 12, 12)),
        ("conv2d_depthwise_separable", lambda: [nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.Conv2d(8, 16, 1)],
         (8, 12, 12)),
        ("conv2d_rect_kernel_reflect", lambda: [nn.Conv2d(2, 4, (1, 5), padding=(0, 2), padding_mode="reflect"),
                                                nn.Conv2d(4, 4, (3, 1), dilation=(2, 1))], (2, 10, 10)),
        ("conv3d", lambda: [nn.Conv3d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv3d(4, 8, 3, stride=2)], (2, 8, 8, 8)),
        ("conv3d_grouped_circular", lambda: [nn.Conv3d(4, 8, 3, groups=2, padding=1, padding_mode="circular")],
         (4, 6, 6, 6)),
        ("conv3d_depthwise", lambda: [nn.Conv3d(4, 4, 3, groups=4, padding=1), nn.Conv3d(4, 8, 1)], (4, 6, 6, 6)),
        ("convtranspose1d", lambda: [nn.ConvTranspose1d(4, 8, 4, stride=2, padding=1)], (4, 16)),
        ("convtranspose2d", lambda: [nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
                                     nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2)], (8, 8, 8)),
        ("convtranspose3d", lambda: [nn.ConvTranspose3d(4, 2, 2, stride=2),
                                     nn.ConvTranspose3d(2, 2, 3, padding=1, groups=2)], (4, 4, 4, 4)),
    ]
    for name, layers, shape in specs:
        cases.append(Case(name, _seq(layers), _x(*shape), family="conv"))

    def cl_batch(bs):
        return (torch.randn(bs, 3, 16, 16).contiguous(memory_format=torch.channels_last),)

    cases.append(Case("conv2d_channels_last",
                      lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                            nn.Conv2d(8, 8, 3)).to(memory_format=torch.channels_last),
                      cl_batch, family="conv"))

    def cl3d_batch(bs):
        return (torch.randn(bs, 2, 6, 6, 6).contiguous(memory_format=torch.channels_last_3d),)

    cases.append(Case("conv3d_channels_last_3d",
                      lambda: nn.Sequential(nn.Conv3d(2, 8, 3, padding=1), nn.Conv3d(8, 8, 1)
                                            ).to(memory_format=torch.channels_last_3d),
                      cl3d_batch, family="conv"))
    cases.append(Case("functional_conv1d_2d", lambda: _FunctionalConv(), _x(4, 20), family="conv"))
    return cases


# --- norms --------------------------------------------------------------------------------------------
def _norm_cases() -> list[Case]:
    specs = [
        ("batchnorm1d_2d_input", lambda: [nn.Linear(8, 16), nn.BatchNorm1d(16)], (8,)),
        ("batchnorm1d_3d_input", lambda: [nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8)], (4, 16)),
        ("batchnorm2d", lambda: [nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=None)], (3, 10, 10)),
        ("batchnorm3d_no_stats", lambda: [nn.Conv3d(2, 4, 3), nn.BatchNorm3d(4, track_running_stats=False)],
         (2, 6, 6, 6)),
        ("groupnorm", lambda: [nn.Conv2d(4, 8, 3), nn.GroupNorm(2, 8), nn.SiLU()], (4, 10, 10)),
        ("groupnorm_1d_3d", lambda: [nn.Conv3d(4, 8, 1), nn.GroupNorm(4, 8, affine=False)], (4, 4, 4, 4)),
        ("instancenorm1d", lambda: [nn.Conv1d(4, 8, 3), nn.InstanceNorm1d(8, affine=True)], (4, 16)),
        ("instancenorm2d_stats", lambda: [nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, track_running_stats=True)],
         (3, 10, 10)),
        ("instancenorm3d", lambda: [nn.Conv3d(2, 4, 3), nn.InstanceNorm3d(4, affine=True)], (2, 6, 6, 6)),
        ("layernorm", lambda: [nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU()], (5, 16)),
        ("layernorm_2d_shape_nobias", lambda: [nn.LayerNorm([4, 6], bias=False)], (3, 4, 6)),
        ("rmsnorm", lambda: [nn.Linear(16, 32), nn.RMSNorm(32), nn.Linear(32, 8)], (5, 16)),
        ("rmsnorm_2d_shape", lambda: [nn.Conv2d(2, 4, 1), nn.RMSNorm([4, 5, 5], elementwise_affine=False)],
         (2, 5, 5)),
        ("localresponsenorm", lambda: [nn.Conv2d(3, 8, 3), nn.LocalResponseNorm(3)], (3, 8, 8)),
        ("lazy_batchnorm_linear", lambda: [nn.Linear(6, 6), nn.LazyBatchNorm1d()], (6,)),
    ]
    return [Case(n, _seq(l), _x(*s), family="norm") for n, l, s in specs]


# --- recurrent ------------------------------------------------------------------------------------------
class _RnnHead(nn.Module):
    def __init__(self, rnn: nn.Module, out: int):
        super().__init__()
        self.rnn = rnn
        self.head = nn.LazyLinear(3) if out <= 0 else nn.Linear(out, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


class _Packed(nn.Module):
    """An RNN on a padded batch of sequences of different lengths, packed (enforce_sorted off)."""

    def __init__(self, kind, bidirectional: bool):
        super().__init__()
        self.rnn = kind(8, 16, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(32 if bidirectional else 16, 2)

    def forward(self, x):
        bs, t = x.shape[0], x.shape[1]
        lengths = [max(1, t - (i % t)) for i in range(bs)]
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=True,
                                                   enforce_sorted=False)
        y, _ = self.rnn(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=t)
        return self.head(y)


def _rnn_cases() -> list[Case]:
    cases = []
    for kind in (nn.RNN, nn.GRU, nn.LSTM):
        k = kind.__name__.lower()
        cases.append(Case(f"{k}", lambda kind=kind: _RnnHead(kind(8, 16), 16), lambda bs: (torch.randn(6, bs, 8),),
                          family="rnn"))
        cases.append(Case(f"{k}_bidirectional_2layer_batchfirst",
                          lambda kind=kind: _RnnHead(kind(8, 16, num_layers=2, bidirectional=True, batch_first=True,
                                                          dropout=0.1), 32),
                          lambda bs: (torch.randn(bs, 6, 8),), family="rnn"))
        cases.append(Case(f"{k}_packed", lambda kind=kind: _Packed(kind, bidirectional=kind is not nn.RNN),
                          lambda bs: (torch.randn(bs, 7, 8),), family="rnn"))
    cases.append(Case("rnn_relu_nobias", lambda: _RnnHead(nn.RNN(8, 12, nonlinearity="relu", bias=False), 12),
                      lambda bs: (torch.randn(5, bs, 8),), family="rnn"))
    cases.append(Case("lstm_proj", lambda: _RnnHead(nn.LSTM(8, 16, proj_size=4, num_layers=2, bidirectional=True), 8),
                      lambda bs: (torch.randn(5, bs, 8),), family="rnn"))
    cases.append(Case("cells", lambda: Lambda(
        lambda self, x: self.inner[1](self.inner[0](x[0]))[0] + self.inner[2](x[1]),
        nn.GRUCell(8, 8), nn.LSTMCell(8, 8), nn.RNNCell(8, 8)), lambda bs: (torch.randn(2, bs, 8),), family="rnn"))
    return cases


# --- embeddings ---------------------------------------------------------------------------------------
def _embedding_cases() -> list[Case]:
    def tokens(bs):
        return (torch.randint(0, 50, (bs, 7)),)

    def bag_inputs(bs):
        return (torch.randint(0, 50, (bs * 3,)), torch.arange(0, bs * 3, 3))

    class Bag(nn.Module):
        def __init__(self, mode, sparse, weights=False):
            super().__init__()
            self.bag = nn.EmbeddingBag(50, 16, mode=mode, sparse=sparse)
            self.weights = weights
            self.head = nn.Linear(16, 2)

        def forward(self, idx, offsets):
            w = torch.ones(idx.shape[0], device=idx.device) if self.weights else None
            return self.head(self.bag(idx, offsets, per_sample_weights=w))

    return [
        Case("embedding", _seq(lambda: [nn.Embedding(50, 16, padding_idx=0), nn.Linear(16, 4)]), tokens,
             family="embedding"),
        Case("embedding_sparse_sgd", _seq(lambda: [nn.Embedding(50, 16, sparse=True), nn.Linear(16, 4)]), tokens,
             optimizer=sgd, family="embedding"),
        Case("embedding_sparse_sparseadam", _seq(lambda: [nn.Embedding(50, 16, sparse=True)]), tokens,
             optimizer=lambda p: torch.optim.SparseAdam(list(p)), family="embedding"),
        Case("embedding_max_norm_scale_grad", _seq(lambda: [nn.Embedding(50, 16, scale_grad_by_freq=True),
                                                            nn.Linear(16, 4)]), tokens, family="embedding"),
        Case("embeddingbag_mean", lambda: Bag("mean", False), bag_inputs, family="embedding"),
        Case("embeddingbag_sum_sparse_weights", lambda: Bag("sum", True, weights=True), bag_inputs, optimizer=sgd,
             family="embedding"),
        Case("embeddingbag_max", lambda: Bag("max", False), bag_inputs, family="embedding"),
    ]


# --- attention and transformers -------------------------------------------------------------------------
class _Mha(nn.Module):
    def __init__(self, batch_first=True, need_weights=False, kdim=None, masked=False):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim, dropout=0.1)
        self.need_weights, self.masked, self.kdim = need_weights, masked, kdim

    def forward(self, x):
        kv = x if self.kdim is None else x.new_ones(*x.shape[:-1], self.kdim)
        t = x.shape[1] if self.attn.batch_first else x.shape[0]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device) if self.masked else None
        y, w = self.attn(x, kv, kv, need_weights=self.need_weights, attn_mask=mask)
        return y if w is None else y + w.sum()


class _Sdpa(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.causal = causal

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=0.1).transpose(1, 2)


def _attention_cases() -> list[Case]:
    seq = lambda bs: (torch.randn(bs, 6, 16),)  # noqa: E731
    return [
        Case("mha_batch_first", lambda: _Mha(), seq, family="attention"),
        Case("mha_weights_seq_first", lambda: _Mha(batch_first=False, need_weights=True), seq, family="attention"),
        Case("mha_kdim_masked", lambda: _Mha(kdim=8, masked=True), seq, family="attention"),
        Case("sdpa_causal", lambda: _Sdpa(True), seq, family="attention"),
        Case("sdpa", lambda: _Sdpa(False), seq, family="attention"),
        Case("transformer_encoder", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2, enable_nested_tensor=False), seq,
            family="attention"),
        Case("transformer_encoder_norm_first_gelu", lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 2, 32, activation="gelu", norm_first=True), 2,
            norm=nn.LayerNorm(16), enable_nested_tensor=False), lambda bs: (torch.randn(6, bs, 16),),
            family="attention"),
        Case("transformer_decoder", lambda: Lambda(lambda self, x: self.inner[0](x, x[:, :3]),
                                                   nn.TransformerDecoder(nn.TransformerDecoderLayer(
                                                       16, 4, 32, batch_first=True), 2)), seq, family="attention"),
        Case("transformer_full", lambda: Lambda(
            lambda self, x: self.inner[0](x, x, tgt_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[1]),
                                          tgt_is_causal=True),
            nn.Transformer(16, 2, 1, 1, 32, batch_first=True)), seq, family="attention"),
    ]


# --- pooling, resampling, shuffles, dropouts --------------------------------------------------------------
def _spatial_cases() -> list[Case]:
    class Unpool(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)
            self.pool = nn.MaxPool2d(2, return_indices=True)
            self.unpool = nn.MaxUnpool2d(2)

        def forward(self, x):
            y, i = self.pool(self.conv(x))
            return self.unpool(y, i)

    img = _x(2, 8, 8)
    specs = [
        ("maxpool_1d_2d_3d", lambda self, x: F.max_pool1d(self.inner[0](x).flatten(2), 2).sum()
         + F.max_pool2d(self.inner[0](x), 2, ceil_mode=True).sum()
         + F.max_pool3d(self.inner[0](x).unsqueeze(1), 2).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("avgpool_1d_2d_3d", lambda self, x: F.avg_pool1d(self.inner[0](x).flatten(2), 3).sum()
         + F.avg_pool2d(self.inner[0](x), 3, stride=2, padding=1, count_include_pad=False).sum()
         + F.avg_pool3d(self.inner[0](x).unsqueeze(1), 2).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("adaptive_pools", lambda self, x: F.adaptive_avg_pool2d(self.inner[0](x), 3).sum()
         + F.adaptive_max_pool2d(self.inner[0](x), (2, 5)).sum()
         + F.adaptive_avg_pool1d(self.inner[0](x).flatten(2), 4).sum()
         + F.adaptive_max_pool3d(self.inner[0](x).unsqueeze(1), 2).sum()
         + F.adaptive_avg_pool3d(self.inner[0](x).unsqueeze(1), 3).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("lppool", lambda self, x: nn.LPPool2d(2, 2)(self.inner[0](x)).sum()
         + nn.LPPool1d(2, 2)(self.inner[0](x).flatten(2)).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("fractional_maxpool", lambda self, x: nn.FractionalMaxPool2d(2, output_ratio=0.5)(self.inner[0](x)),
         [nn.Conv2d(2, 2, 1)], img),
        ("interpolate_2d_modes", lambda self, x: sum(
            F.interpolate(self.inner[0](x), scale_factor=2, mode=m, **({} if m in ("nearest", "area", "nearest-exact")
                                                                        else {"align_corners": a})).sum()
            for m, a in (("nearest", None), ("bilinear", False), ("bicubic", True), ("area", None),
                         ("nearest-exact", None))), [nn.Conv2d(2, 2, 1)], img),
        ("interpolate_1d_3d", lambda self, x: F.interpolate(self.inner[0](x).flatten(2), size=100, mode="linear").sum()
         + F.interpolate(self.inner[0](x).unsqueeze(1), scale_factor=(1, 2, 2), mode="trilinear").sum()
         + F.interpolate(self.inner[0](x).flatten(2), scale_factor=2).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("upsample_modules", lambda self, x: self.inner[2](self.inner[1](self.inner[0](x))),
         [nn.Conv2d(2, 2, 1), nn.Upsample(scale_factor=2, mode="bilinear"), nn.UpsamplingNearest2d(scale_factor=2)],
         img),
        ("pixel_shuffle", lambda self, x: self.inner[2](self.inner[1](self.inner[0](x))),
         [nn.Conv2d(2, 8, 1), nn.PixelShuffle(2), nn.PixelUnshuffle(2)], img),
        ("channel_shuffle", lambda self, x: self.inner[1](self.inner[0](x)),
         [nn.Conv2d(2, 8, 1), nn.ChannelShuffle(2)], img),
        ("dropouts", lambda self, x: nn.Dropout(0.2)(self.inner[0](x)).sum() + nn.Dropout2d(0.2)(self.inner[0](x)).sum()
         + nn.Dropout1d(0.2)(self.inner[0](x).flatten(2)).sum() + nn.Dropout3d(0.2)(self.inner[0](x).unsqueeze(1)).sum()
         + nn.AlphaDropout(0.2)(self.inner[0](x)).sum() + nn.FeatureAlphaDropout(0.2)(self.inner[0](x)).sum()
         + F.dropout(self.inner[0](x), 0.5, inplace=False).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("padding_modes", lambda self, x: nn.ReflectionPad2d(2)(self.inner[0](x)).sum()
         + nn.ReplicationPad3d(1)(self.inner[0](x).unsqueeze(1)).sum() + nn.CircularPad1d(2)(self.inner[0](x).flatten(2)).sum()
         + nn.ZeroPad2d((1, 2, 0, 1))(self.inner[0](x)).sum() + nn.ConstantPad3d(1, 0.5)(self.inner[0](x).unsqueeze(1)).sum()
         + nn.ReflectionPad1d(1)(self.inner[0](x).flatten(2)).sum(), [nn.Conv2d(2, 2, 1)], img),
        ("fold_unfold", lambda self, x: nn.Fold((8, 8), 2, stride=2)(nn.Unfold(2, stride=2)(self.inner[0](x))),
         [nn.Conv2d(2, 2, 1)], img),
        ("grid_sample_affine", lambda self, x: F.grid_sample(
            self.inner[0](x), F.affine_grid(self.inner[1](x.flatten(1)).view(-1, 2, 3), [x.shape[0], 2, 6, 6],
                                            align_corners=False), align_corners=False),
         [nn.Conv2d(2, 2, 1), nn.Linear(128, 6)], img),
    ]
    cases = [Case(n, (lambda fn=fn, mods=mods: Lambda(fn, *mods)), b, family="spatial") for n, fn, mods, b in specs]
    cases.append(Case("maxunpool", lambda: Unpool(), img, family="spatial"))
    return cases


# --- losses -------------------------------------------------------------------------------------------------
def _loss_cases() -> list[Case]:
    C = 5

    def logits_targets(bs):
        return (torch.randn(bs, 8), torch.randint(0, C, (bs,)))

    class Head(nn.Module):
        def __init__(self, fn, out=C):
            super().__init__()
            self.lin = nn.Linear(8, out)
            self.fn = fn

        def forward(self, x, *rest):
            return self.fn(self.lin(x), *rest)

    def case(name, fn, batch=logits_targets, out=C):
        return Case(name, lambda: Head(fn, out), batch, loss=lambda y: y, family="loss")

    def ctc_batch(bs):
        return (torch.randn(bs, 8), torch.randint(1, C, (bs, 3)))

    def ctc(y, targets):  # y: (N, C) -> (T, N, C) log-probabilities
        t = 6
        logp = y.unsqueeze(0).expand(t, -1, -1).log_softmax(-1)
        n = y.shape[0]
        return F.ctc_loss(logp, targets, torch.full((n,), t, dtype=torch.long), torch.full((n,), 3, dtype=torch.long))

    def seg_batch(bs):
        return (torch.randn(bs, 3, 6, 6), torch.randint(0, 4, (bs, 6, 6)))

    seg = Case("nll_2d_segmentation", lambda: Lambda(
        lambda self, x, t: F.nll_loss(F.log_softmax(self.inner[0](x), 1), t, ignore_index=2), nn.Conv2d(3, 4, 1)),
        seg_batch, loss=lambda y: y, family="loss")
    seg_ce = Case("cross_entropy_2d_weighted", lambda: Lambda(
        lambda self, x, t: F.cross_entropy(self.inner[0](x), t, weight=torch.ones(4, device=x.device)), nn.Conv2d(3, 4, 1)),
        seg_batch, loss=lambda y: y, family="loss")
    return [
        case("cross_entropy", lambda y, t: F.cross_entropy(y, t)),
        case("cross_entropy_label_smoothing_ignore", lambda y, t: F.cross_entropy(y, t, label_smoothing=0.1,
                                                                                   ignore_index=0)),
        case("cross_entropy_probabilities", lambda y, t: F.cross_entropy(y, F.one_hot(t, C).float())),
        case("nll", lambda y, t: F.nll_loss(F.log_softmax(y, -1), t, reduction="sum")),
        case("ctc", ctc, batch=ctc_batch),
        case("bce", lambda y, t: F.binary_cross_entropy(torch.sigmoid(y), F.one_hot(t, C).float())),
        case("bce_with_logits_pos_weight", lambda y, t: F.binary_cross_entropy_with_logits(
            y, F.one_hot(t, C).float(), pos_weight=torch.full((C,), 2.0, device=y.device))),
        case("regression_losses", lambda y, t: F.mse_loss(y, t.float()[:, None].expand_as(y))
             + F.l1_loss(y, y.detach() * 0.5) + F.smooth_l1_loss(y, y.detach() + 1) + F.huber_loss(y, y.detach() - 1)),
        case("kl_div_cosine_margin", lambda y, t: F.kl_div(F.log_softmax(y, -1), F.softmax(y.detach(), -1),
                                                           reduction="batchmean")
             + F.cosine_embedding_loss(y, y.flip(0), torch.ones(y.shape[0], device=y.device))
             + F.margin_ranking_loss(y[:, 0], y[:, 1], torch.ones(y.shape[0], device=y.device))
             + F.triplet_margin_loss(y, y.roll(1, 0), y.roll(2, 0))),
        case("multilabel_poisson_gaussian", lambda y, t: F.multilabel_soft_margin_loss(y, F.one_hot(t, C).float())
             + F.poisson_nll_loss(y, t.float()[:, None].expand_as(y))
             + F.gaussian_nll_loss(y, torch.zeros_like(y), torch.ones_like(y))
             + F.multi_margin_loss(y, t) + F.hinge_embedding_loss(y, torch.ones_like(y))
             + F.soft_margin_loss(y, torch.ones_like(y))),
        seg, seg_ce,
    ]


# --- FFTs and other functional ops ----------------------------------------------------------------------------
def _functional_cases() -> list[Case]:
    def lin(fn, d_in=16, d_out=16):
        return lambda: Lambda(fn, nn.Linear(d_in, d_out))

    seq = _x(4, 16)
    specs = [
        # CUDA's FFTs take no bf16 (cuFFT) and autocast leaves them alone: a model casts to float first
        ("fft_1d", lin(lambda self, x: torch.fft.ifft(torch.fft.fft(self.inner[0](x).float(), dim=-1)).real), seq),
        ("rfft_irfft", lin(lambda self, x: torch.fft.irfft(torch.fft.rfft(self.inner[0](x).float()), n=16)), seq),
        ("fft2_rfftn", lin(lambda self, x: torch.fft.fft2(self.inner[0](x).float()).abs().sum()
                           + torch.fft.rfftn(self.inner[0](x).float().unsqueeze(1), dim=(1, 2, 3)).abs().sum()), seq),
        ("fftshift_hfft", lin(lambda self, x: torch.fft.hfft(torch.fft.fftshift(self.inner[0](x).to(torch.complex64)))),
         seq),
        ("stft", lin(lambda self, x: torch.stft(self.inner[0](x).flatten(1), 16, hop_length=4,
                                                window=torch.hann_window(16, device=x.device), return_complex=True).abs(), 16, 16), seq),
        ("activations", lin(lambda self, x: sum(f(self.inner[0](x)).sum() for f in (
            F.gelu, F.silu, F.mish, F.elu, F.selu, F.celu, F.softplus, F.hardswish, F.hardsigmoid, torch.tanh,
            torch.sigmoid, F.leaky_relu, F.relu6, F.logsigmoid, F.softsign, F.tanhshrink, lambda v: F.softmin(v, -1),
            lambda v: F.glu(v, -1), lambda v: F.gelu(v, approximate="tanh"), lambda v: F.log_softmax(v, -1)))), seq),
        ("prelu_bilinear", lambda: Lambda(lambda self, x: self.inner[1](self.inner[0](x), x),
                                          nn.PReLU(), nn.Bilinear(16, 16, 4)), seq),
        ("einsum_gather_scatter_topk", lin(lambda self, x: torch.einsum("bij,bkj->bik", self.inner[0](x), x).sum()
                                           + self.inner[0](x).gather(-1, x.argsort(-1)[..., :3]).sum()
                                           + self.inner[0](x).topk(3, -1).values.sum()
                                           + self.inner[0](x).cumsum(-1).sum()
                                           + torch.zeros_like(x).scatter_add(-1, x.argmax(-1, keepdim=True),
                                                                             self.inner[0](x)[..., :1]).sum()), seq),
        ("cdist_pairwise_cosine", lin(lambda self, x: torch.cdist(self.inner[0](x), x).sum()
                                      + F.pairwise_distance(self.inner[0](x), x).sum()
                                      + F.cosine_similarity(self.inner[0](x), x, dim=-1).sum()
                                      + F.normalize(self.inner[0](x), dim=-1).sum()), seq),
        ("flatten_unflatten_identity", _seq(lambda: [nn.Flatten(), nn.Linear(64, 64), nn.Unflatten(1, (4, 16)),
                                                     nn.Identity(), nn.Softmax(-1)]), seq),
        ("masked_where_clamp", lin(lambda self, x: torch.where(x > 0, self.inner[0](x), 0.0).clamp(-1, 1).masked_fill(
            x < -1, 0.0)), seq),
        ("linalg", lin(lambda self, x: torch.linalg.vector_norm(self.inner[0](x), dim=-1).sum()
                       + (self.inner[0](x) @ x.transpose(-1, -2)).diagonal(dim1=-2, dim2=-1).sum()), seq),
    ]
    return [Case(n, m, b, family="functional") for n, m, b in specs]


def corpus() -> list[Case]:
    """Every case of the corpus (70 and more)."""
    cases = (_conv_cases() + _norm_cases() + _rnn_cases() + _embedding_cases() + _attention_cases()
             + _spatial_cases() + _loss_cases() + _functional_cases())
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "corpus names must be unique"
    return cases
