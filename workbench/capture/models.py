"""The models of the H200 measurements, defined once: the transformer, and the estimator's convolution
families (:class:`SmallResNet`, :class:`UNet`: ``examples/estimate_families.py``, notebook 20, the H200
calibration and accuracy recordings).

A decoder-only language model: token embedding (and optionally a learned position embedding), pre-norm
blocks (causal scaled-dot-product attention, then a 4x GELU MLP), a final norm and the vocabulary head.
The guided notebooks (30, 31, 34), the GPU harness test (``tests/gpu/test_harness_gpu.py``) and the H200
recording script (``benchmarks/record_diagnosis_h200.py``) all build it from here, with their own sizes:
the H200 runs use ``LM(layers=12, d=1024, heads=16, vocab=2048)`` at sequence length 512.

Blocks alternate between two subclasses, :class:`EvenBlock` (0, 2, 4, ...) and :class:`OddBlock`, so that
``checkpointing(EvenBlock)`` selects every other block and ``checkpointing(Block)`` every block.

Unlike the rest of :mod:`workbench.capture`, this module imports torch when it is imported (its classes
are ``nn.Module`` subclasses); ``workbench.capture`` does not import it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Block", "EvenBlock", "OddBlock", "LM", "SmallResNet", "UNet"]


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.n1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class EvenBlock(Block):
    """Blocks 0, 2, 4...: a type of their own, so that 'every other block' can be selected by type."""


class OddBlock(Block):
    """Blocks 1, 3, 5..."""


class LM(nn.Module):
    """A small language model: embedding, ``layers`` blocks, a norm and the vocabulary head.

    ``max_seq`` adds a learned position embedding for sequences up to that length; ``head_bias=False``
    drops the head's bias (the H200 recordings of ``benchmarks/record_diagnosis_h200.py`` use both).
    """

    def __init__(self, layers: int = 4, d: int = 64, heads: int = 4, vocab: int = 128,
                 max_seq: int | None = None, head_bias: bool = True):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_seq, d) if max_seq else None
        self.blocks = nn.ModuleList([(EvenBlock if i % 2 == 0 else OddBlock)(d, heads) for i in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=head_bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# --- convolution families (the estimator's CNN and U-Net; examples/estimate_families.py builds them) -----
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


def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                         nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


class UNet(nn.Module):
    """A U-Net for segmentation: 4 down steps (two 3x3 convolutions, max-pool), a bottleneck, 4 up steps
    (2x2 transposed convolution, concatenation with the skip, two 3x3 convolutions), a 1x1 head."""

    def __init__(self, base: int = 32, depth: int = 4, c_in: int = 3, classes: int = 2):
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.downs = nn.ModuleList(_double_conv(c_in if i == 0 else widths[i - 1], widths[i]) for i in range(depth))
        self.bottleneck = _double_conv(widths[depth - 1], widths[depth])
        self.ups = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in reversed(range(depth)))
        self.up_convs = nn.ModuleList(_double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x):
        skips = []
        for down in self.downs:
            x = down(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.bottleneck(x)
        for up, conv in zip(self.ups, self.up_convs):
            x = conv(torch.cat([up(x), skips.pop()], dim=1))
        return self.head(x)
