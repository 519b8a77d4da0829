"""Module paths on memory: module_scopes marks each submodule's forward; a profile_memory=True profile
taken meanwhile carries the path on every allocation made inside it (real torch on the CPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from workbench.analysis.memory.allocations import allocations, group_live, user_frame_labels  # noqa: E402
from workbench.capture.modules import module_scopes  # noqa: E402
from workbench.capture.profiler import profile_steps  # noqa: E402
from workbench.io.profiler_memory import load_profiler_memory  # noqa: E402

BATCH, D, HIDDEN = 32, 64, 256


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(D), MLP()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _profiled(tmp_path):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(BATCH, D)

    def step():
        model(x).sum().backward()

    with module_scopes(model) as n:
        result = profile_steps(step, steps=1, detail="full", out_dir=tmp_path, verbose=False, progress=False)
    return model, n, load_profiler_memory(result.path, device="cpu")


def test_allocations_carry_the_module_path_they_were_made_in(tmp_path):
    model, n, snap = _profiled(tmp_path)
    assert n == len(list(model.named_modules())) - 1  # every submodule, not the root
    labels = user_frame_labels(snap)["module"]
    allocs = allocations(snap)
    by = group_live(allocs.assign(category="x"), {"module": labels}, by="module")
    for i in range(3):
        up = by[by["module"] == f"blocks.{i}.mlp.up"]
        # the Linear's output: batch x hidden float32, made inside blocks.i.mlp.up
        assert len(up) == 1 and int(up["bytes"].iloc[0]) == BATCH * HIDDEN * 4
        assert f"blocks.{i}.mlp.down" in set(by["module"]) and f"blocks.{i}.norm" in set(by["module"])
        # relu's output is made in the MLP's own forward, between its two Linears
        mlp = by[by["module"] == f"blocks.{i}.mlp"]
        assert int(mlp["bytes"].iloc[0]) == BATCH * HIDDEN * 4
    # backward runs in autograd's engine, outside the forward hooks
    assert "(no module)" in set(by["module"])
    # the hooks are gone after the block
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_a_forward_that_raises_leaves_no_range_open():
    model = Net()
    with pytest.raises(RuntimeError):
        with module_scopes(model):
            model(torch.randn(2, D + 1))  # wrong width: the first LayerNorm raises
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    with torch.profiler.profile() as prof:
        model(torch.randn(2, D))
    assert not any(e.name.startswith("module: ") for e in prof.events())


def test_memory_panel_from_step_offers_stacking_by_module(tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.capture.memory import cuda_available
    from workbench.panels.memory import MemoryPanel

    if cuda_available():
        pytest.skip("the CUDA allocator history records frames, not module ranges")
    torch.manual_seed(0)
    model, x = Net(), torch.randn(BATCH, D)
    p = MemoryPanel.from_step(lambda: model(x).sum().backward(), steps=1, model=model, out_dir=tmp_path)
    assert p.last_error is None and "module" in [v for _, v in p.groupby.options]
    p.groupby.value = "module"
    assert p.last_error is None
    names = {t.name for t in p.timeline.fig.data}
    assert any(str(n).startswith("blocks.") for n in names), names
