"""The model of the memory what-if recordings (benchmarks/record_oom_whatif_h200.py).

A small GPT-style decoder LM: token + position embedding, ``blocks`` (an ``nn.ModuleList`` of identical
pre-norm blocks: LayerNorm, causal self-attention (``scaled_dot_product_attention``), LayerNorm, a 4x MLP
with GELU), a final LayerNorm and an untied LM head. The blocks are real submodules so the allocator's
python frames and the forward hooks name them (``blocks.3``). ``forward(tokens, checkpoint=True)`` runs
every block under ``torch.utils.checkpoint`` (non-reentrant).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint as _checkpoint


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class WhatIfLM(nn.Module):
    """Decoder-only LM; ``blocks`` is the ``nn.ModuleList`` of :class:`Block`."""

    def __init__(self, d_model: int = 1024, layers: int = 8, heads: int = 16, vocab: int = 8192, max_len: int = 1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, checkpoint: bool = False):
        t = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for blk in self.blocks:
            x = _checkpoint(blk, x, use_reentrant=False) if checkpoint and torch.is_grad_enabled() else blk(x)
        return self.head(self.norm(x))


def lm_loss(logits, tokens):
    """Next-token cross-entropy (fp32 logits, as autocast would give the loss)."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
