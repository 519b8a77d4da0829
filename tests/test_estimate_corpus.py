"""Every torch.nn layer family (and the common functional ops) runs through the estimator: a generated corpus
of small models (tests/estimate_corpus.py), all of them at fp32, a sample at every other precision and with
activation checkpointing. What is checked is that the fake step runs and gives a positive peak (the accuracy
tests are tests/test_estimate.py and tests/test_cudnn_*.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from estimate_corpus import corpus  # noqa: E402

from workbench.capture.estimate import estimate  # noqa: E402

CASES = corpus()
# every family at the other precisions and with checkpointing: every third case (the sample spans them all)
SAMPLE = CASES[::3]


def _run(case, **kw):
    e = estimate(case.model, case.batch, case.optimizer, batch_size=3, loss_fn=case.loss, steps=1, **kw)
    assert e.peak_allocated_bytes > 0 and e.peak_reserved_bytes >= e.peak_allocated_bytes
    return e


def test_the_corpus_has_sixty_models_or_more_and_every_family():
    assert len(CASES) >= 60
    assert {c.family for c in CASES} == {"conv", "norm", "rnn", "embedding", "attention", "spatial", "loss",
                                         "functional"}
    assert {c.family for c in SAMPLE} == {c.family for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_model_of_the_corpus_runs_at_fp32(case):
    _run(case, precision="fp32")


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_a_sample_runs_at_every_precision(case, precision):
    _run(case, precision=precision)


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_a_sample_runs_with_checkpointing(case):
    _run(case, precision="bf16", checkpointing=True)


def test_conv1d_at_fp32_gets_a_workspace_bound_and_a_calibration_key():
    from workbench.capture.cudnn_calibration import convolution_calls

    case = next(c for c in CASES if c.name == "conv1d")
    e = _run(case, precision="fp32")
    assert e.meta["conv_workspaces"]["calls"] > 0
    calls = convolution_calls(case.model, case.batch, case.optimizer, precision="fp32", batch_size=3)
    assert calls and all(len(c["x"]) == 3 for c in calls.values())


def test_data_dependent_values_are_said():
    by_name = {c.name: c for c in CASES}
    packed = _run(by_name["lstm_packed"], precision="fp32")
    assert packed.meta["data_dependent"]["packed_sequences"] >= 1
    ctc = _run(by_name["ctc"], precision="fp32")
    assert ctc.meta["data_dependent"]["ctc_target_length"] == 3


def test_cudnn_rules_take_1d_and_3d_shapes():
    from workbench.analysis.memory.cudnn_model import as_cudnn_shape, conv_workspace_upper_bytes, fft_workspace_bytes

    assert as_cudnn_shape([2, 4, 16]) == [2, 4, 1, 16] and as_cudnn_shape([2, 4, 8, 8, 8]) == [2, 4, 8, 8, 8]
    # a 1-d convolution is the 2-d one of height 1, as torch hands it to cuDNN
    one = conv_workspace_upper_bytes("forward", [2, 4, 16], [8, 4, 3], [2, 8, 14], 4)
    assert one == conv_workspace_upper_bytes("forward", [2, 4, 1, 16], [8, 4, 1, 3], [2, 8, 1, 14], 4) > 0
    three = conv_workspace_upper_bytes("forward", [2, 4, 8, 8, 8], [8, 4, 3, 3, 3], [2, 8, 6, 6, 6], 4)
    assert three == fft_workspace_bytes([2, 4, 8, 8, 8], [8, 4, 3, 3, 3]) > 0
    assert conv_workspace_upper_bytes("backward_data", [2, 8, 16], [8, 4, 4], [2, 4, 34], 4, transposed=True) > 0


def test_an_existing_model_handed_in_is_left_as_it_was():
    # `estimate(lambda: model, ...)` with a model already built (real CPU tensors): the estimate traces a copy
    # of its structure; the model keeps its own parameters (found by the GPU corpus run, where a module shared
    # between two cases came back with fake parameters)
    import torch
    from torch import nn

    from workbench.capture.estimate import estimate

    model = nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(128, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    made = estimate(lambda: nn.Sequential(nn.Conv2d(2, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(128, 4)),
                    lambda bs: (torch.randn(bs, 2, 8, 8),), batch_size=4, precision="bf16")
    handed = estimate(lambda: model, lambda bs: (torch.randn(bs, 2, 8, 8),), batch_size=4, precision="bf16")
    assert handed.peak_allocated_bytes == made.peak_allocated_bytes
    assert all(type(p) is nn.Parameter and type(p.data) is torch.Tensor for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model(torch.randn(1, 2, 8, 8)).shape == (1, 4)
