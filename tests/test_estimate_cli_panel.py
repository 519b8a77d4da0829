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

    from workbench.analysis.estimate import estimate_table
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

    p = EstimatePanel(model, batch, lambda ps: torch.optim.AdamW(ps), batch_size=4, seq_len=64, budget_gib=1.0)
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


def test_panel_on_a_model_file_and_from_step_agree():
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
    q = EstimatePanel.from_step(ns["model"], ns["batch"], ns["optimizer"], batch_size=16, max_batch_size=1024)
    assert q.estimate.peak_reserved_bytes == p.estimate.peak_reserved_bytes
    with pytest.raises(WorkbenchError, match=r"is a Kineto trace, not what EstimatePanel shows.*ProfilerPanel"):
        EstimatePanel(ROOT / "workbench" / "samples" / "h200_train_step.trace.json.gz")
    with pytest.raises(WorkbenchError, match=r"nope\.py: no such file\. EstimatePanel takes a model file"):
        EstimatePanel(ROOT / "nope.py")
    with pytest.raises(WorkbenchError, match="inputs_fn is missing"):
        EstimatePanel(ns["model"])
