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
