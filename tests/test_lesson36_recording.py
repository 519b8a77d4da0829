"""The H200 recording behind notebooks/36_flags_people_copy.ipynb: its structure, and the relations the
lesson states (prune grows a layer, empty_cache frees whole segments only, cudnn.benchmark autotunes)."""

from __future__ import annotations

import json

import pytest

from workbench.lessons import RESULTS

PATH = RESULTS / "h200_lesson36.json"
pytestmark = pytest.mark.skipif(not PATH.exists(), reason="h200_lesson36.json not recorded yet")


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_recorded_on_a_gpu_not_smoke(rec):
    assert rec["lesson"] == 36 and rec["smoke"] is False
    assert rec["env"]["cuda_available"] is True and "H200" in rec["env"]["gpu"]
    assert "/home/" not in PATH.read_text() and "/tmp/" not in PATH.read_text()


def test_prune_grows_the_layer(rec):
    p = rec["prune"]["prune"]
    assert p["zero_fraction"] == pytest.approx(0.5, abs=1e-3)
    assert set(p["after_prune"]["params"]) == {"weight_orig", "bias"} and p["after_prune"]["buffers"] == ["weight_mask"]
    assert p["after_prune"]["total_bytes"] > 1.9 * p["before"]["total_bytes"]
    assert p["after_remove"]["total_bytes"] == p["before"]["total_bytes"]


def test_empty_cache_releases_whole_segments_only(rec):
    e = rec["empty_cache"]
    b, a = e["before"], e["after"]
    assert a["allocated_bytes"] == b["allocated_bytes"]
    assert a["reserved_bytes"] < b["reserved_bytes"]
    assert a["whole_free_segments"] == 0 and b["whole_free_segments"] >= 1
    assert a["free_in_reserved_bytes"] > 0  # holes inside the live segment stay
    assert a["largest_free_block_bytes"] <= b["largest_free_block_bytes"]
    modes = e["steps"]["modes"]
    keep, empty = modes["keep_cache"], modes["empty_cache_between_steps"]
    # the next step's peak allocated memory is the same: empty_cache lowers no peak
    assert empty["max_memory_allocated_bytes"] == keep["max_memory_allocated_bytes"]


def test_cudnn_parts_structure(rec):
    for flag in ("False", "True"):
        r = rec["cudnn"][f"benchmark_{flag}"]
        assert "error" not in r, r.get("error")
        assert r["benchmark"] is (flag == "True")
        assert len(r["variable"]["first_visit_wall_ms"]) == len(r["variable"]["sizes"]) == 10
        assert r["fixed"]["steady_median_ms"] > 0
    on = rec["cudnn"]["benchmark_True"]
    # autotuning: a shape's first visit costs more than its later visits
    assert on["variable"]["first_visit_median_ms"] > on["variable"]["revisit_median_ms"]
