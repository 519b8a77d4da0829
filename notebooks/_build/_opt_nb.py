"""Helpers shared by the optimization notebook builders (30-34): cells, the setup cell, the model.

A builder lists cells as ``md(...)`` / ``code(...)`` and calls ``write(name, cells)``; then the notebook
is executed in place with nbconvert::

    OMP_NUM_THREADS=1 KINETO_LOG_LEVEL=6 TORCH_CPP_LOG_LEVEL=ERROR .venv/bin/jupyter nbconvert --to notebook \
        --execute --inplace --ExecutePreprocessor.store_widget_state=False \
        --ExecutePreprocessor.timeout=120 notebooks/3N_name.ipynb
"""

from __future__ import annotations


from _nbkit import NOTEBOOKS, code, execute, md, write  # noqa: F401  (re-exported to the builders)


SETUP = '''\
# Setup: choose the data source, seed everything, keep the CPU quiet.
import os, random, warnings
os.environ.setdefault("KINETO_LOG_LEVEL", "6")        # before torch: no profiler chatter on stderr
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
from pathlib import Path
import numpy as np
import pandas as pd
import torch
from workbench import samples

GPU = torch.cuda.is_available()
random.seed(0); np.random.seed(0); torch.manual_seed(0)
if not GPU:
    torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=UserWarning)
pd.set_option("display.width", 160, "display.max_colwidth", 60, "display.precision", 4)
GIB, MIB = 2**30, 2**20
RESULTS = Path(samples.__file__).parent / "results"     # small JSON results recorded on the H200
print("mode:", "live CUDA capture on " + torch.cuda.get_device_name(0) if GPU
      else "recorded H200 samples (no CUDA device here); CPU runs for what a CPU can show")
'''

# The transformer family of the H200 measurements (pre-norm blocks, causal SDPA attention, GELU MLP),
# with the sizes as arguments: the H200 runs used layers=12, d=1024, heads=16, seq 512, vocab 2048.
MODEL = '''\
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.n1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
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
    """A small language model: embedding, `layers` blocks, a norm and the vocabulary head."""

    def __init__(self, layers=4, d=64, heads=4, vocab=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([(EvenBlock if i % 2 == 0 else OddBlock)(d, heads) for i in range(layers)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
'''
