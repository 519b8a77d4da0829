"""Measured ceilings on a real GPU (run on the H200: `python -m pytest -m gpu -s tests/gpu/test_ceilings.py`).

The measured matmul and copy rates must be real rates of this device: positive, below the datasheet
peak of the matched row (a measurement above the datasheet means the timing or the FLOP count is
wrong), and ordered the way the hardware is (bf16 tensor cores > TF32 > plain fp32).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_measured_ceilings_are_below_the_datasheet_and_ordered():
    from workbench.analysis.trace.peaks import peak_for, peak_from_ceilings
    from workbench.capture.ceilings import measure_ceilings

    c = measure_ceilings(sizes=(4096,), copy_mib=256, repeats=5)
    print(c["matmul"], c["copy"], c.get("fraction_of_datasheet"))
    m = {k: v["tflops"] for k, v in c["matmul"].items()}
    assert all(v > 0 for v in m.values())
    assert m["bf16"] > m["tf32"] > m["fp32"], m
    assert c["copy"]["gbps"] > c["h2d_pinned"]["gbps"] > 0
    sheet = peak_for(c["device"])
    if sheet is None:
        pytest.skip(f"no datasheet row for {c['device']!r}")
    for dtype, tflops in m.items():
        assert tflops <= 1.05 * sheet.tflops[dtype], (dtype, tflops, sheet.tflops[dtype])
    assert c["copy"]["gbps"] <= 1.05 * sheet.gbps
    # on a datacenter GPU a large bf16 GEMM reaches a good part of the datasheet
    assert m["bf16"] >= 0.3 * sheet.tflops["bf16"]
    measured = peak_from_ceilings(c)
    assert measured.source == "measured" and measured.tflops["bf16"] == m["bf16"]


def test_roofline_of_a_live_trace_matches_the_known_flops_and_the_ceilings(tmp_path):
    """A step with known FLOPs (4 bf16 4096^3 matmuls, a causal bf16 SDPA forward+backward), profiled with
    shapes: the roofline counts exactly those model FLOPs, and the GEMM kernel's TFLOP/s is below the
    datasheet and close to what the same matmul measures without the profiler."""
    import torch

    from workbench.analysis.trace.peaks import peak_for
    from workbench.analysis.trace.roofline import roofline
    from workbench.capture.ceilings import measure_ceilings
    from workbench.capture.profiler import profile_steps
    from workbench.io import load_trace

    n, shape = 4096, (4, 8, 1024, 64)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def step():
        for _ in range(4):
            torch.mm(a, b)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(torch.ones_like(o))

    r = profile_steps(step, steps=3, detail="standard", out_dir=tmp_path, verbose=False, progress=False)
    rl = roofline(load_trace(r.path))
    bb, h, t, d = shape
    expected = 4 * 2.0 * n ** 3 + 3 * 4.0 * bb * h * t * t * d / 2
    print(rl.as_dict())
    assert rl.step["model_flops"] == pytest.approx(expected, rel=1e-6)
    gemm = rl.kernels[(rl.kernels["kind"] == "gemm")].iloc[0]
    sheet = peak_for(torch.cuda.get_device_name())
    measured = measure_ceilings(dtypes=("bf16",), sizes=(n,), copy_mib=64, repeats=5)["matmul"]["bf16"]["tflops"]
    if sheet is not None:
        assert gemm["tflops"] <= 1.05 * sheet.tflops["bf16"]
    assert gemm["tflops"] == pytest.approx(measured, rel=0.2)
