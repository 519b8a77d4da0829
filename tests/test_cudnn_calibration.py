"""The estimate with cuDNN convolution workspaces measured on the H200 (workbench.capture.cudnn_calibration,
recorded by benchmarks/calibrate_families_h200.py: tests/data/h200_memory/conv_workspaces_h200.json), against
torch's peaks of the same steps measured in another process (families.json, and families_heldout.json at batch
sizes nothing was fitted or looked at on); and the fake step's event order against the H200 allocator's own
traces (gradient sums in place, operand copies of a convolution)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from testdata import ROOT, data_path

from workbench.analysis.memory.cudnn_model import ConvWorkspaces, conv_call_key
from workbench.errors import BadArtifact

MiB = 1 << 20
CONV_FAMILIES = ("cnn", "unet")


def _families():
    sys.path.insert(0, str(ROOT / "examples"))
    from estimate_families import FAMILIES, adamw

    return FAMILIES, adamw


@pytest.fixture(scope="module")
def table():
    return ConvWorkspaces.load(data_path("h200_memory", "conv_workspaces_h200.json"))


def _truth_rows():
    rows = []
    for name, held in (("families.json", False), ("families_heldout.json", True)):
        for r in json.loads(data_path("h200_memory", name).read_text())["rows"]:
            if r["family"] in CONV_FAMILIES and "max_reserved_bytes" in r:
                rows.append(dict(r, held_out=held))
    return rows


def test_table_says_where_it_was_measured(table):
    assert table.meta["device"] == "NVIDIA H200" and table.meta["cudnn"] and table.meta["cudnn_benchmark"] is False
    assert len(table) > 500
    # fp32 without TF32: the heuristics took the FFT's hundreds of MiB for some layers and nothing for others
    fp32 = [v for k, v in table.entries.items() if k.endswith("|fp32|fp32|nchw") and k.startswith("forward")]
    assert max(fp32) > 500 * MiB and min(fp32) == 0


def test_twelve_recorded_and_nine_held_out_rows():
    rows = _truth_rows()
    assert sum(not r["held_out"] for r in rows) == 12 and sum(r["held_out"] for r in rows) == 9
    recorded = {(r["family"], r["batch_size"]) for r in rows if not r["held_out"]}
    assert not recorded & {(r["family"], r["batch_size"]) for r in rows if r["held_out"]}


@pytest.mark.parametrize("row", _truth_rows(), ids=lambda r: f"{r['family']}{r['batch_size']}-{r['precision']}"
                         + ("-heldout" if r["held_out"] else ""))
def test_calibrated_estimate_within_5_and_10_percent_of_torchs_peaks(row, table):
    # both sides above what the process held before the step (the measurement warmed cuBLAS up first)
    from workbench.capture.estimate import estimate

    FAMILIES, adamw = _families()
    build, inputs, loss = FAMILIES[row["family"]]
    e = estimate(build, inputs, adamw, precision=row["precision"], batch_size=row["batch_size"], loss_fn=loss,
                 strict_fp32=row["precision"] == "fp32",  # recorded with TF32 off
                 cublas_workspace_bytes=0, conv_workspaces=table)
    cw = e.meta["conv_workspaces"]
    assert cw["ruled"] == 0 and cw["measured"] == cw["calls"] > 0, "the table holds every call of the step"
    alloc = row["max_allocated_bytes"] - row["base_allocated_bytes"]
    res = row["max_reserved_bytes"] - row["base_reserved_bytes"]
    assert e.peak_allocated_bytes == pytest.approx(alloc, rel=0.05)
    assert e.peak_reserved_bytes == pytest.approx(res, rel=0.10)


def test_without_the_table_fp32_misses_by_the_workspace(table):
    # the same step without measurements: fp32 convolutions take 0 (the rules cannot know which layers cuDNN
    # gives the FFT), so the estimate is far below torch's peak -- what the calibration fixes
    from workbench.capture.estimate import estimate

    FAMILIES, adamw = _families()
    build, inputs, loss = FAMILIES["unet"]
    row = next(r for r in _truth_rows() if r["family"] == "unet" and r["precision"] == "fp32" and r["held_out"])
    e = estimate(build, inputs, adamw, precision="fp32", strict_fp32=True, batch_size=row["batch_size"], loss_fn=loss,
                 cublas_workspace_bytes=0)
    assert e.meta["conv_workspaces"]["measured"] == 0
    assert e.peak_reserved_bytes < 0.5 * (row["max_reserved_bytes"] - row["base_reserved_bytes"])


def test_convolution_calls_of_a_step_and_their_keys():
    from workbench.capture.cudnn_calibration import convolution_calls

    FAMILIES, adamw = _families()
    build, inputs, loss = FAMILIES["cnn"]
    calls = convolution_calls(build, inputs, adamw, precision="bf16", batch_size=4, loss_fn=loss)
    directions = {k.split("|")[0] for k in calls}
    assert directions == {"forward", "backward_data", "backward_weight"}
    # the stem's input needs no gradient: its convolution has no backward_data call
    stem = conv_call_key("backward_data", [4, 3, 64, 64], [64, 3, 3, 3], [4, 64, 64, 64], [1, 1], [1, 1], [1, 1],
                         False, [0, 0], 1, "bf16")
    assert stem not in calls and stem.replace("backward_data", "backward_weight", 1) in calls
    c = calls[stem.replace("backward_data", "forward", 1)]
    assert c["dtype"] == "bf16" and c["math"] == "tc" and c["x"] == [4, 3, 64, 64]
    # the key names the math of a fp32 call
    assert conv_call_key("forward", [1, 3, 8, 8], [4, 3, 3, 3], [1, 4, 8, 8], [1, 1], [1, 1], [1, 1], False, [0, 0],
                         1, "fp32", "tf32").endswith("|fp32|tf32|nchw")


def test_table_round_trip_and_bad_files(tmp_path):
    t = ConvWorkspaces({"forward|x1|w1|y1|s1|p0|d1|t0|o0|g1|fp32|fp32|nchw": 1024}, {"device": "X"})
    p = t.save(tmp_path / "t.json")
    back = ConvWorkspaces.load(p)
    assert back.entries == t.entries and back.meta == {"device": "X"}
    for name, text in [("notjson.json", "{"), ("other.json", json.dumps({"rows": []})),
                       ("neg.json", json.dumps({"format": "gpu-workbench/conv-workspaces/1",
                                                "entries": {"forward|x1|w1|y1|s1|p0|d1|t0|o0|g1|fp32|fp32|nchw": -1}})),
                       ("badkey.json", json.dumps({"format": "gpu-workbench/conv-workspaces/1", "entries": {"a|b": 1}}))]:
        (tmp_path / name).write_text(text)
        with pytest.raises(BadArtifact, match=name):
            ConvWorkspaces.load(tmp_path / name)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_cli_estimates_with_the_h200_table_and_refuses_what_it_cannot_do(tmp_path):
    model = tmp_path / "unet_model.py"
    model.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'examples')!r})\n"
                     "from estimate_families import unet as model, unet_batch as batch, adamw as optimizer\n"
                     "import torch.nn.functional as F\n\ndef loss(out):\n    return out.float().pow(2).mean()\n")
    table = data_path("h200_memory", "conv_workspaces_h200.json")
    r = _cli("estimate", model, "--batch-size", "16", "--workspaces", table)
    assert r.returncode == 0, r.stderr
    assert "measured on NVIDIA H200" in r.stdout and "from the rules" in r.stdout
    j = json.loads(_cli("estimate", model, "--batch-size", "16", "--workspaces", table, "--json").stdout)
    assert j["meta"]["conv_workspaces"]["measured"] > 0
    # no GPU here: --calibrate says so in one line, exit 2, and writes nothing
    out = tmp_path / "ws.json"
    r = _cli("estimate", model, "--calibrate", "--workspaces", out)
    if r.returncode == 0:
        pytest.skip("a CUDA device is present: tests/gpu covers --calibrate")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and not out.exists()
    r = _cli("estimate", model, "--workspaces", tmp_path / "missing.json")
    assert r.returncode == 2 and "--calibrate --workspaces" in r.stderr


def test_gradient_sums_in_place_as_the_real_engine_does():
    """A residual block's backward on real CPU tensors (no dispatch mode: the engine as it runs on the GPU) sums
    the two gradients of the block's input in place (aten::add_); the fake step must allocate no block for it."""
    import torch

    from workbench.capture.estimate import trace_step_memory

    sys.path.insert(0, str(ROOT / "examples"))
    from estimate_families import _ConvBlock

    m = _ConvBlock(8, 8, 1)
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    loss = m(x).pow(2).mean()
    with torch.profiler.profile() as prof:
        loss.backward()
    names = [e.name for e in prof.events()]
    assert names.count("aten::add_") >= 1 and "aten::add" not in names

    rec = trace_step_memory(lambda: _ConvBlock(8, 8, 1), lambda n: (torch.randn(n, 8, 16, 16, requires_grad=True),),
                            None, batch_size=2, steps=1)
    ev = rec["events"]
    sums = [i for i, (a, ph, op) in enumerate(zip(ev["action"], ev["phase"], ev["op"]))
            if a == "alloc" and ph == "backward" and op == "add"]
    assert sums == []


def test_fake_step_allocates_what_the_h200_allocator_did(table):
    """The estimate's requests of 1 MiB and more, in order, against the H200 allocator's own trace of the same
    step (trace_unet_32_bf16: a U-Net's skip connections and transposed convolutions): the same sequence but
    for the workspaces' last partial 2 MiB (the table holds the block cuDNN got, the trace the request)."""
    import difflib

    from workbench.analysis.memory.allocator_model import round_size

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import allocator_trace_check as atc

    for name in ("trace_unet_32_bf16.json.gz", "trace_cnn_32_bf16.json.gz"):
        with gzip.open(data_path("h200_memory", name), "rt") as f:
            d = json.load(f)
        seq, _ = atc.real_sequence(d["trace"])
        atc.WORKSPACES = table
        try:
            est = atc.estimate_sequence(d["case"])
        finally:
            atc.WORKSPACES = None

        def big(events):
            size, out = {}, []
            for e in events:
                if e[0] == "alloc":
                    size[e[1]] = e[2]
                n = round_size(size.get(e[1], 0))
                if n >= MiB:
                    out.append((e[0], -(-n // (2 * MiB))))  # in 2 MiB units, rounded up
            return out

        real = big([(a, addr, s) for a, addr, s, _ in seq])
        mine = big(est)
        sm = difflib.SequenceMatcher(a=real, b=mine, autojunk=False)
        matched = sum(b.size for b in sm.get_matching_blocks())
        # the real trace ends with frees of the warm-up's blocks, which the estimate never made
        assert matched >= len(real) - 8 and len(mine) <= matched + 2, (name, len(real), len(mine), matched)


def test_estimate_panel_takes_the_table():
    from workbench.panels.estimate import EstimatePanel

    FAMILIES, adamw = _families()
    build, inputs, loss = FAMILIES["unet"]
    row = next(r for r in _truth_rows() if r["family"] == "unet" and r["precision"] == "fp32" and r["held_out"])
    # (one-argument inputs: the panel reads a second parameter as a sequence length and shows its slider)
    p = EstimatePanel.from_factories(build, lambda n: inputs(n), adamw, loss_fn=loss, batch_size=row["batch_size"],
                                     precision="fp32", strict_fp32=True,
                                     workspaces=data_path("h200_memory", "conv_workspaces_h200.json"))
    assert "measured on NVIDIA H200" in p.summary.value
    # the panel's estimate counts cuBLAS's workspaces (a fresh process), so compare above the measured ones
    real = row["max_reserved_bytes"] - row["base_reserved_bytes"]
    assert p.estimate.peak_reserved_bytes == pytest.approx(real + 2 * 32 * MiB, rel=0.10)
