"""Four small model families built from torch.nn, shared by the estimate examples, tests and the
H200 accuracy benchmark (benchmarks/estimate_accuracy.py).

Every builder uses the default device, so the same code builds on ``meta`` (the estimate), on the
CPU (tests) and on CUDA (the benchmark, under ``torch.device("cuda")``).
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.capture.models import SmallResNet, UNet, _ConvBlock, _double_conv  # noqa: F401 (re-exported)

__all__ = ["FAMILIES", "mlp", "cnn", "unet", "lstm", "encoder", "decoder_lm"]


def mlp(width: int = 2048, depth: int = 6, d_in: int = 1024, classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def mlp_batch(batch_size: int, d_in: int = 1024):
    return (torch.randn(batch_size, d_in),)


def cnn() -> nn.Module:
    return SmallResNet()


def cnn_batch(batch_size: int, size: int = 64):
    return (torch.randn(batch_size, 3, size, size),)


def unet() -> nn.Module:
    return UNet()


def unet_batch(batch_size: int, size: int = 128):
    return (torch.randn(batch_size, 3, size, size),)


class LSTMModel(nn.Module):
    """Token embedding, a 2-layer LSTM (batch first; cuDNN's fused RNN on CUDA), a linear head."""

    def __init__(self, vocab: int = 8192, d_embed: int = 512, hidden: int = 1024, layers: int = 2, out: int = 256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_embed)
        self.rnn = nn.LSTM(d_embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, out)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y)


def lstm() -> nn.Module:
    return LSTMModel()


def lstm_batch(batch_size: int, seq_len: int = 256, vocab: int = 8192):
    return (torch.randint(0, vocab, (batch_size, seq_len)),)


class Encoder(nn.Module):
    def __init__(self, d_model: int = 768, layers: int = 6, heads: int = 12, vocab: int = 32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def encoder() -> nn.Module:
    return Encoder()


def token_batch(batch_size: int, seq_len: int = 512, vocab: int = 32000):
    return (torch.randint(0, vocab, (batch_size, seq_len)),)


class _DecoderBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class DecoderLM(nn.Module):
    """A GPT-style decoder-only language model (pre-norm blocks, causal SDPA, tied embedding)."""

    def __init__(self, d_model: int = 768, layers: int = 8, heads: int = 12, vocab: int = 32000, max_len: int = 2048):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_DecoderBlock(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def decoder_lm() -> nn.Module:
    return DecoderLM()


def lm_loss(logits):
    # next-token cross-entropy against fixed targets (token 0): the usual shape of an LM loss
    targets = torch.zeros(logits.shape[0] * logits.shape[1], dtype=torch.long, device=logits.device)
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets)


def adamw(params):
    return torch.optim.AdamW(params, lr=1e-4)


# name -> (model builder, batch builder, loss or None)
FAMILIES = {
    "mlp": (mlp, mlp_batch, None),
    "cnn": (cnn, cnn_batch, None),
    "unet": (unet, unet_batch, None),
    "lstm": (lstm, lstm_batch, None),
    "encoder": (encoder, token_batch, None),
    "decoder_lm": (decoder_lm, token_batch, lm_loss),
}
