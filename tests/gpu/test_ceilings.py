"""Measured ceilings on a real GPU (run on the H200: `python -m pytest -m gpu -s tests/gpu/test_ceilings.py`).

The measured matmul and copy rates must be real rates of this device: positive, below the datasheet
peak of the matched row (a measurement above the datasheet means the timing or the FLOP count is
wrong), and ordered the way the hardware is (bf16 tensor cores > TF32 > plain fp32).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_measured_ceilings_are_below_the_datasheet_and_ordered():
    from workbench.analysis.peaks import peak_for, peak_from_ceilings
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
