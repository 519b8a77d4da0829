"""One clock for a trace, an allocator snapshot and NVML/GPM samples (workbench.analysis.timeline), the
`workbench timeline` command, the figure and TimelinePanel, on a real H200 recording of one run
(tests/data/h200_pairs/three_artifacts: profiler trace, allocator history and NVML+GPM rows with time_ns;
truth.json holds the recorder's own time.time_ns() marks around each phase)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testdata import data_path

from workbench import samples
from workbench.analysis.timeline import activity_by_annotation, align, kernel_segments, timeline_summary
from workbench.io import load_nvml_session, load_snapshot, load_trace

ROOT = Path(__file__).resolve().parent.parent
RUN = data_path("h200_pairs/three_artifacts")
TRACE, SNAP, GPM = RUN / "three.trace.json.gz", RUN / "three.snapshot.pickle.gz", RUN / "three.gpm.jsonl.gz"
TRUTH = json.loads((RUN / "truth.json").read_text())


@pytest.fixture(scope="module")
def raw_trace():
    with gzip.open(TRACE, "rt") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tl():
    return align(load_trace(TRACE), load_snapshot(SNAP), load_nvml_session(GPM))


def _unix_ranges(raw, pred):
    """(name, start_ns, end_ns) of the raw trace's X events matching pred, on Unix time computed here."""
    base = int(raw["baseTimeNanoseconds"])
    out = []
    for e in raw["traceEvents"]:
        if e.get("ph") == "X" and pred(e):
            s = base + round(float(e["ts"]) * 1000)
            out.append((e["name"], s, s + round(float(e.get("dur", 0)) * 1000)))
    return out


def test_all_three_files_are_put_on_unix_time(tl):
    doc = timeline_summary(tl)
    assert doc["clock"] == "unix_ns"
    assert {s["kind"]: (s["method"], s["aligned"]) for s in doc["sources"]} == {
        "trace": ("baseTimeNanoseconds", True), "memory": ("time_us", True), "nvml": ("time_ns", True)}
    assert doc["notes"] == []
    # the recording's own date (truth.json: 2026-12-02 23:37 UTC)
    assert abs(doc["origin_ns"] - TRUTH["marks"][0]["start_ns"]) < 5e9


def test_allocator_peak_falls_inside_the_step_that_caused_it(tl, raw_trace):
    doc = timeline_summary(tl)
    steps = _unix_ranges(raw_trace, lambda e: e.get("cat") == "user_annotation" and e["name"].startswith("train_step#"))
    assert len(steps) == 8
    # the peak straight from the snapshot's events (allocated bytes = running sum of alloc - free_completed)
    with gzip.open(SNAP, "rb") as f:
        import pickle  # the test's own data file: a plain snapshot dict

        snap = pickle.load(f)
    ev = [e for t in snap["device_traces"] for e in t]
    live = {}
    total, best, best_t = 0, -1, None
    start = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    for e in ev:  # blocks allocated before the history began are in no alloc event: they only shift the sum
        if e["action"] == "alloc":
            total += e["size"]
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            total -= live.pop(e["addr"], e["size"])
        if total > best:
            best, best_t = total, e["time_us"] * 1000
    assert start > 0
    holding = [name for name, s, e in steps if s <= best_t <= e]
    assert len(holding) == 1, (best_t, steps)
    assert doc["memory"]["peak_annotation"] == holding[0]
    assert doc["memory"]["peak_time_ns"] == best_t
    assert doc["memory"]["peak_bytes"] <= TRUTH["peak_allocated_bytes"]   # max_memory_allocated() saw the run


def test_trace_snapshot_and_nvml_clocks_agree_to_a_millisecond(tl, raw_trace):
    # the snapshot's segment allocations sit on the trace's cudaMalloc calls
    mallocs = _unix_ranges(raw_trace, lambda e: e["name"] == "cudaMalloc")
    span = (min(s for _, s, _ in mallocs), max(e for _, _, e in mallocs))
    seg = tl.memory  # placed by the clock module
    with gzip.open(SNAP, "rb") as f:
        import pickle

        snap = pickle.load(f)
    seg_ns = [e["time_us"] * 1000 for t in snap["device_traces"] for e in t if e["action"] == "segment_alloc"]
    inside = [t for t in seg_ns if span[0] - 1e6 <= t <= span[1] + 1e6]  # those made while the profiler ran
    assert len(inside) >= 10
    gaps = [min(max(0, s - t, t - e) for _, s, e in mallocs) for t in inside]
    assert max(gaps) < 1e6, gaps       # every one within 1 ms of a cudaMalloc call
    all_ns = [e["time_us"] * 1000 for t in snap["device_traces"] for e in t]
    assert seg is not None and int(seg["time_ns"].min()) == min(all_ns)   # the snapshot's own Unix µs, kept
    # the recorder's time.time_ns() marks against the trace's record_function ranges of each phase
    phases = {n.removeprefix("phase:"): (s, e) for n, s, e in _unix_ranges(
        raw_trace, lambda e: e.get("cat") == "user_annotation" and e["name"].startswith("phase:"))}
    for m in TRUTH["marks"]:
        s, e = phases[m["phase"]]
        assert abs(s - m["start_ns"]) < 2e6 and abs(e - m["end_ns"]) < 2e6, (m, s, e)
    # NVML rows carry the same time.time_ns() clock: rows labelled with a phase lie inside its marks
    rows = [json.loads(line) for line in gzip.open(GPM, "rt")]
    marks = {m["phase"]: m for m in TRUTH["marks"]}
    labelled = [r for r in rows if r["phase"] in marks]
    assert len(labelled) >= 25
    last = TRUTH["marks"][-1]["phase"]   # the recorder kept that label until the files were written
    for r in labelled:
        m = marks[r["phase"]]
        assert m["start_ns"] - 5e6 <= r["time_ns"], r
        assert r["phase"] == last or r["time_ns"] <= m["end_ns"] + 5e6, r
    # and the timeline keeps the rows' own nanoseconds
    assert tl.nvml["ns"].tolist() == [r["time_ns"] for r in rows]


def test_gpm_counters_follow_the_phases_on_the_shared_clock(tl):
    act = activity_by_annotation(tl).set_index("name")
    gemm, copy = act.loc["phase:gemm"], act.loc["phase:copy"]
    assert gemm["rows"] >= 8 and copy["rows"] >= 8
    assert gemm["gpm_tensor_util_pct"] > 50 > copy["gpm_tensor_util_pct"]
    assert copy["gpm_dram_bw_util_pct"] > 50 > gemm["gpm_dram_bw_util_pct"]
    # NVML's utilization does not tell them apart
    assert gemm["util_gpu_pct"] > 80 and copy["util_gpu_pct"] > 80
    assert act.loc["phase:idle", "gpm_sm_util_pct"] < 5


def test_kernel_lanes_are_merged_when_zoomed_out_and_exact_when_zoomed_in(tl):
    whole = kernel_segments(tl.kernels, max_segments=200)
    assert len(whole) <= 200 and whole["count"].sum() == len(tl.kernels)
    # a 5 ms window inside the training steps: more segments than kernels merged away, none outside
    lo = int(tl.annotations.set_index("name").loc["train_step#3", "start_ns"])
    hi = lo + 5_000_000
    zoom = kernel_segments(tl.kernels, lo, hi, max_segments=4000)
    k = tl.kernels[(tl.kernels.end_ns >= lo) & (tl.kernels.start_ns <= hi)]
    assert zoom["count"].sum() == len(k) and len(zoom) > 1
    assert zoom["start_ns"].min() >= lo and zoom["end_ns"].max() <= hi
    busy = np.minimum(k.end_ns, hi) - np.maximum(k.start_ns, lo)
    assert zoom["busy_ns"].sum() == int(busy.sum())


def test_a_trace_without_base_time_is_aligned_on_its_first_event_with_a_note(tmp_path, raw_trace):
    doc = dict(raw_trace)
    doc.pop("baseTimeNanoseconds")
    bad = tmp_path / "nobase.trace.json.gz"
    with gzip.open(bad, "wt") as f:
        json.dump(doc, f)
    nv = load_nvml_session(GPM)
    tl = align(load_trace(bad), None, nv)
    [note] = tl.notes
    assert "nobase.trace.json.gz" in note and "baseTimeNanoseconds" in note and "first event" in note
    placed = {p.kind: p for p in tl.placements}
    assert not placed["trace"].aligned and placed["nvml"].aligned
    first_ts_us = min(float(e["ts"]) for e in doc["traceEvents"] if e.get("ph") == "X")
    first_event = placed["trace"].offset_ns + round(first_ts_us * 1000)
    assert first_event == int(nv["time_ns"].min())   # its first event put on the session's first row
    assert tl.annotations["start_ns"].min() >= first_event


def test_a_session_without_time_ns_is_aligned_on_its_first_event(tmp_path):
    tl = align(load_trace(TRACE), None, load_nvml_session(samples.path("h200_nvml_session")))
    assert tl.clock == "unix_ns"
    [note] = tl.notes
    assert "h200_nvml_session" in note and "time_ns" in note
    # nothing absolute at all: every file at 0, the clock says so
    alone = align(None, None, load_nvml_session(samples.path("h200_nvml_session")))
    assert alone.clock == "first_event" and alone.origin_ns == 0


def test_a_session_with_time_ns_and_no_t_is_valid(tmp_path):
    rows = [json.loads(line) for line in gzip.open(GPM, "rt")]
    out = tmp_path / "ns_only.jsonl"
    out.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "t"}) + "\n" for r in rows))
    a, b = load_nvml_session(GPM), load_nvml_session(out)
    first = rows[0]["time_ns"]
    assert b["t_s"].tolist() == pytest.approx([(r["time_ns"] - first) / 1e9 for r in rows])
    assert b["time_ns"].tolist() == [r["time_ns"] for r in rows]
    assert b["gpm_tensor_util_pct"].tolist() == a["gpm_tensor_util_pct"].tolist()


def test_replay_of_the_shared_recording_carries_the_gpm_columns():
    from workbench.capture.sampler import ReplaySampler

    path = samples.path("h200_gpm_session")
    with ReplaySampler(path, speed=500) as s:
        assert s.wait(timeout=30)
    frame = s.frame()
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    assert len(frame) == len(rows) and s.has_gpm
    phase = np.array([r["phase"] for r in rows])
    t = frame["t_s"].to_numpy()
    assert np.allclose(t, np.array([r["t"] for r in rows]) - rows[0]["t"])
    means = {p: frame.loc[phase == p, ["gpm_tensor_util_pct", "gpm_dram_bw_util_pct", "gpm_sm_util_pct",
                                        "util_gpu_pct"]].mean() for p in ("bf16_gemm", "copy_bound", "tiny_kernels")}
    assert means["bf16_gemm"]["gpm_tensor_util_pct"] > 50 > means["copy_bound"]["gpm_tensor_util_pct"]
    assert means["copy_bound"]["gpm_dram_bw_util_pct"] > 50 > means["bf16_gemm"]["gpm_dram_bw_util_pct"]
    # tiny kernels: NVML says busy some of the time, the SMs are nearly idle
    assert means["tiny_kernels"]["util_gpu_pct"] > 5 * max(1.0, means["tiny_kernels"]["gpm_sm_util_pct"])
    # unix time rides along (to float64's 256 ns through the ring)
    assert np.allclose(frame["time_ns"].to_numpy(dtype=float), [r["time_ns"] for r in rows], rtol=0, atol=512)
    # the recording's phase labels became marks
    assert [m["label"] for m in s.marks()][:3] == ["idle", "tiny_kernels", "bf16_gemm"]


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "workbench", "timeline", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_cli_json_has_the_contract_keys():
    r = _cli("--trace", TRACE, "--memory", SNAP, "--nvml", GPM, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["clock"] == "unix_ns"
    assert {"name", "start_ns", "end_ns"} <= set(doc["annotations"][0])
    assert {"peak_bytes", "peak_time_ns"} <= set(doc["memory"])
    assert {"first_ns", "last_ns", "peak_mem_used_time_ns"} <= set(doc["nvml"])
    names = [a["name"] for a in doc["annotations"]]
    assert {f"phase:{p}" for p in ("train", "gemm", "copy", "idle")} <= set(names)
    assert all(isinstance(a["start_ns"], int) and a["end_ns"] >= a["start_ns"] for a in doc["annotations"])
    assert doc["nvml"]["first_ns"] <= doc["memory"]["peak_time_ns"] <= doc["nvml"]["last_ns"]


def test_cli_text_and_html(tmp_path):
    out = tmp_path / "t.html"
    r = _cli("--trace", TRACE, "--memory", SNAP, "--nvml", GPM, "--html", out)
    assert r.returncode == 0, r.stderr
    assert "allocator peak" in r.stdout and "inside train_step#" in r.stdout
    assert "phase:gemm" in r.stdout and out.stat().st_size > 100_000
    assert "aligned by baseTimeNanoseconds" in r.stdout


@pytest.mark.parametrize("args,expect", [
    (("--trace", "snapshot"), "is a CUDA allocator snapshot, not a Kineto trace. Give it as `workbench timeline --memory"),
    (("--memory", "nvml"), "is an NVML session, not an allocator snapshot. Give it as `workbench timeline --nvml"),
    (("--nvml", "trace"), "is a Kineto trace, not an NVML session. Give it as `workbench timeline --trace"),
    (("--trace", "missing"), "no such file"),
    ((), "give at least one file"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, expect, tmp_path):
    files = {"snapshot": SNAP, "nvml": GPM, "trace": TRACE, "missing": tmp_path / "nope.json"}
    r = _cli(*[files.get(a, a) for a in args])
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and "Traceback" not in r.stderr


def test_cli_says_when_a_file_cannot_be_aligned():
    r = _cli("--trace", TRACE, "--nvml", samples.path("h200_nvml_session"))
    assert r.returncode == 0, r.stderr
    assert "NOT aligned" in r.stdout and "note: h200_nvml_session.jsonl.gz: cannot be put on Unix time" in r.stdout


def test_figure_rows_share_x_and_mark_the_peak(tl):
    from workbench.figures.timeline import aligned_timeline_figure

    fig = aligned_timeline_figure(tl)
    titles = [a.text for a in fig.layout.annotations if a.text in (
        "annotations", "GPU kernels", "allocator (GiB)", "GPU activity (%): NVML utilization and GPM counters")]
    assert len(titles) == 4
    xaxes = [k for k in fig.layout if k.startswith("xaxis")]
    assert len(xaxes) == 4 and all(fig.layout[k].matches == "x4" for k in xaxes if k != "xaxis4")
    [peak] = [t for t in fig.data if t.name == "allocated peak"]
    assert peak.y[0] == pytest.approx(tl.memory_peak["bytes"] / 2**30)   # a GPU run: GiB
    assert peak.x[0] == pytest.approx((tl.memory_peak["time_ns"] - tl.origin_ns) / 1e9)
    assert "train_step#" in peak.text[0]
    assert sum(len(t.x) for t in fig.data if t.x is not None) <= 50_000
    names = {t.name for t in fig.data}
    assert {"SM active", "tensor cores", "DRAM bandwidth", "NVML util"} <= names


def test_timeline_panel_zoom_redraws_the_kernel_lanes_for_the_window():
    from workbench import TimelinePanel

    p = TimelinePanel(trace=TRACE, memory=SNAP, nvml=GPM)
    kernels = lambda: sum(len(t.x) for t in p.figure.fig.data if t.name and t.name.startswith("kernel"))  # noqa: E731
    before = kernels()
    start = (int(p.timeline.annotations.set_index("name").loc["train_step#2", "start_ns"]) - p.timeline.origin_ns) / 1e9
    # a zoom in the browser on the bottom row reports that row's axis
    p.figure.browser_relayout({"xaxis4.range[0]": start, "xaxis4.range[1]": start + 0.01})
    assert p.last_error is None
    assert kernels() > before
    assert list(p.figure.fig.layout.xaxis4.range) == pytest.approx([start, start + 0.01])
    assert "peak" in p.summary_html.value and "train_step#" in p.summary_html.value
    p.reset_button.click()
    assert kernels() == before


def test_timeline_panel_names_the_panel_that_fits_a_wrong_file():
    from workbench import TimelinePanel
    from workbench.errors import BadArtifact

    with pytest.raises(BadArtifact, match="MemoryPanel"):
        TimelinePanel(trace=SNAP)
    with pytest.raises(BadArtifact, match="no such file"):
        TimelinePanel(nvml="no/such/session.jsonl")


def test_timeline_panel_from_step_records_and_aligns_a_cpu_run(tmp_path):
    torch = pytest.importorskip("torch")
    from workbench import TimelinePanel

    x = torch.randn(64, 64)

    def step():
        with torch.profiler.record_function("my_step_body"):
            (x @ x).relu().sum()

    p = TimelinePanel.from_step(step, steps=2, out_dir=tmp_path, nvml=False)
    assert p.run.complete and p.run.steps == 2 and p.run.trace.parent == tmp_path
    names = list(p.timeline.annotations["name"])
    assert names.count("my_step_body") == 2 and {"ProfilerStep#0", "ProfilerStep#1"} <= set(names)
    assert p.timeline.clock == "unix_ns" and p.last_error is None


def test_a_snapshot_without_history_is_named_in_a_note():
    import pickle

    from workbench.io.snapshot import snapshot_from_dict

    with gzip.open(SNAP, "rb") as f:
        raw = pickle.load(f)
    bare = snapshot_from_dict({"segments": raw["segments"], "device_traces": [[]]}, source="bare.pickle")
    tl = align(load_trace(TRACE), bare, None)
    [note] = tl.notes
    assert note.startswith("bare.pickle: cannot be put on Unix time: no allocation history")
    assert "record_memory_history" in note
