"""The H200 recording behind notebooks/36_flags_people_copy.ipynb (workbench/samples/results/h200_lesson36.json
and its allocator snapshot, recorded 2026-12-03 by benchmarks/record_lesson36_h200.py): every part ran, and
the facts the lesson states hold on it (prune grows a layer, 2:4 and torchao eager were slower than dense
bf16 here, empty_cache frees whole segments only, cudnn.benchmark paid per shape for no steady gain), and
the allocator model and the workbench's snapshot reader reproduce the real allocator's numbers."""

from __future__ import annotations

import gzip
import json

import pytest

from workbench.lessons import MIB, RESULTS

PATH = RESULTS / "h200_lesson36.json"
SNAP = RESULTS / "h200_lesson36_empty_cache.snapshot.pickle.gz"
PARTS = ("cudnn", "empty_cache", "prune", "torchao")
QUANT = ("int8_weight_only", "int8_dynamic", "float8_weight_only", "float8_dynamic")


@pytest.fixture(scope="module")
def rec():
    return json.loads(PATH.read_text())


def test_recorded_on_the_h200_every_part_ran(rec):
    assert rec["lesson"] == 36 and rec["smoke"] is False
    e = rec["env"]
    assert e["cuda_available"] is True and e["gpu"] == "NVIDIA H200" and e["capability"] == [9, 0]
    assert e["torch"].startswith("2.11") and e["torchao"] == "0.18.0" and e["date_utc"].startswith("2026-12-03")
    for part in PARTS:
        assert "error" not in rec[part], (part, rec[part].get("error"))
    assert rec["total_wall_s"] < rec["budget_s"]
    assert rec["empty_cache"]["snapshot"]["file"] == SNAP.name
    assert SNAP.stat().st_size == rec["empty_cache"]["snapshot"]["bytes"]


def test_no_local_paths_in_the_shipped_files():
    for text in (PATH.read_text(), gzip.decompress(SNAP.read_bytes()).decode("latin-1")):
        for marker in ("/root", "/home/", "/work/", "/tmp/", "/opt/"):
            assert marker not in text, marker


def test_prune_grows_the_layer_and_does_not_halve_the_forward(rec):
    p = rec["prune"]["prune"]
    assert p["zero_fraction"] == 0.5
    assert set(p["after_prune"]["params"]) == {"weight_orig", "bias"} and p["after_prune"]["buffers"] == ["weight_mask"]
    assert p["after_prune"]["buffer_bytes"] == 4096 * 4096 * 2  # the mask is as big as the bf16 weight
    assert p["after_prune"]["total_bytes"] == p["before"]["total_bytes"] + p["after_prune"]["buffer_bytes"]
    assert p["after_remove"]["total_bytes"] == p["before"]["total_bytes"]
    f = p["forward_median_ms"]
    assert f["pruned"] > 0.5 * f["dense"] and f["pruned"] > f["after_remove"]


def test_semi_structured_2_4_smaller_not_faster_cutlass_needs_sm8x(rec):
    s = rec["prune"]["semi_structured"]
    assert s["weight"]["zero_fraction"] == 0.5 and s["weight"]["dense_bytes"] == 8192 * 8192 * 2
    d = s["default"]
    assert d["class"] == "SparseSemiStructuredTensorCUSPARSELT"
    assert d["bytes"] / s["weight"]["dense_bytes"] == 0.5625  # half the values + 1/16 for the index
    for key in ("batch_64", "batch_8192"):
        b = d[key]
        assert b["sparse_median_ms"] > b["dense_median_ms"] and b["speedup"] < 1
        assert b["speedup"] == pytest.approx(b["dense_median_ms"] / b["sparse_median_ms"])
        assert b["max_abs_err_vs_dense"] <= 2.0 ** (int(b["max_abs_dense"]).bit_length() - 1 - 7)  # one bf16 step
        assert "compute capability 8.x" in s["cutlass"][key]["error"]


def test_empty_cache_releases_whole_segments_only(rec):
    e = rec["empty_cache"]
    b, a = e["before"], e["after"]
    assert a["allocated_bytes"] == b["allocated_bytes"] == 256 * MIB
    assert (b["reserved_bytes"], a["reserved_bytes"]) == (768 * MIB, 512 * MIB)
    assert (b["segments"], b["whole_free_segments"], a["segments"], a["whole_free_segments"]) == (5, 4, 1, 0)
    assert a["free_in_reserved_bytes"] == 32 * 8 * MIB and a["free_blocks"] == 32  # the holes in the live segment
    assert (b["largest_free_block_bytes"], a["largest_free_block_bytes"]) == (64 * MIB, 8 * MIB)
    assert a["external_fragmentation"] > b["external_fragmentation"]
    assert a["num_device_free"] - b["num_device_free"] == 4


def test_empty_cache_between_steps_costs_mallocs_and_time_lowers_no_peak(rec):
    m = rec["empty_cache"]["steps"]["modes"]
    keep, empty = m["keep_cache"], m["empty_cache_between_steps"]
    assert keep["device_allocs"] == 0 and empty["device_allocs"] > rec["empty_cache"]["steps"]["steps"]
    assert empty["step_median_ms"] > keep["step_median_ms"] and empty["empty_cache_median_ms"] > 0
    assert empty["max_memory_allocated_bytes"] == keep["max_memory_allocated_bytes"]
    assert empty["max_memory_reserved_bytes"] > keep["max_memory_reserved_bytes"]


def test_allocator_model_and_snapshot_reader_reproduce_the_h200():
    from workbench.analysis.memory.allocator_model import CachingAllocatorModel
    from workbench.analysis.memory.segments import allocator_state
    from workbench.analysis.memory.allocations import allocations, device_events
    from workbench.io.snapshot import load_snapshot

    rec = json.loads(PATH.read_text())["empty_cache"]
    m = CachingAllocatorModel()
    m.free(m.malloc(512 * MIB))
    pieces = [m.malloc(8 * MIB) for _ in range(64)]
    for h in pieces[::2]:
        m.free(h)
    for h in [m.malloc(64 * MIB) for _ in range(4)]:
        m.free(h)
    model = {"before": (m.reserved_bytes, m.allocated_bytes, m.largest_free_block(), m.segment_count)}
    m.empty_cache()
    model["after"] = (m.reserved_bytes, m.allocated_bytes, m.largest_free_block(), m.segment_count)

    snap = load_snapshot(SNAP)
    allocs = allocations(snap)
    actions = device_events(snap)["action"].astype(str).tolist()
    first = actions.index("segment_free")
    assert actions.count("segment_free") == 4 and all(a in ("segment_free", "snapshot") for a in actions[first:])
    states = {"before": allocator_state(snap, allocs, first - 1), "after": allocator_state(snap, allocs)}
    for when, s in states.items():
        live = rec[when]
        real = (live["reserved_bytes"], live["allocated_bytes"], live["largest_free_block_bytes"], live["segments"])
        assert (s.reserved_bytes, s.allocated_bytes, s.largest_free_block_bytes, s.segments) == real, when
        assert model[when] == real, when
        assert s.free_blocks == live["free_blocks"]


def test_cudnn_benchmark_pays_per_shape_no_steady_gain(rec):
    on, off = rec["cudnn"]["benchmark_True"], rec["cudnn"]["benchmark_False"]
    for r, flag in ((on, True), (off, False)):
        assert r["benchmark"] is flag and r["device"] == "cuda"
        assert len(r["variable"]["first_visit_wall_ms"]) == len(r["variable"]["sizes"]) == 10
        assert len(r["fixed"]["steady_ms"]) == 30
    assert on["fixed"]["steady_median_ms"] >= off["fixed"]["steady_median_ms"]
    assert on["fixed"]["first_calls_wall_ms"][0] > off["fixed"]["first_calls_wall_ms"][0] + 1000
    assert 500 < on["variable"]["first_visit_median_ms"] < 2000
    assert on["variable"]["first_visit_median_ms"] > 10 * on["variable"]["revisit_median_ms"]
    assert on["variable"]["first_visit_median_ms"] > 10 * off["variable"]["first_visit_median_ms"]
    assert on["variable"]["total_wall_ms"] > 10 * off["variable"]["total_wall_ms"]
    # every size's first visit costs more with autotuning than without
    for size, visits in on["variable"]["per_size_wall_ms"].items():
        assert visits[0] > 10 * off["variable"]["per_size_wall_ms"][size][0], size


def test_torchao_eager_halves_weights_and_is_slower_than_bf16(rec):
    t = rec["torchao"]
    base = t["bf16"]
    for name in QUANT:
        q = t[name]
        assert t["probed"][name] == [q["api"]]
        assert q["weight_bytes"] < 0.51 * base["weight_bytes"]
        for m in (16, 4096):
            assert q[f"batch_{m}_median_ms"] > base[f"batch_{m}_median_ms"], (name, m)
    assert t["int8_weight_only"]["weight_class"] == t["int8_dynamic"]["weight_class"] == "Int8Tensor"
    assert t["float8_weight_only"]["weight_class"] == t["float8_dynamic"]["weight_class"] == "Float8Tensor"
    assert round(t["int8_dynamic"]["batch_4096_median_ms"] / base["batch_4096_median_ms"]) == 10
    errs = [t[n]["batch_4096_rel_l2_err"] for n in QUANT]
    assert errs == sorted(errs) and errs[-1] < 0.1
