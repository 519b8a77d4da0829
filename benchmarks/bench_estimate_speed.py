"""How long an estimate takes, side by side with one plain fake-tensor training step of the same model (what a
fake-tensor forward and backward must cost: FakeTensorMode, no tracker, no autocast policy, no allocator
replay). Models: GPT-2 small (124M parameters, 1024 tokens) and ViT-B/16 (86M, 224 px), bf16, AdamW.

    python benchmarks/bench_estimate_speed.py          # one process; best of --repeats
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from estimate_families import DecoderLM, adamw  # noqa: E402


class ViT(nn.Module):
    """ViT-B/16: 16 px patches, 768 wide, 12 layers of 12 heads, MLP 3072, a class token."""

    def __init__(self, size=224, patch=16, d=768, layers=12, heads=12, classes=1000):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (size // patch) ** 2 + 1, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, activation="gelu", batch_first=True, norm_first=True,
                                           dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.blocks(x)[:, 0])


MODELS = {
    "gpt2_124m": (lambda: DecoderLM(d_model=768, layers=12, heads=12, vocab=50257, max_len=1024),
                  lambda bs: (torch.randint(0, 50257, (bs, 1024)),), 8),
    "vit_b16": (ViT, lambda bs: (torch.randn(bs, 3, 224, 224),), 32),
}


def plain_fake_step(build, batch, bs):
    """One forward, backward and AdamW step on fake tensors, nothing else."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = build()
    mode = FakeTensorMode()
    memo = {}
    with mode:
        for mod in model.modules():
            for kind in ("_parameters", "_buffers"):
                table = getattr(mod, kind)
                for n, t in list(table.items()):
                    if t is None:
                        continue
                    if id(t) not in memo:  # tied weights stay tied
                        data = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                        memo[id(t)] = nn.Parameter(data) if kind == "_parameters" else data
                    table[n] = memo[id(t)]
        opt = adamw(model.parameters())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(*batch(bs))
        out.float().pow(2).mean().backward()
        opt.step()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from workbench.capture.estimate import estimate

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'model':10s} {'params':>7s} {'plain fake step':>16s} {'estimate 1 step':>16s} {'estimate 2 steps':>17s}")
    for name, (build, batch, bs) in MODELS.items():
        def best(fn):
            times = []
            for _ in range(args.repeats):
                gc.collect()
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            return min(times)

        plain = best(lambda: plain_fake_step(build, batch, bs))
        one = best(lambda: estimate(build, batch, adamw, precision="bf16", batch_size=bs, steps=1))
        two = best(lambda: estimate(build, batch, adamw, precision="bf16", batch_size=bs))
        params = estimate(build, batch, adamw, precision="bf16", batch_size=bs, steps=1).meta["parameters"]
        print(f"{name:10s} {params / 1e6:6.0f}M {plain:15.2f}s {one:15.2f}s {two:16.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
