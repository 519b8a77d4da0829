"""The recordings lessons 16 (roofline and MFU) and 18 (feeding the GPU) read ship in the package and are the
test data's recordings: byte-for-byte copies, except the two GPT traces, which are the same JSON without
whitespace (workbench/samples/README.md says why)."""

from __future__ import annotations

import gzip
import json

import pytest
from testdata import DATA

from workbench import samples
from workbench.lessons import RESULTS

VERBATIM = {
    "h200_gemm_sdpa": DATA / "h200_ceilings" / "gemm_sdpa.standard.trace.json.gz",
    "h200_loader_workers0": DATA / "h200_pairs" / "loader" / "workers0.light.trace.json.gz",
    "h200_loader_workers8_pinned": DATA / "h200_pairs" / "loader" / "workers8_pinned.light.trace.json.gz",
    "cpu_loader_workers0": DATA / "cpu_pairs" / "workers0.light.trace.json.gz",
    "cpu_loader_workers2": DATA / "cpu_pairs" / "workers2.light.trace.json.gz",
}


@pytest.mark.parametrize("name", sorted(VERBATIM))
def test_shipped_traces_are_the_recordings(name):
    assert samples.path(name).read_bytes() == VERBATIM[name].read_bytes()


@pytest.mark.parametrize("variant", ["fp32", "tf32", "bf16"])
def test_the_gpt_traces_decode_to_the_recordings(variant):
    shipped = samples.path(f"h200_gpt_{variant}")
    recorded = DATA / "h200_pairs" / "gpt" / f"{variant}.standard.trace.json.gz"
    assert shipped.stat().st_size < recorded.stat().st_size
    assert json.loads(gzip.decompress(shipped.read_bytes())) == json.loads(gzip.decompress(recorded.read_bytes()))


def test_the_shipped_json_results_are_the_recordings():
    assert (RESULTS / "h200_ceilings.json").read_bytes() == (DATA / "h200_ceilings" / "ceilings.json").read_bytes()
    assert (RESULTS / "cpu_loader_pairs.json").read_bytes() == (DATA / "cpu_pairs" / "truth.json").read_bytes()
    ceilings = json.loads((RESULTS / "h200_ceilings.json").read_text())
    assert samples.path("h200_gemm_sdpa").name == ceilings["gemm_sdpa"]["file"]
