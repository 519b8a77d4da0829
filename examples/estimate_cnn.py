"""A model file for `workbench estimate examples/estimate_cnn.py --batch-size 32` (a small ResNet on 64 px
images): on a CUDA machine, `--calibrate --workspaces cnn_ws.json` first measures each convolution's cuDNN
workspace, and the estimate uses them (fp32 convolutions' workspaces follow no rule on shapes)."""

import torch
from torch import nn


def _block(c_in, c_out, stride):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(), nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())


def model():
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         _block(64, 64, 1), _block(64, 128, 2), _block(128, 256, 2), _block(256, 512, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


def batch(batch_size):
    return (torch.randn(batch_size, 3, 64, 64),)


def optimizer(parameters):
    return torch.optim.AdamW(parameters, lr=1e-3)
