"""`workbench estimate` CLI, the estimate figures and EstimatePanel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "estimate_mlp.py"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", "estimate", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_json_has_the_contract_keys():
    r = _cli(MODEL, "--batch-size", "16", "--precision", "bf16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["peak_reserved_bytes"] >= out["peak_allocated_bytes"] > 0
    assert set(out["by_category"]) >= {"parameters", "gradients", "optimizer_state", "activations", "temporaries"}
    assert out["meta"]["precision"] == "bf16" and out["meta"]["batch_size"] == 16
    params = (1024 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1000 + 1000)
    assert out["meta"]["parameters"] == params


def test_cli_bad_files_give_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def model(:\n")
    missing = tmp_path / "missing.py"
    missing.write_text("def model():\n    return None\n")
    for path, words in ((bad, "syntax error"), (missing, "batch()"), (tmp_path / "nope.py", "no such file")):
        r = _cli(path)
        assert r.returncode == 2
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and words in lines[0], r.stderr


def test_figures_carry_the_estimate():
    import torch

    from workbench.analysis.memory.estimate import estimate_table
    from workbench.capture.estimate import estimate
    from workbench.figures.estimate import configurations_figure, estimate_category_figure, estimate_timeline_figure

    e = estimate(lambda: torch.nn.Linear(512, 512), lambda bs: (torch.randn(bs, 512),),
                 lambda p: torch.optim.AdamW(p), batch_size=8)
    fig = estimate_timeline_figure(e)
    assert [t.name for t in fig.data] == ["allocated", "reserved", "tensor bytes"]
    assert max(fig.data[0].y) == pytest.approx(e.peak_allocated_bytes / 2**30)
    assert max(fig.data[1].y) == pytest.approx(e.peak_reserved_bytes / 2**30)
    cat = estimate_category_figure(e)
    assert sum(t.x[0] for t in cat.data) == pytest.approx(e.peak_allocated_bytes / 2**30)
    conf = configurations_figure(estimate_table([e]), budget_bytes=2**30)
    assert list(conf.data[0].y) == [e.peak_allocated_bytes / 2**30]


def test_panel_updates_when_a_control_changes():
    pytest.importorskip("ipywidgets")
    import torch

    from workbench.panels.estimate import EstimatePanel

    def model():
        return torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 1000))

    def batch(bs, seq):
        return (torch.randint(0, 1000, (bs, seq)),)

    p = EstimatePanel.from_factories(model, batch, lambda ps: torch.optim.AdamW(ps), batch_size=4, seq_len=64,
                                     budget_gib=1.0)
    assert p.last_error is None, p.last_error
    first = p.estimate.peak_allocated_bytes
    assert "fits" in p.summary.value
    p.batch.value = 64
    assert p.estimate.peak_allocated_bytes > first
    y_before = max(p.timeline.data[0].y)
    p.seq.value = 256
    assert max(p.timeline.data[0].y) > y_before
    p.precision.value = "bf16"
    assert p.estimate.meta["precision"] == "bf16"
    p.budget.value = 0.01
    assert "does not fit" in p.summary.value
    assert "wb-estimate-batch" in p.batch._dom_classes and "wb-estimate" in p._dom_classes


def test_category_figure_legend_fits_below_the_bar_with_category_colours():
    import torch

    from workbench.capture.estimate import estimate
    from workbench.figures._style import LEGEND_GAP_PX
    from workbench.figures.estimate import estimate_category_figure
    from workbench.figures.memory import CATEGORY_COLORS

    e = estimate(lambda: torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)),
                 lambda bs: (torch.randn(bs, 256),), lambda p: torch.optim.AdamW(p), batch_size=16)
    fig = estimate_category_figure(e)
    n = len(fig.data)
    assert n >= 4
    leg = fig.layout.legend
    # horizontal, under the axis title; the bottom margin holds all its rows (a vertical legend in a
    # 260 px figure scrolled, hiding categories)
    assert leg.orientation == "h" and leg.yanchor == "top"
    m = fig.layout.margin
    assert -leg.y * (fig.layout.height - m.t - m.b) == pytest.approx(LEGEND_GAP_PX)
    assert m.b >= LEGEND_GAP_PX + 22 * -(-n // 4)
    colours = [t.marker.color for t in fig.data]
    assert len(set(colours)) == n
    for t in fig.data:
        cat = t.name.rsplit(" ", 1)[0]
        if cat in CATEGORY_COLORS:
            assert t.marker.color == CATEGORY_COLORS[cat]  # same colour as in the memory panel
        assert t.name.endswith("%")


def test_cli_reads_the_long_spelling_of_a_precision():
    runs = [_cli(MODEL, "--batch-size", 4, "--precision", p, "--json") for p in ("bfloat16", "bf16")]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    long, short = (json.loads(r.stdout) for r in runs)
    assert long["meta"]["precision"] == "bf16" and long == short


def test_panel_on_a_model_file_and_from_factories_agree():
    pytest.importorskip("ipywidgets")
    import runpy

    from workbench import EstimatePanel, estimate
    from workbench.errors import WorkbenchError

    p = EstimatePanel(str(MODEL), batch_size=16, max_batch_size=1024)
    assert p.last_error is None, p.last_error
    ns = runpy.run_path(str(MODEL))
    ref = estimate(ns["model"], ns["batch"], ns["optimizer"], batch_size=16)
    assert p.estimate.peak_allocated_bytes == ref.peak_allocated_bytes
    assert p.seq.layout.display == "none"  # batch(batch_size) takes no sequence length
    q = EstimatePanel.from_factories(ns["model"], ns["batch"], ns["optimizer"], batch_size=16, max_batch_size=1024)
    assert q.estimate.peak_reserved_bytes == p.estimate.peak_reserved_bytes
    with pytest.raises(WorkbenchError, match=r"is a Kineto trace, not what EstimatePanel shows.*ProfilerPanel"):
        EstimatePanel(ROOT / "workbench" / "samples" / "h200_train_step.trace.json.gz")
    with pytest.raises(WorkbenchError, match=r"nope\.py: no such file\. EstimatePanel takes a Workload.*a model file"):
        EstimatePanel(ROOT / "nope.py")
    with pytest.raises(WorkbenchError, match=r"EstimatePanel\.from_factories\(model_fn, inputs_fn, optimizer_fn\)"):
        EstimatePanel(ns["model"])


def test_a_bad_precision_gets_the_same_one_line_in_every_entry_point():
    import torch

    from workbench.capture.configurations import Configuration, Workload, check_precision, fp32
    from workbench.capture.estimate import estimate, largest_batch_that_fits, measure_step_memory, step_description
    from workbench.errors import BadArgument

    with pytest.raises(BadArgument) as first:
        check_precision("fp8")
    message = str(first.value)
    assert "'fp8'" in message and "fp32, tf32, bf16, fp16" in message and "\n" not in message

    def model():
        return torch.nn.Linear(8, 8)

    def inputs(bs):
        return (torch.randn(bs, 8),)

    work = Workload(model=model, batch=lambda n, dev: torch.randn(n, 8), loss=lambda m, x: m(x).sum())
    calls = {
        "Configuration": lambda: Configuration("x", precision="fp8"),
        "Configuration.replace": lambda: fp32().replace(precision="fp8"),
        "estimate(factories)": lambda: estimate(model, inputs, precision="fp8", batch_size=2),
        "estimate(workload)": lambda: estimate(work, fp32(), precision="fp8", batch_size=2),
        "step_description": lambda: step_description(model, inputs, precision="fp8"),
        "largest_batch_that_fits": lambda: largest_batch_that_fits(model, inputs, budget_bytes=2**30, precision="fp8"),
        "measure_step_memory": lambda: measure_step_memory(model, inputs, precision="fp8"),  # before the device
    }
    try:
        import ipywidgets  # noqa: F401

        from workbench.panels.estimate import EstimatePanel

        calls["EstimatePanel"] = lambda: EstimatePanel(work, precision="fp8")
        calls["EstimatePanel.from_factories"] = lambda: EstimatePanel.from_factories(model, inputs, precision="fp8")
    except ImportError:
        pass
    for name, call in calls.items():
        with pytest.raises(BadArgument) as ei:
            call()
        assert str(ei.value) == message, name
    r = _cli(MODEL, "--precision", "fp8")
    assert r.returncode == 2 and r.stderr.strip() == f"workbench estimate: error: {message}", r.stderr


def test_panel_takes_a_workload_and_a_configuration():
    pytest.importorskip("ipywidgets")
    import torch

    from workbench.capture.configurations import Workload, amp_bf16, checkpointing, combine
    from workbench.capture.estimate import estimate
    from workbench.panels.estimate import EstimatePanel

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    work = Workload(model=lambda: torch.nn.Sequential(Block(), Block()), batch=lambda n, dev: torch.randn(n, 64),
                    loss=lambda m, x: m(x).square().mean(), batch_size=16)
    config = combine(amp_bf16(), checkpointing(Block))
    p = EstimatePanel(work, config, budget_gib=1.0)
    assert p.last_error is None, p.last_error
    # the controls start at the configuration's precision and checkpointing, the workload's batch size
    assert (p.precision.value, p.checkpointing.value, p.batch.value) == ("bf16", True, 16)
    assert p.seq.layout.display == "none"
    assert p.estimate.peak_allocated_bytes == estimate(work, config, batch_size=16).peak_allocated_bytes
    p.precision.value = "fp32"  # the control replaces the configuration's precision (no autocast at fp32)
    assert p.estimate.meta["precision"] == "fp32"
    p.checkpointing.value = False
    p.precision.value = "bf16"  # bf16 from the control: autocast bf16, as amp_bf16
    assert p.estimate.peak_allocated_bytes == estimate(work, amp_bf16(), batch_size=16).peak_allocated_bytes
    # a panel that shows recordings, given a Workload, names the two that take one
    from workbench.errors import WorkbenchError
    from workbench.panels.compare import ComparePanel

    with pytest.raises(WorkbenchError, match=r"is a Workload.*ComparePanel\.from_experiment\(workload, configurations\)"):
        ComparePanel(work)
