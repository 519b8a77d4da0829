"""workbench.io.trace: every shipped Kineto trace loads into the contract's columns, and what it holds
agrees with an independent read of the same file (json + plain Python)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from testdata import DATA

from workbench import samples
from workbench.errors import BadArtifact
from workbench.io import Trace, load_trace, load_traces
from workbench.io import trace as io_trace

TRACES = [samples.path(n) for n in samples.names("trace")] + [
    DATA / "multi_rank" / "sampled_rank-0.json.gz",
    DATA / "multi_rank" / "sampled_rank-1.json.gz",
    DATA / "trace_compare" / "base.json.gz",
    DATA / "trace_compare" / "test.json.gz",
    DATA / "cupti" / "cupti_counters.trace.json.gz",
]
IDS = [p.name.split(".")[0] for p in TRACES]


def _plain(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _as_str_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df.astype({c: object for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)})


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_loads_into_contract_columns_and_matches_plain_json(path):
    t = load_trace(path)
    doc = _plain(path)
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    ev = t.events

    assert isinstance(t, Trace) and t.path == str(path)
    assert t.n_events == len(events)
    assert len(ev) == len(xs)
    for col in ("name", "cat"):
        assert isinstance(ev[col].dtype, pd.CategoricalDtype), col
    assert ev["ts_us"].dtype == np.float64 and ev["dur_us"].dtype == np.float64
    assert ev["pid"].dtype == np.int64 and ev["tid"].dtype == np.int64
    for col in ("stream", "device", "correlation", "external_id"):
        assert str(ev[col].dtype) == "Int64", col

    # same names in the same order, same categories, same times
    assert ev["name"].astype(str).tolist() == [e.get("name", "") for e in xs]
    assert Counter(ev["cat"].astype(str)) == Counter(e.get("cat", "") for e in xs)
    np.testing.assert_allclose(ev["ts_us"].to_numpy(), [float(e["ts"]) for e in xs])
    np.testing.assert_allclose(ev["dur_us"].to_numpy(), [float(e.get("dur", "nan")) for e in xs], equal_nan=True)

    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    exp_stream = [
        e["args"].get("stream") if e.get("cat") in gpu_cats else e["tid"] if e.get("cat") == "gpu_user_annotation" else None
        for e in xs
    ]
    got_stream = ev["stream"].astype(object).where(ev["stream"].notna(), None).tolist()
    assert got_stream == exp_stream
    exp_corr = [(e.get("args") or {}).get("correlation") for e in xs]
    assert ev["correlation"].astype(object).where(ev["correlation"].notna(), None).tolist() == exp_corr
    if any("bytes" in (e.get("args") or {}) for e in xs):
        exp_bytes = sum((e.get("args") or {}).get("bytes", 0) for e in xs)
        assert int(ev["bytes"].sum()) == exp_bytes

    # metadata
    md = t.metadata
    assert md["deviceProperties"] == (doc.get("deviceProperties") or [])
    assert md["distributedInfo"] == (doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else None)
    assert t.rank == (doc.get("distributedInfo") or {}).get("rank")
    real = [e for e in xs if e.get("cat") != "Trace"]
    assert md["trace_start_us"] == pytest.approx(min(float(e["ts"]) for e in real))


def test_device_names():
    assert load_trace(samples.path("h200_train_step")).device == "NVIDIA H200"
    assert load_trace(samples.path("a100_alexnet")).device == "NVIDIA A100-PG509-200"
    assert load_trace(samples.path("v100_nccl_rank0")).device == "Tesla V100-SXM2-32GB"
    assert load_trace(samples.path("mi250_rocm")).device == "AMD Radeon Graphics"
    assert load_trace(samples.path("cpu_only")).device == "cpu"
    # kernels but no deviceProperties in the file
    assert load_trace(DATA / "multi_rank" / "sampled_rank-0.json.gz").device == "unknown GPU"


def test_string_ids_and_process_metadata():
    t = load_trace(samples.path("h200_train_step"))
    ev = t.events
    span = ev[ev["cat"] == "Trace"]
    assert len(span) == 1
    pid = int(span["pid"].iloc[0])
    assert pid < 0 and t.metadata["string_ids"][pid] == "Spans"
    assert t.metadata["process_labels"][0] == "GPU 0"
    assert t.metadata["thread_names"][0][7] == "stream 7"
    # kernels sit on pid = device, tid = stream
    k = t.kernels
    assert (k["pid"].to_numpy() == k["device"].to_numpy(dtype=np.int64)).all()
    assert (k["tid"].to_numpy() == k["stream"].to_numpy(dtype=np.int64)).all()


def test_input_dims_are_interned_json_text():
    t = load_trace(samples.path("h200_train_step"))
    ops = t.events[t.events["cat"] == "cpu_op"]
    dims = ops["input_dims"]
    assert isinstance(dims.dtype, pd.CategoricalDtype)
    assert len(dims.cat.categories) < dims.notna().sum() / 5  # interned: far fewer distinct than rows
    doc = _plain(samples.path("h200_train_step"))
    exp = [e["args"].get("Input Dims") for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    got = [None if pd.isna(v) else json.loads(v) for v in dims]
    assert got == exp


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_chunked_decoding_equals_whole_document_decoding(path):
    whole = io_trace._load(path, lambda s: None, chunked=False)
    tiny = io_trace._load(path, lambda s: None, chunk_bytes=2000)
    pd.testing.assert_frame_equal(_as_str_frame(tiny.events), _as_str_frame(whole.events))
    assert tiny.n_events == whole.n_events
    assert tiny.metadata == whole.metadata


def test_chunked_reader_really_splits():
    cols = io_trace._Columns()
    io_trace._decode_chunked(samples.path("v100_nccl_rank0"), cols, 2000)
    assert len(cols.parts["ts_us"]) > 3  # several chunks, no fallback


def test_plain_json_bare_list_and_multimember_gzip(tmp_path):
    src = samples.path("a100_alexnet")
    ref = load_trace(src)
    raw = gzip.decompress(src.read_bytes())
    plain = tmp_path / "t.json"
    plain.write_bytes(raw)
    # Chrome's JSON array format: just the events
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(raw)["traceEvents"]))
    # a gzip file of two members (what `cat a.gz b.gz` makes)
    multi = tmp_path / "multi.json.gz"
    multi.write_bytes(gzip.compress(raw[: len(raw) // 2]) + gzip.compress(raw[len(raw) // 2:]))
    for p in (plain, bare, multi):
        t = load_trace(p)
        pd.testing.assert_frame_equal(_as_str_frame(t.events), _as_str_frame(ref.events))
    assert load_trace(bare).metadata["deviceProperties"] == []


def test_lenient_types_are_coerced(tmp_path):
    """A producer that writes ids as strings and times as strings still loads (lenient path)."""
    doc = _plain(DATA / "trace_compare" / "base.json.gz")
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["correlation"] = str(e["args"]["correlation"])
            e["ts"] = str(e["ts"])
    p = tmp_path / "odd.json"
    p.write_text(json.dumps(doc))
    t = load_trace(p)
    ref = load_trace(DATA / "trace_compare" / "base.json.gz")
    pd.testing.assert_frame_equal(_as_str_frame(t.events), _as_str_frame(ref.events))


def _bad(tmp_path, name, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_bad_files_raise_bad_artifact_naming_file_and_fix(tmp_path):
    raw = samples.path("h200_train_step").read_bytes()
    text = gzip.decompress(raw)
    cases = {
        "truncated.json.gz": (raw[: len(raw) // 2], "truncated"),
        "truncated.json": (text[: len(text) // 2], "truncated"),
        "notjson.json": (b"this is not json\n", "not JSON"),
        "notrace.json": (b'{"hello": [1, 2, 3]}', "traceEvents"),
        "list_of_numbers.json": (b"[1, 2, 3]", "not a Kineto trace"),
        "no_ph.json": (b'{"traceEvents": [{"name": "x"}]}', "not trace events"),
        "empty.json": (b"", "empty"),
        "corrupt.json.gz": (raw[:20] + b"\x00" * 200 + raw[220:], "gzip"),
    }
    for name, (data, words) in cases.items():
        p = _bad(tmp_path, name, data)
        with pytest.raises(BadArtifact) as ei:
            load_trace(p)
        msg = str(ei.value)
        assert str(p) in msg and words in msg, (name, msg)
        assert ei.value.fix, name  # every message carries a fix
    with pytest.raises(BadArtifact, match="no such file"):
        load_trace(tmp_path / "missing.json.gz")
    with pytest.raises(BadArtifact, match="directory"):
        load_trace(tmp_path)


def test_load_traces_uses_processes_and_keeps_order(tmp_path):
    paths = [DATA / "multi_rank" / "sampled_rank-1.json.gz", DATA / "multi_rank" / "sampled_rank-0.json.gz"]
    traces = load_traces(paths, processes=2)
    assert [t.rank for t in traces] == [1, 0]
    for t, p in zip(traces, paths):
        pd.testing.assert_frame_equal(_as_str_frame(t.events), _as_str_frame(load_trace(p).events))
    bad = _bad(tmp_path, "bad.json", b"{}")
    with pytest.raises(BadArtifact, match="bad.json"):
        load_traces([paths[0], bad], processes=2)


def test_no_per_event_python_objects_kept():
    t = load_trace(samples.path("v100_nccl_rank0"))
    for col in t.events.columns:
        assert t.events[col].dtype != object, col


CPU_PROFILE = r"""
import sys, torch
from torch.profiler import profile, ProfilerActivity, record_function
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
step()
with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=torch.profiler.schedule(wait=1, warmup=1, active=3)) as prof:  # wait=0 records nothing
    for _ in range(5):
        step()
        prof.step()
prof.export_chrome_trace(sys.argv[1])
import json
avg = {e.key: [e.count, e.cpu_time_total, e.self_cpu_time_total] for e in prof.key_averages()}
json.dump(avg, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    """A real CPU profile made here by torch.profiler, with torch's own key_averages beside it."""
    d = tmp_path_factory.mktemp("cpu_profile")
    trace, avg = d / "cpu.trace.json", d / "avg.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", KINETO_LOG_LEVEL="6", TORCH_CPP_LOG_LEVEL="ERROR")
    subprocess.run([sys.executable, "-c", CPU_PROFILE, str(trace), str(avg)], check=True, env=env, timeout=300)
    return trace, json.loads(avg.read_text())


def test_torch_cpu_profile_loads_and_counts_match_key_averages(cpu_profile):
    path, avg = cpu_profile
    t = load_trace(path)
    assert t.device == "cpu"
    ops = t.events[t.events["cat"] == "cpu_op"]
    counts = ops["name"].astype(str).value_counts()
    for name in ("aten::addmm", "aten::relu", "aten::linear"):
        assert counts[name] == avg[name][0], name
    steps = t.events[t.events["name"].astype(str).str.startswith("ProfilerStep#")]
    assert len(steps) == 3


def test_sample_descriptions_say_what_the_traces_hold():
    """A description that names NCCL kernels must hold some; v100_nccl_rank0 (one rank) has NCCL calls
    on the host and no NCCL kernel, and says so."""
    from workbench.analysis import temporal_breakdown

    for name in samples.names("trace"):
        desc = samples.SAMPLES[name][2]
        if "NCCL kernels" not in desc:
            continue
        ev = load_trace(samples.path(name)).events
        names = ev["name"].astype(str)
        n_kernels = int((names.str.contains("nccl", case=False) & (ev["cat"].astype(str) == "kernel")).sum())
        assert ("no NCCL kernels" in desc) == (n_kernels == 0), name
    tr = load_trace(samples.path("v100_nccl_rank0"))
    host = tr.events["name"].astype(str)
    assert (host == "nccl:all_reduce").sum() == 25 and (host == "nccl:broadcast").sum() == 10
    assert temporal_breakdown(tr)["communication_us"] == 0.0
    assert tr.metadata["distributedInfo"]["world_size"] == 1
