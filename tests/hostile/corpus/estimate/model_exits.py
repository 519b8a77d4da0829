import torch
def model():
    raise SystemExit(4)
def batch(n):
    return (torch.randn(n, 8),)
def optimizer(params):
    return torch.optim.SGD(params, lr=0.1)
