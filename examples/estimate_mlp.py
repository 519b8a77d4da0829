"""A model file for `workbench estimate examples/estimate_mlp.py --batch-size 512 --precision bf16`."""

import torch
from torch import nn


def model():
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1000))


def batch(batch_size):
    return (torch.randn(batch_size, 1024),)


def optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)
