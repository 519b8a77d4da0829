"""Roofline and MFU against hand counts and measurements made on an H200.

tests/data/h200_pairs/gpt/ holds a decoder-only transformer (d 1024, 12 layers, 16 heads, T 1024, batch 8,
vocab 32768, untied head, causal SDPA) recorded with shapes in bf16 autocast, fp32 and TF32, and
``truth.json``: the FLOPs counted by hand (6·N·tokens + causal attention) and the step times measured
WITHOUT the profiler (CUDA events). The traces themselves are profiled, so two MFUs are checked:

* on the unprofiled measured step time (what people quote): model FLOPs from the trace / measured ms
  / 989.4 against the hand count / the same ms / 989.4;
* on the trace's own (profiled) step time: the same FLOPs over the step as the trace recorded it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench import samples
from workbench.analysis.trace.flops import NO_SHAPES_NOTE, op_cost, trace_costs
from workbench.analysis.trace.peaks import parse_peak_overrides, peak_for
from workbench.analysis.trace.roofline import precision_what_ifs, roofline
from workbench.errors import BadArgument
from workbench.io import load_trace

ROOT = Path(__file__).resolve().parent.parent
GPT = ROOT / "tests" / "data" / "h200_pairs" / "gpt"
TRUTH = json.loads((GPT / "truth.json").read_text())
HAND_FLOPS = TRUTH["hand_count"]["total_flops"]


@pytest.fixture(scope="module")
def traces():
    return {v: load_trace(GPT / f"{v}.standard.trace.json.gz") for v in ("bf16", "fp32", "tf32")}


@pytest.fixture(scope="module")
def rooflines(traces):
    return {v: roofline(t) for v, t in traces.items()}


def _measured(v: str) -> float:
    return TRUTH["measured"][v]["median_ms"]


# ------------------------------------------------------------------------------------------- the step


def test_model_flops_from_the_trace_match_the_hand_count(rooflines):
    for v, rl in rooflines.items():
        assert rl.step["model_flops"] == pytest.approx(HAND_FLOPS, rel=0.02), v
        # the three precisions ran the same model: the same FLOPs, whatever the kernels
        assert rl.step["model_flops"] == pytest.approx(rooflines["bf16"].step["model_flops"], rel=1e-9)


def test_mfu_on_the_unprofiled_step_is_within_10_percent_of_the_hand_count(traces):
    ms = _measured("bf16")
    rl = roofline(traces["bf16"], step_ms=ms)
    hand_mfu = HAND_FLOPS / (ms * 1e-3) / 989.4e12  # ~0.307
    assert rl.step["step_ms_source"] == "given" and rl.step["dtype"] == "bf16"
    assert rl.peak.name == "H200 SXM" and rl.step["peak_tflops_dtype"] == 989.4
    assert rl.step["mfu"] == pytest.approx(hand_mfu, rel=0.10)
    assert rl.step["achieved_tflops"] == pytest.approx(TRUTH["measured"]["bf16"]["achieved_tflops_hand"], rel=0.10)


def test_mfu_on_the_profiled_step_uses_the_traces_own_step_time(rooflines):
    rl = rooflines["bf16"]
    trace_ms = rl.step["step_ms_trace"]
    # the profiler slows this host-light step down (~46 ms recorded vs ~32 ms without it)
    assert trace_ms > 1.2 * _measured("bf16")
    assert rl.step["mfu_trace"] == pytest.approx(HAND_FLOPS / (trace_ms * 1e-3) / 989.4e12, rel=0.10)
    # without a given time MFU uses the diagnosis' estimate of the step without the profiler, which
    # lands within 10% of the MFU measured without the profiler
    assert "estimated" in rl.step["step_ms_source"]
    assert rl.step["mfu"] == pytest.approx(HAND_FLOPS / (_measured("bf16") * 1e-3) / 989.4e12, rel=0.10)


def test_fp32_and_tf32_mfu_are_against_their_own_peaks(traces, rooflines):
    assert rooflines["fp32"].step["dtype"] == "fp32" and rooflines["tf32"].step["dtype"] == "tf32"
    for v, peak in (("fp32", 66.9), ("tf32", 494.7)):
        rl = roofline(traces[v], step_ms=_measured(v))
        assert rl.step["mfu"] == pytest.approx(HAND_FLOPS / (_measured(v) * 1e-3) / (peak * 1e12), rel=0.10), v
        # these GPU-bound steps: the trace's step time is the unprofiled one within 5%
        assert rl.step["step_ms_trace"] == pytest.approx(_measured(v), rel=0.05), v


# ------------------------------------------------------------------------------------ kernels and ops


def test_kernel_tflops_are_below_the_peak_of_their_dtype(rooflines):
    for v, rl in rooflines.items():
        k = rl.kernels[rl.kernels["tflops"].notna()]
        assert len(k) > 5, v
        peaks = np.array([rl.peak.compute(d) for d in k["dtype"]])
        assert (k["tflops"].to_numpy() <= peaks).all(), (v, k.loc[k["tflops"] > peaks, ["name", "tflops"]])
        assert (k["gbps"].dropna() <= rl.peak.gbps).all(), v
        gemm = k[k["kind"] == "gemm"]
        # the big GEMMs of this model reach a real share of the tensor-core (or fp32) peak
        top = gemm.iloc[0]
        assert top["bound"] == "compute" and 0.3 <= top["roofline_fraction"] <= 1.0, (v, top.to_dict())
        assert set(gemm["dtype"]) == {v}, v


def test_causal_attention_is_half_the_full_score_flops(rooflines):
    ops = rooflines["bf16"].costs.ops
    attn = ops[ops["kind"] == "attention"]
    assert len(attn) and attn["causal"].eq(True).all()
    per_step = attn.loc[attn["in_step"], "flops"].sum() / rooflines["bf16"].costs.n_steps
    assert per_step == pytest.approx(TRUTH["hand_count"]["attention_flops_causal"], rel=1e-6)


def test_coverage_says_what_share_of_gpu_time_got_flops(rooflines):
    cov = rooflines["bf16"].costs.coverage()
    assert 0.5 < cov["flops_fraction"] < cov["costed_fraction"] <= 1.0
    # the fp32 trace holds GPU work launched in the warm-up step (before the trace): no launch, no FLOPs
    cov32 = rooflines["fp32"].costs.coverage()
    assert 0.5 < cov32["matched_fraction"] < 0.9
    d = rooflines["fp32"].as_dict()
    assert d["flops_coverage"] == cov32["flops_fraction"] and d["matched_kernel_fraction"] == cov32["matched_fraction"]


# --------------------------------------------------------------------------------------- what-ifs


def test_tf32_prediction_is_within_25_percent_of_the_measured_saving(traces, rooflines):
    w = precision_what_ifs(traces["fp32"], rooflines["fp32"])
    measured_saving = _measured("fp32") - _measured("tf32")  # 218.07 -> 69.66 ms
    predicted_saving = w["tf32"].saved_fraction * _measured("fp32")
    assert predicted_saving == pytest.approx(measured_saving, rel=0.25)
    # bf16 autocast, reported beside (GEMMs and attention only): measured 31.94 ms
    bf = w["bf16"]
    print(f"tf32: predicted {w['tf32'].step_ms_if_fixed:.2f} ms, measured {_measured('tf32'):.2f}; "
          f"bf16: predicted {bf.step_ms_if_fixed:.2f} ms, measured {_measured('bf16'):.2f}")
    assert bf.step_ms_if_fixed < w["tf32"].step_ms_if_fixed
    assert bf.step_ms_if_fixed == pytest.approx(_measured("bf16"), rel=0.5)


def test_bf16_what_if_doubles_the_flops_per_byte_and_predicts_the_recorded_bf16_gemms(traces, rooflines):
    """16-bit operands halve the bytes, so a GEMM's FLOP/byte doubles (the bf16 trace's aten::mm: 2x the fp32
    one's). The what-if's GEMM times, scaled to the same fraction of the bf16 roof, against the GEMMs the bf16
    run recorded: within 3% (with the intensity halved instead they came out 14% slow)."""
    from workbench.analysis.trace.roofline import _scaled_durations

    fp32, bf16 = rooflines["fp32"], rooflines["bf16"]
    mm = {v: rl.ops.set_index("name").loc["aten::mm"] for v, rl in rooflines.items()}
    assert mm["bf16"]["intensity"] == pytest.approx(2 * mm["fp32"]["intensity"], rel=0.01)
    g = fp32.costs.gpu
    gemm = (g["dtype"].to_numpy() == "fp32") & (g["flops"].to_numpy() > 0) & (g["kind"].to_numpy() == "gemm")
    predicted_ms = _scaled_durations(fp32, gemm, "bf16", 2.0).sum() / fp32.costs.n_steps / 1e3
    ops = bf16.ops
    recorded_ms = ops.loc[ops["kind"] == "gemm", "total_us"].sum() / bf16.costs.n_steps / 1e3
    assert predicted_ms == pytest.approx(recorded_ms, rel=0.03), (predicted_ms, recorded_ms)


def test_fp32_matmul_finding_carries_the_computed_what_if(traces):
    from workbench.analysis import findings

    f = next(f for f in findings(traces["fp32"]) if f.id == "fp32_matmul")
    assert f.what_if is not None and f.what_if["step_ms_if_fixed"] == pytest.approx(f.evidence["step_ms_if_tf32"], abs=1e-3)
    assert f"{f.evidence['step_ms_if_tf32']:,.1f} ms" in f.message
    assert f"{f.evidence['step_ms_if_bf16']:,.1f} ms" in f.message
    assert "365 ms" not in f.message  # the numbers are computed, not typed in
    # the bf16 trace has no fp32 GEMMs: no such finding
    assert not any(f.id == "fp32_matmul" for f in findings(traces["bf16"]))


# ------------------------------------------------------------------------------------------ peaks


def test_peak_table_matches_device_property_names():
    assert peak_for("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert peak_for("NVIDIA H100 80GB HBM3").gbps == 3350
    assert peak_for("NVIDIA H200").tflops == pytest.approx(
        {"fp64": 67, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9})
    assert peak_for("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert peak_for("NVIDIA A100-SXM4-80GB").gbps == 2039 and peak_for("NVIDIA A100-PG509-200").name == "A100 40GB"
    assert peak_for("Tesla V100-SXM2-32GB").compute("bf16") == 125  # no bf16: its fp16 tensor-core rate
    assert peak_for("NVIDIA L40S").name == "L40S" and peak_for("NVIDIA L4").name == "L4"
    assert peak_for("NVIDIA GH200 480GB") is None  # not an H200: no false match
    # ROCm names every device "AMD Radeon Graphics": the compute units decide (one MI250 GCD: 104)
    t = load_trace(samples.path("mi250_rocm"))
    p = peak_for(t.device, t.metadata["deviceProperties"][0])
    assert p is not None and p.name == "MI250 (one GCD)"


def test_peaks_can_be_overridden():
    p = peak_for("NVIDIA H200", override={"bf16": 900, "gbps": 4000})
    assert p.tflops["bf16"] == 900 and p.gbps == 4000 and p.tflops["tf32"] == 494.7 and "override" in p.source
    p = peak_for("Some Future GPU", override=parse_peak_overrides(["bf16=2000", "gbps=8000"]))
    assert p.source == "user" and p.tflops == {"bf16": 2000.0}
    with pytest.raises(BadArgument, match="--peak"):
        parse_peak_overrides(["bf16"])
    with pytest.raises(BadArgument):
        peak_for("NVIDIA H200", override={"tensor": 1})


# --------------------------------------------------------------------------------------- formulas


def test_op_formulas():
    bf = '"c10::BFloat16"'
    assert op_cost("aten::addmm", "[[3072],[8192,1024],[1024,3072],[],[]]", f"[{bf},{bf},{bf},\"Scalar\",\"Scalar\"]",
                   None).flops == 2 * 8192 * 1024 * 3072
    assert op_cost("aten::linear", "[[8,1024,1024],[4096,1024],[4096]]", '["float","float","float"]', None).flops == \
        2 * 8 * 1024 * 1024 * 4096
    assert op_cost("aten::bmm", "[[16,128,64],[16,64,256]]", '["float","float"]', None).flops == 2 * 16 * 128 * 64 * 256
    q = "[8,16,1024,64]"
    dims = f"[{q},{q},{q},[],[],[],[],[]]"
    types = f'[{bf},{bf},{bf},"","Scalar","Scalar","","Scalar"]'
    full = op_cost("aten::scaled_dot_product_attention", dims, types, '["","","","","0.","False","","False"]')
    causal = op_cost("aten::scaled_dot_product_attention", dims, types, '["","","","","0.","True","","False"]')
    assert full.flops == 4 * 8 * 16 * 1024 * 1024 * 64 and causal.flops == full.flops / 2 and causal.causal is True
    # convolution: 2·N·Hout·Wout·numel(W); backward: grad-input and grad-weight as asked
    conv = op_cost("aten::convolution", "[[4,3,32,32],[16,3,3,3],[16],[],[],[],[],[],[]]",
                   '["float","float","float","ScalarList","ScalarList","ScalarList","Scalar","ScalarList","Scalar"]',
                   '["","","","[2, 2]","[1, 1]","[1, 1]","False","[0, 0]","1"]')
    assert conv.kind == "conv" and conv.flops == 2 * 4 * 16 * 16 * (16 * 3 * 3 * 3)
    bwd = op_cost("aten::convolution_backward", "[[4,16,16,16],[4,3,32,32],[16,3,3,3],[],[],[],[],[],[],[],[]]",
                  '["float","float","float","ScalarList","ScalarList","ScalarList","ScalarList","Scalar","ScalarList",'
                  '"Scalar","ScalarList"]', '["","","","[16]","[2, 2]","[1, 1]","[1, 1]","False","[0, 0]","1",'
                  '"[False, True, True]"]')
    assert bwd.flops == conv.flops  # the first layer: no grad-input, only grad-weight
    assert op_cost("aten::add", "[[1024,1024],[1024,1024],[]]", '["float","float","Scalar"]', None).bytes == 3 * 4 * 2**20
    assert op_cost("aten::mm", None, None, None) is None


def test_formulas_agree_with_torch_flop_counter_on_a_real_cpu_profile(tmp_path):
    """A CPU profile with shapes of linear + conv + SDPA forward and backward: the trace's GEMM and
    convolution FLOPs equal torch.utils.flop_counter's count of the same step; attention (which
    FlopCounterMode does not count on CPU) equals its own SDPA formulas forward, and 2/2.5 of its backward
    (it counts the scores' recomputation in the backward kernel; MFU's convention does not), and the
    causal step counts half the score FLOPs (FlopCounterMode ignores the mask)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 192)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    x = torch.randn(2, 32, 64, requires_grad=True)
    img = torch.randn(2, 3, 16, 16, requires_grad=True)

    def step(causal):
        q, k, v = lin(x).view(2, 32, 3, 4, 16).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (a.sum() + conv(img).sum()).backward()

    with FlopCounterMode(display=False) as fc:
        step(False)
    expected = fc.get_total_flops()
    shape = (2, 4, 32, 16)
    counted = {}
    for causal in (False, True):
        path = tmp_path / f"cpu_{causal}.json"
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step(causal)
        prof.export_chrome_trace(str(path))
        ev = load_trace(path).events
        ops = ev[ev["cat"] == "cpu_op"]
        # one level of each nest: mm/addmm, convolution (+ backward), the SDPA kernel ops
        names = {"aten::mm", "aten::addmm", "aten::convolution", "aten::convolution_backward",
                 "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
        total = {}
        for r in ops.itertuples():
            if r.name in names:
                c = op_cost(r.name, r.input_dims, r.input_types, r.concrete_inputs)
                assert c is not None, r.name
                key = c.kind + ("_backward" if r.name.endswith("_backward") and c.kind == "attention" else "")
                total[key] = total.get(key, 0.0) + c.flops
        counted[causal] = total
    full = counted[False]
    assert full["gemm"] + full["conv"] == pytest.approx(expected, rel=1e-9)
    assert full["attention"] == sdpa_flop_count(shape, shape, shape)
    assert full["attention_backward"] == pytest.approx(0.8 * sdpa_backward_flop_count(shape, shape, shape, shape))
    half = counted[True]
    assert half["attention"] == full["attention"] / 2 and half["attention_backward"] == full["attention_backward"] / 2
    assert half["gemm"] == full["gemm"] and half["conv"] == full["conv"]


# ------------------------------------------------------------------------------------------ no shapes


def test_a_trace_without_shapes_says_so_and_how_to_record_them():
    t = load_trace(samples.path("a100_alexnet"))
    c = trace_costs(t)
    assert not c.has_shapes and c.model_flops_per_step() == 0 and c.coverage()["flops_fraction"] == 0
    rl = roofline(t)
    d = rl.as_dict()
    assert d["has_shapes"] is False and d["mfu"] is None and NO_SHAPES_NOTE in d["notes"]
    assert "detail='standard'" in NO_SHAPES_NOTE and d["device"] == "A100 40GB"
    assert rl.ops.empty and {"name", "tflops", "roofline_fraction"} <= set(rl.ops.columns)
    v100 = roofline(load_trace(samples.path("v100_nccl_rank0")))
    assert v100.peak.name == "V100 SXM2" and v100.ops.empty and NO_SHAPES_NOTE in v100.as_dict()["notes"]


def test_cli_json_and_text(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "trace", str(GPT / "bf16.standard.trace.json.gz"), "--json",
                        "--step-ms", str(_measured("bf16")), "--top", "3"], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rl = doc["roofline"]
    assert rl["mfu"] == pytest.approx(HAND_FLOPS / (_measured("bf16") * 1e-3) / 989.4e12, rel=0.10)
    assert rl["peak_tflops"]["bf16"] == 989.4 and rl["peak_gbps"] == 4800 and rl["dtype"] == "bf16"
    assert all(k["tflops"] is None or k["tflops"] <= 989.4 for k in doc["top_kernels"])
    assert doc["top_kernels"][0]["tflops"] > 300
    mm = next(o for o in doc["top_ops"] if o["name"] == "aten::mm")
    assert mm["flops"] > 1e12
    r = subprocess.run([sys.executable, "-m", "workbench", "trace", str(samples.path("a100_alexnet"))],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "record_shapes" in r.stdout and "detail='standard'" in r.stdout
    r = subprocess.run([sys.executable, "-m", "workbench", "trace", str(samples.path("a100_alexnet")), "--peak", "bf16"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--peak" in r.stderr
    bad = tmp_path / "ceilings.json"
    bad.write_text('{"not": "ceilings"}')
    for arg in (bad, tmp_path / "missing.json"):
        r = subprocess.run([sys.executable, "-m", "workbench", "trace", str(samples.path("a100_alexnet")), "--ceilings",
                            str(arg)], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(arg) in r.stderr


# ------------------------------------------------------------------------ figure, panel, report


def test_roofline_figure_draws_one_point_per_op_group_under_its_roof(rooflines):
    from workbench.figures.roofline import roofline_figure

    rl = rooflines["bf16"]
    fig = roofline_figure(rl.ops, rl.peak)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    roofs = {d.name: d for d in fig.data if d.mode == "lines"}
    points = [d for d in fig.data if d.mode == "markers+text"]
    drawn = sum(len(d.x) for d in points)
    assert drawn == int(((rl.ops["flops"] > 0) & (rl.ops["bytes"] > 0)).sum())
    bf16 = roofs["H200 SXM bf16 roof"]
    assert max(bf16.y) == 989.4 and min(bf16.y) < 989.4  # flat compute roof and the bandwidth slope
    for d in points:
        for x, y in zip(d.x, d.y):
            assert y <= rl.peak.compute(d.name.split("(")[1].rstrip(")")) * (1 + 1e-9)
    # the marker of the op with the most GPU time is the largest
    big = max(points, key=lambda d: max(d.marker.size))
    assert "aten::mm" in list(big.text)[int(np.argmax(big.marker.size))]


def test_profiler_panel_has_a_roofline_tab():
    pytest.importorskip("ipywidgets")
    from workbench.panels.profiler import TABS, ProfilerPanel

    p = ProfilerPanel(GPT / "bf16.standard.trace.json.gz", raise_errors=True)
    p.tabs.selected_index = [k for k, _ in TABS].index("roofline")
    assert p.tab == "roofline" and "MFU" in p.tables["roofline"].value
    assert any(d.mode == "markers+text" for d in p.figures["roofline"].fig.data)
    assert "aten::mm" in set(p.table_frames["roofline"]["name"])
    q = ProfilerPanel(samples.path("a100_alexnet"), raise_errors=True)
    q.tabs.selected_index = [k for k, _ in TABS].index("roofline")
    assert "record_shapes" in q.tables["roofline"].value


def test_html_report_has_a_roofline_section(tmp_path):
    from workbench.report import trace_report

    out = trace_report(load_trace(GPT / "fp32.standard.trace.json.gz"), tmp_path / "r.html", top=5,
                       step_ms=_measured("fp32"))
    text = out.read_text()
    assert "Roofline" in text and "MFU" in text and "arithmetic intensity" in text


# ------------------------------------------------------------------------------------------ estimator


def _tiny_gpt(d=64, layers=2, heads=4, seq=32, vocab=128):
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln(self.blocks(x)))

    matmul_weights = layers * (3 * d * d + d * d + 8 * d * d) + d * vocab
    return GPT, matmul_weights


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_estimator_counts_model_flops_per_step_like_the_hand_count(precision):
    torch = pytest.importorskip("torch")
    from workbench.capture.estimate import estimate

    d, layers, seq, vocab, batch = 64, 2, 32, 128, 2
    GPT, weights = _tiny_gpt(d, layers, 4, seq, vocab)
    e = estimate(GPT, lambda bs: torch.randint(0, vocab, (bs, seq)), precision=precision, batch_size=batch)
    tokens = batch * seq
    hand = 6 * weights * tokens + 6 * batch * seq * seq * d * layers  # 6·N·tokens + causal attention x3
    assert e.meta["model_flops_per_step"] == pytest.approx(hand, rel=1e-9)
    assert e.meta["flops_by_kind"]["attention"] == pytest.approx(6 * batch * seq * seq * d * layers, rel=1e-9)
    # MFU predicted from a step time: FLOPs / time / peak
    assert e.mfu(step_ms=1.0, peak_tflops=989.4) == pytest.approx(hand / 1e-3 / 989.4e12)


# ----------------------------------------------------------------------- measured ceilings (H200)

CEIL = ROOT / "tests" / "data" / "h200_ceilings"


def test_measured_h200_ceilings_are_real_rates_below_the_datasheet():
    """benchmarks/record_ceilings_h200.py's output on the H200: every measured ceiling below the datasheet
    row it was compared with, in the hardware's order, and turned into a Peak as measured."""
    from workbench.analysis.trace.peaks import peak_from_ceilings

    c = json.loads((CEIL / "ceilings.json").read_text())
    sheet = peak_for(c["device"])
    assert sheet.name == c["datasheet"]["device"] == "H200 SXM"
    m = {k: v["tflops"] for k, v in c["matmul"].items()}
    assert m["bf16"] > m["tf32"] > m["fp32"] > 0
    for dtype, tflops in m.items():
        assert 0.5 * sheet.tflops[dtype] < tflops <= sheet.tflops[dtype], dtype
        assert c["fraction_of_datasheet"][dtype] == pytest.approx(tflops / sheet.tflops[dtype], abs=1e-3)
    assert 0.5 * sheet.gbps < c["copy"]["gbps"] <= sheet.gbps
    p = peak_from_ceilings(c)
    assert p.source == "measured" and p.tflops["bf16"] == m["bf16"] and p.gbps == c["copy"]["gbps"]


def test_known_flops_trace_matches_exactly_and_its_gemm_runs_at_the_measured_ceiling():
    """The trace recorded beside the ceilings: 4 bf16 8192^3 matmuls and a causal SDPA fwd+bwd a step."""
    c = json.loads((CEIL / "ceilings.json").read_text())
    known = c["gemm_sdpa"]
    t = load_trace(CEIL / known["file"])
    rl = roofline(t, measured=c)
    assert rl.step["model_flops"] == pytest.approx(known["gemm_flops_per_step"] + known["attention_flops_per_step"],
                                                   rel=1e-9)
    # MFU on the unprofiled time the capture stored in the trace, against the hand count on the script's own
    # CUDA-event timing of the same step
    assert rl.step["step_ms_source"].startswith("measured without the profiler")
    hand = (known["gemm_flops_per_step"] + known["attention_flops_per_step"]) / (known["median_ms"] * 1e-3) / 989.4e12
    assert rl.step["mfu"] == pytest.approx(hand, rel=0.10)
    gemm = rl.ops[rl.ops["name"] == "aten::mm"].iloc[0]
    assert gemm["count"] == 4 * rl.costs.n_steps  # calls, not GPU activities
    # the same bf16 8192^3 matmul as the ceiling benchmark: the trace's rate equals the measured one
    assert gemm["tflops"] == pytest.approx(c["matmul"]["bf16"]["tflops"], rel=0.05)
    assert rl.as_dict()["measured_peak_tflops"]["bf16"] == c["matmul"]["bf16"]["tflops"]
