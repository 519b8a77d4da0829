import torch
def model():
    return 1 / 0
def batch(n):
    return (torch.randn(n, 8),)
def optimizer(params):
    return torch.optim.SGD(params, lr=0.1)
