"""`workbench trace`: text, --json (docs/json.md keys), --html, several files, bad input -> one stderr line
and exit 2, Ctrl-C -> exit 130 without a traceback."""

from __future__ import annotations

import re

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from testdata import DATA, default_sigint

from workbench import samples
from workbench.analysis import trace_summary
from workbench.cli import main
from workbench.io import load_trace

H200 = samples.path("h200_train_step")


def _cli(*args, env_extra=None, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "workbench", "trace", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_text_summary(capsys):
    assert main(["trace", str(H200), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200" in out and "1,122 kernels" in out
    assert "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8" in out
    assert out.count("\n  cutlass::Kernel2<") + out.count("\n  sm80_xmma") == 3  # --top 3 kernels
    assert "] fp32_matmul" in out and "[critical] profiler_overhead" in out and "input_bound" not in out
    assert out.index("profiler_overhead") < out.index("] fp32_matmul")
    assert "Diagnosis: limited by the profiler's own overhead" in out and "what if:" in out


def test_json_is_the_contract_and_equals_trace_summary(capsys):
    assert main(["trace", str(H200), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"source", "gpu", "breakdown", "top_kernels", "top_ops", "findings"} <= set(doc)
    assert set(doc["source"]) >= {"path", "device", "events"}
    assert set(doc["gpu"]) >= {"busy_us", "idle_us", "idle_fraction", "kernel_count"}
    assert set(doc["breakdown"]) == {"compute_us", "communication_us", "memory_us", "idle_us"}
    assert all({"name", "count", "total_us", "percent"} <= set(k) for k in doc["top_kernels"])
    assert all({"id", "severity", "message", "evidence"} <= set(f) <= {"id", "severity", "message", "evidence", "what_if", "fix_code"}
               for f in doc["findings"])
    assert doc["diagnosis"]["bound"] == "profiler" and doc["findings"][0]["what_if"]["saved_fraction"] > 0.3
    assert doc == json.loads(json.dumps(trace_summary(load_trace(H200))))


def test_several_files_or_a_folder(capsys):
    assert main(["trace", str(DATA / "multi_rank"), "--json", "--top", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["source"]["rank"] for t in doc["traces"]] == [0, 1]
    assert doc["traces"][0]["breakdown"]["communication_us"] > 0


def test_html_report(tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["trace", str(samples.path("v100_nccl_rank0")), "--html", str(out)]) == 0
    text = out.read_text()
    assert "Plotly.newPlot" in text or "plotly" in text.lower()
    assert "fp32_matmul" in text and "Tesla V100-SXM2-32GB" in text
    # each finding carries its evidence as numbers with units, not a raw dict
    assert re.search(r"fp32 GEMM time over the window <b>[\d.]+ ms \([\d.]+%\)</b>", text), text[text.find("fp32_matmul"):][:800]
    block = text[text.find("<div class='finding"):]
    block = block[:block.find("</section>") if "</section>" in block else 5000]
    assert "{'" not in block and "&#x27;:" not in block
    assert "<script src=\"http" not in text  # opens offline
    assert f"wrote {out}" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["truncated_gzip", "not_json", "json_not_a_trace", "missing"])
def test_bad_input_one_line_exit_2(tmp_path, kind):
    raw = H200.read_bytes()
    p = {
        "truncated_gzip": tmp_path / "cut.trace.json.gz",
        "not_json": tmp_path / "notes.json",
        "json_not_a_trace": tmp_path / "config.json",
        "missing": tmp_path / "nothing.json.gz",
    }[kind]
    if kind == "truncated_gzip":
        p.write_bytes(raw[: len(raw) // 3])
    elif kind == "not_json":
        p.write_text("just some notes\n")
    elif kind == "json_not_a_trace":
        p.write_text(json.dumps({"lr": 0.1, "epochs": 3}))
    r = _cli(p)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(p) in lines[0] and "Traceback" not in r.stderr
    assert any(w in lines[0] for w in ("copy it again", "Give a Kineto trace", "Check the path"))
    assert r.stdout == ""


def test_ctrl_c_stops_cleanly(tmp_path):
    """SIGINT while a big trace is being decoded: one line, exit 130, no traceback."""
    doc = json.loads(gzip.decompress(samples.path("v100_nccl_rank0").read_bytes()))
    doc["traceEvents"] = doc["traceEvents"] * 6  # ~90 MB of real events
    big = tmp_path / "big.trace.json"
    big.write_text(json.dumps(doc))
    del doc
    env = dict(os.environ, OMP_NUM_THREADS="1", WORKBENCH_PROGRESS_AFTER_S="0")
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "trace", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)
    t0 = time.time()
    seen = []
    while not any("decoding" in line for line in seen) and len(seen) < 3:
        seen.append(proc.stderr.readline())  # "...: starting (0.0 s)" and/or "...: decoding (0.0 s)"
    assert "decoding" in seen[-1], seen
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "interrupted" in err and "Traceback" not in err
    assert time.time() - t0 < 30


# The executable keeps pyarrow out of `workbench trace` (workbench.cli.keep_pyarrow_out): pandas then runs on
# Python strings. The command must print the same bytes as with pyarrow in (main() in a process where pandas
# has it), and other commands (ranks: its Parquet cache) keep it.
_PROBE = ("import sys, io, contextlib\nfrom workbench.cli import keep_pyarrow_out, main\n"
          "kept_out = keep_pyarrow_out(sys.argv[1:])\nout = io.StringIO()\n"
          "with contextlib.redirect_stdout(out):\n    rc = main(sys.argv[1:])\n"
          "print(repr((rc, kept_out, sys.modules.get('pyarrow') is None, 'pandas' in sys.modules)))\n"
          "print(out.getvalue(), end='')\n")


@pytest.mark.parametrize("name", ["h200_train_step", "v100_nccl_rank0", "cpu_only", "mi250_rocm"])
@pytest.mark.parametrize("fmt", [[], ["--json"]])
def test_the_executable_runs_trace_without_pyarrow_and_prints_the_same(name, fmt):
    pytest.importorskip("pyarrow")
    path = str(samples.path(name))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORKBENCH_PYARROW", None)
    exe = subprocess.run([sys.executable, "-m", "workbench", "trace", path, *fmt], capture_output=True, text=True,
                         env=env, timeout=120)
    probe = subprocess.run([sys.executable, "-c", _PROBE, "trace", path, *fmt], capture_output=True, text=True,
                           env=env, timeout=120)
    with_pyarrow = subprocess.run([sys.executable, "-c", _PROBE, "trace", path, *fmt], capture_output=True,
                                  text=True, env=dict(env, WORKBENCH_PYARROW="1"), timeout=120)
    first, _, printed = probe.stdout.partition("\n")
    assert first == "(0, True, True, True)", probe.stderr[-2000:]  # pandas ran, pyarrow never loaded
    first_in, _, printed_in = with_pyarrow.stdout.partition("\n")
    assert first_in == "(0, False, False, True)", with_pyarrow.stderr[-2000:]
    assert exe.returncode == 0 and exe.stdout == printed == printed_in


def test_ranks_and_a_process_with_pandas_keep_pyarrow():
    code = ("import sys\nfrom workbench.cli import keep_pyarrow_out\n"
            "a = keep_pyarrow_out(['ranks', 'x'])\nimport pandas\nb = keep_pyarrow_out(['trace', 'x'])\n"
            "print(a, b, sys.modules.get('pyarrow') is not None)")
    pytest.importorskip("pyarrow")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["False", "False", "True"], p.stderr[-2000:]
