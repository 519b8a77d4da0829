"""The experiment harness on a CUDA device (run on the H200):

    python -m pytest -m gpu tests/gpu/test_harness_gpu.py -v

Reproduces the direction and rough size of effects measured on the H200 for a 12-layer d=1024
transformer at batch 32x512 (the harness ledger workbench/samples/results/h200_harness.ledger.json:
fp32 339 ms / 14.4 GiB, TF32 94 ms, bf16 autocast 42 ms / 9.4 GiB, fp32 + per-block checkpointing
419 ms / 3.95 GiB) on a 6-layer version of the same shape, with margins wide enough for a smaller
model. About a minute in all.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

GIB = 2**30
D, HEADS, SEQ, VOCAB = 1024, 16, 512, 2048


def _model_classes():
    """The notebooks' and benchmarks' transformer (workbench/capture/models.py) at the H200 sizes; one
    Block class for the model and for checkpointing(Block) (isinstance needs the same class)."""
    from workbench.capture.models import LM, Block

    return Block, lambda layers: LM(layers=layers, d=D, heads=HEADS, vocab=VOCAB)


def _workload(layers, batch_size):
    import torch

    from workbench.capture.configurations import Workload

    _, LM = _model_classes()

    def batch(n, device):
        tokens = torch.randint(0, VOCAB, (n, SEQ + 1), device=device)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(model, b):
        x, y = b
        logits = model(x)
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1)), logits

    return Workload(
        model=lambda: LM(layers), batch=batch, loss=loss,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4, fused=True),
        batch_size=batch_size, tokens_per_sample=SEQ,
    )


@pytest.fixture(scope="module")
def experiment():
    from workbench.capture.configurations import amp_bf16, amp_fp16, checkpointing, combine, fp32, tf32
    from workbench.capture.runner import run_experiment

    Block, _ = _model_classes()
    configs = [fp32(), tf32(), amp_bf16(), amp_fp16(), checkpointing(Block),
               combine(amp_bf16(), checkpointing(Block))]
    exp = run_experiment(_workload(6, 32), configs, device="cuda", steps=6, warmup=2, check_steps=2,
                         progress=False, name="gpu-test")
    print("\n" + exp.ledger[["configuration", "status", "step_ms_median", "peak_allocated_bytes",
                              "energy_j_per_step", "power_w", "check_verdict", "check_loss_rel_err"]].to_string())
    return exp


def _row(exp, name):
    r = exp.result(name)
    assert r.status == "ok", f"{name}: {r.status}: {r.error}"
    return r.row


def test_every_configuration_ran_with_cuda_events(experiment):
    led = experiment.ledger
    assert (led["status"] == "ok").all(), led[["configuration", "status", "error"]].to_string()
    assert set(led["timer"]) == {"cuda_events"} and set(led["memory_source"]) == {"cuda_allocator"}
    assert led["gpu"].str.contains("NVIDIA").all() and led["cuda_version"].notna().all()
    assert (led["peak_reserved_bytes"] >= led["peak_allocated_bytes"]).all()
    for r in experiment.results:
        assert len(r.step_ms) == 6 and min(r.step_ms) > 0


def test_tf32_and_bf16_faster_than_fp32(experiment):
    fp32 = _row(experiment, "fp32")["step_ms_median"]
    tf32 = _row(experiment, "tf32")["step_ms_median"]
    bf16 = _row(experiment, "amp_bf16")["step_ms_median"]
    fp16 = _row(experiment, "amp_fp16")["step_ms_median"]
    # H200, 12 layers: TF32 0.34x and bf16 0.14x of fp32
    assert tf32 < 0.6 * fp32, (tf32, fp32)
    assert bf16 < 0.4 * fp32, (bf16, fp32)
    assert fp16 < 0.4 * fp32, (fp16, fp32)
    assert bf16 < tf32
    thr = _row(experiment, "amp_bf16")
    assert thr["samples_per_s"] == pytest.approx(32 / (bf16 / 1e3))
    assert thr["tokens_per_s"] == pytest.approx(32 * SEQ / (bf16 / 1e3))


def test_bf16_and_checkpointing_lower_peak_memory(experiment):
    fp32 = _row(experiment, "fp32")
    bf16 = _row(experiment, "amp_bf16")
    ck = _row(experiment, "checkpoint(Block)")
    bf16_ck = _row(experiment, "amp_bf16+checkpoint(Block)")
    # H200, 12 layers: bf16 0.61x, checkpointing 0.26x of fp32's peak; checkpointing 1.23x the time
    assert bf16["peak_allocated_bytes"] < 0.85 * fp32["peak_allocated_bytes"]
    assert ck["peak_allocated_bytes"] < 0.6 * fp32["peak_allocated_bytes"]
    assert bf16_ck["peak_allocated_bytes"] < bf16["peak_allocated_bytes"]
    assert 1.05 * fp32["step_ms_median"] < ck["step_ms_median"] < 1.8 * fp32["step_ms_median"]
    assert fp32["peak_allocated_bytes"] > 2 * GIB  # the activations are real


def test_energy_per_step_from_nvml(experiment):
    fp32 = _row(experiment, "fp32")
    bf16 = _row(experiment, "amp_bf16")
    e = fp32.get("energy_j_per_step", float("nan"))
    assert e is not None and not math.isnan(e) and e > 0, f"no energy measured: {fp32.get('energy_note')}"
    assert 30 < fp32["power_w"] < 1500
    assert bf16["energy_j_per_step"] < e  # a 3x shorter step costs less energy


def test_numerical_check_on_gpu(experiment):
    tf32 = experiment.result("tf32").check
    bf16 = experiment.result("amp_bf16").check
    fp16 = experiment.result("amp_fp16").check
    assert 0 < tf32.loss_rel_err < 5e-3 and tf32.verdict == "ok", tf32.message
    assert 0 < bf16.loss_rel_err < 5e-2 and bf16.verdict == "ok", bf16.message
    assert fp16.verdict == "ok", fp16.message
    assert experiment.result("checkpoint(Block)").check.loss_rel_err < 1e-5


def test_trace_diff_of_fp32_and_bf16_traces():
    from workbench.analysis import trace_diff
    from workbench.capture.configurations import amp_bf16, fp32
    from workbench.capture.runner import run_experiment
    from workbench.io import load_trace

    exp = run_experiment(_workload(2, 8), [fp32(), amp_bf16()], device="cuda", steps=3, warmup=1,
                         check_steps=1, trace=True, progress=False)
    paths = exp.ledger.set_index("configuration")["trace_path"]
    d = trace_diff(load_trace(paths["fp32"]), load_trace(paths["amp_bf16"]))
    assert d.base_busy.kernel_count > 0 and d.test_busy.kernel_count > 0
    assert d.appeared_kernels and d.disappeared_kernels  # fp32 GEMMs replaced by bf16 ones
    assert d.kernel_delta_us < 0  # less kernel time in bf16


def test_headroom_with_real_out_of_memory():
    import torch

    from workbench.capture.runner import find_max_batch_size

    total = torch.cuda.get_device_properties(0).total_memory
    cap = 8 * GIB
    before = torch.cuda.memory_allocated()
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        room = find_max_batch_size(_workload(4, 8), device="cuda", start=8, max_batch_size=1024, progress=False)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    tries = room.tries.set_index("batch_size")
    print("\n" + room.tries.to_string())
    assert 8 <= room.batch_size < 1024
    assert room.peak_reserved_bytes <= cap
    nxt = tries.loc[room.batch_size + 1]
    assert not bool(nxt["fits"]) and nxt["reason"] == "out of memory"
    # memory is given back after every try
    assert torch.cuda.memory_allocated() - before < 64 * 2**20
