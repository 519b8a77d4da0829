"""A decoder-only language model file for the CLI:

    workbench estimate examples/estimate_gpt.py --batch-size 16 --precision bf16 --json
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from estimate_families import DecoderLM, lm_loss  # noqa: E402


def model():
    return DecoderLM(d_model=1024, layers=12, heads=16)


def batch(batch_size, seq_len=1024):
    return (torch.randint(0, 32000, (batch_size, seq_len)),)


def optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=3e-4)


def loss(logits):
    return lm_loss(logits)
