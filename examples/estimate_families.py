"""Four small model families built from torch.nn, shared by the estimate examples, tests and the
H200 accuracy benchmark (benchmarks/estimate_accuracy.py).

Every builder uses the default device, so the same code builds on ``meta`` (the estimate), on the
CPU (tests) and on CUDA (the benchmark, under ``torch.device("cuda")``).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FAMILIES", "mlp", "cnn", "encoder", "decoder_lm"]


def mlp(width: int = 2048, depth: int = 6, d_in: int = 1024, classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.GELU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(0.1)]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def mlp_batch(batch_size: int, d_in: int = 1024):
    return (torch.randn(batch_size, d_in),)


class _ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
                     if stride != 1 or c_in != c_out else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.skip(x))


class SmallResNet(nn.Module):
    def __init__(self, widths=(64, 128, 256, 512), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, c = [], widths[0]
        for i, w in enumerate(widths):
            blocks.append(_ConvBlock(c, w, 1 if i == 0 else 2))
            c = w
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x.mean(dim=(2, 3)))


def cnn() -> nn.Module:
    return SmallResNet()


def cnn_batch(batch_size: int, size: int = 64):
    return (torch.randn(batch_size, 3, size, size),)


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
    "encoder": (encoder, token_batch, None),
    "decoder_lm": (decoder_lm, token_batch, lm_loss),
}
