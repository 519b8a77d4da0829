"""The estimate against the real caching allocator on a CUDA device (run on the H200)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family,batch_size,precision", [
    ("mlp", 512, "fp32"),
    ("mlp", 512, "bf16"),
    ("encoder", 8, "fp32"),
    ("encoder", 8, "bf16"),
])
def test_estimate_within_10_percent_of_max_memory_allocated(family, batch_size, precision):
    from estimate_families import FAMILIES, adamw

    from workbench.capture.estimate import measure_step_memory, warm_up_cublas
    from workbench.capture.estimate import estimate

    build, batch, loss = FAMILIES[family]
    warm_up_cublas()
    est = estimate(build, batch, adamw, precision=precision, batch_size=batch_size, loss_fn=loss)
    real = measure_step_memory(build, batch, adamw, precision=precision, batch_size=batch_size, loss_fn=loss)
    err = est.peak_allocated_bytes / real["max_allocated_bytes"] - 1
    assert abs(err) <= 0.10, (
        f"{family} bs={batch_size} {precision}: estimate {est.peak_allocated_bytes} B, "
        f"real max_memory_allocated {real['max_allocated_bytes']} B ({100 * err:+.1f}%)")
    # reserved is never below allocated, in the model as on the device
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes
    assert real["max_reserved_bytes"] >= real["max_allocated_bytes"]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_calibrated_estimate_of_a_cnn_within_10_percent_reserved(precision):
    """The convolution workspaces measured in isolation (calibrate), then the whole step's peaks: the
    estimate with the table against torch's max_memory_allocated / reserved of the real step."""
    from estimate_families import FAMILIES, adamw

    from workbench.capture.cudnn_calibration import calibrate, convolution_calls
    from workbench.capture.estimate import estimate, measure_step_memory, warm_up_cublas

    build, batch, loss = FAMILIES["cnn"]
    bs = 48  # a batch no recording or rule was made at
    table = calibrate(build, batch, adamw, precision=precision, batch_size=bs, loss_fn=loss, progress=False)
    calls = convolution_calls(build, batch, adamw, precision=precision, batch_size=bs, loss_fn=loss)
    assert set(calls) <= set(table.entries), "every convolution call of the step was measured"
    assert table.meta["device"] and table.meta["cudnn"]
    warm_up_cublas()
    real = measure_step_memory(build, batch, adamw, precision=precision, batch_size=bs, loss_fn=loss)
    est = estimate(build, batch, adamw, precision=precision, batch_size=bs, loss_fn=loss, cublas_workspace_bytes=0,
                   conv_workspaces=table)
    assert est.meta["conv_workspaces"]["ruled"] == 0
    alloc = real["max_allocated_bytes"] - real["base_allocated_bytes"]
    res = real["max_reserved_bytes"] - real["base_reserved_bytes"]
    ea, er = est.peak_allocated_bytes / alloc - 1, est.peak_reserved_bytes / res - 1
    assert abs(ea) <= 0.05 and abs(er) <= 0.10, (
        f"cnn bs={bs} {precision}: allocated {100 * ea:+.1f}%, reserved {100 * er:+.1f}% "
        f"(est {est.peak_allocated_bytes} / {est.peak_reserved_bytes}, real {alloc} / {res})")


def test_estimate_cli_calibrates_and_saves_the_table(tmp_path):
    """`workbench estimate FILE --calibrate --workspaces PATH` on the GPU: the table is written, every call
    measured, and a second run reads it without measuring again."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[2]
    ws = tmp_path / "ws.json"
    cmd = [sys.executable, "-m", "workbench", "estimate", str(root / "examples" / "estimate_cnn.py"),
           "--batch-size", "16", "--json"]
    r = subprocess.run(cmd + ["--calibrate", "--workspaces", str(ws)], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads(r.stdout)["meta"]["conv_workspaces"]
    assert first["calls"] > 0 and first["measured"] == first["calls"] and first["ruled"] == 0
    table = json.loads(ws.read_text())
    assert table["format"] == "gpu-workbench/conv-workspaces/1" and table["entries"]
    r2 = subprocess.run(cmd + ["--workspaces", str(ws)], capture_output=True, text=True, cwd=root)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert json.loads(r2.stdout)["meta"]["conv_workspaces"]["measured"] == first["calls"]
