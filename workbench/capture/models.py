"""The transformer of the H200 measurements, defined once.

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

__all__ = ["Block", "EvenBlock", "OddBlock", "LM"]


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
