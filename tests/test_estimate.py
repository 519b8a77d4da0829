"""Peak-memory estimate on fake tensors, against independent calculations and a real CPU run."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from workbench.analysis.memory.allocator_model import round_size  # noqa: E402
from workbench.analysis.memory.estimate import category_table, estimate_from_record, fits_table  # noqa: E402
from workbench.capture.estimate import compare_configurations, estimate, largest_batch_that_fits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from estimate_families import Encoder, adamw  # noqa: E402

D = 256  # 256 x 4 B = 1 KiB rows: every activation is a multiple of 512 B, so rounding adds nothing


def _stack():
    return nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.Linear(D, D))


def _inputs(bs):
    return (torch.randn(bs, D),)


def _small_encoder():
    return Encoder(d_model=128, layers=2, heads=4, vocab=1000)


def _tokens(bs, seq=128):
    return (torch.randint(0, 1000, (bs, seq)),)


def test_fp32_adamw_parameters_gradients_and_states_are_four_times_the_parameters():
    e = estimate(_stack, _inputs, lambda p: torch.optim.AdamW(p), batch_size=2, cublas_workspace_bytes=0)
    per_param = [round_size(D * D * 4), round_size(D * 4)] * 2
    p_bytes = sum(per_param)
    assert e.peak_phase == "optimizer"  # tiny batch: the optimizer step is the peak
    assert e.by_category["parameters"] == p_bytes
    assert e.by_category["gradients"] == p_bytes
    assert e.by_category["optimizer_state"] == 2 * p_bytes
    # foreach AdamW (CUDA's default) takes one sqrt(exp_avg_sq) per parameter at once
    assert e.by_category["temporaries"] == p_bytes
    assert e.meta["parameters"] == 2 * (D * D + D)


def test_activations_of_a_linear_stack_match_the_saved_tensors():
    bs = 64
    e = estimate(_stack, _inputs, None, batch_size=bs, cublas_workspace_bytes=0, steps=1)
    act = bs * D * 4
    # alive after forward: ReLU's output (saved by ReLU and the second Linear), the model output
    # (saved by pow for the default loss) and the 4-byte loss (a 512 B block)
    assert e.by_module == {"1": act, "2": act, "(outside modules)": 512}


def test_peak_grows_with_batch_size():
    peaks = [estimate(_small_encoder, _tokens, adamw, batch_size=bs).peak_allocated_bytes for bs in (1, 4, 16)]
    assert peaks[0] < peaks[1] < peaks[2]


def test_checkpointing_and_bf16_lower_the_estimate():
    kw = dict(batch_size=16, cublas_workspace_bytes=0)  # the constant would hide the difference
    base = estimate(_small_encoder, _tokens, adamw, **kw)
    ckpt = estimate(_small_encoder, _tokens, adamw, checkpointing=True, **kw)
    bf16 = estimate(_small_encoder, _tokens, adamw, precision="bf16", **kw)
    assert base.peak_phase in ("forward", "backward")
    assert ckpt.meta["checkpointed_modules"] == 2
    assert ckpt.peak_allocated_bytes < 0.8 * base.peak_allocated_bytes
    fwd = lambda e: e.by_phase["forward"] - e.by_category["parameters"] - e.by_category["optimizer_state"]  # noqa: E731
    assert fwd(bf16) < 0.85 * fwd(base)
    assert sum(bf16.by_module.values()) < 0.8 * sum(base.by_module.values())


def test_tensor_peak_matches_a_real_cpu_step_seen_by_the_profiler():
    """The same two steps run for real on the CPU; torch.profiler's allocation records give the peak."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    def model_fn():
        return nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, 2 * D), nn.LayerNorm(2 * D),
                             nn.ReLU(), nn.Linear(2 * D, D // 2))

    def opt_fn(p):
        return torch.optim.AdamW(p, foreach=True)

    e = estimate(model_fn, _inputs, opt_fn, batch_size=48, cublas_workspace_bytes=0)
    model = model_fn()
    opt = opt_fn(list(model.parameters()))
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            (x,) = _inputs(48)
            out = model(x)
            loss = out.float().pow(2).mean()
            del out, x
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    nodes, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        n = stack.pop()
        if n.tag == _EventType.Allocation:
            nodes.append(n)
        stack.extend(n.children)
    nodes.sort(key=lambda n: n.start_time_ns)
    cur = peak = 0
    for n in nodes:
        cur += n.extra_fields.alloc_size
        peak = max(peak, cur)
    real = peak + param_bytes
    # the only difference: AdamW's host-side step counters (4 B each), not device memory on CUDA
    assert abs(e.peak_tensor_bytes - real) <= 64, (e.peak_tensor_bytes, real)
    assert len(nodes) > 100


def test_largest_batch_and_configurations():
    one = estimate(_small_encoder, _tokens, adamw, batch_size=8)
    budget = one.peak_reserved_range[1]  # the search fits the high end of the reserved interval
    bs, e = largest_batch_that_fits(_small_encoder, _tokens, adamw, budget, high=64)
    assert 8 <= bs < 64 and e.peak_reserved_range[1] <= budget and e.peak_reserved_bytes <= budget
    above = estimate(_small_encoder, _tokens, adamw, batch_size=bs + 1)
    assert above.peak_reserved_range[1] > budget
    assert largest_batch_that_fits(_small_encoder, _tokens, adamw, 1000)[0] == 0
    df = compare_configurations(_small_encoder, _tokens, adamw, budget, batch_size=16)
    assert len(df) == 4 and set(df["precision"]) == {"fp32", "bf16"}
    assert df["fits"].dtype == bool and (df["peak_reserved_bytes"] >= df["peak_allocated_bytes"]).all()
    fp32_plain = df[(df.precision == "fp32") & ~df.checkpointing].iloc[0]
    bf16_ckpt = df[(df.precision == "bf16") & df.checkpointing].iloc[0]
    assert bf16_ckpt.peak_allocated_bytes < fp32_plain.peak_allocated_bytes


def test_record_round_trips_and_tables():
    import json

    from workbench.capture.estimate import trace_step_memory

    rec = trace_step_memory(_stack, _inputs, adamw, batch_size=4)
    again = json.loads(json.dumps(rec))  # categories come back with string keys
    a, b = estimate_from_record(rec), estimate_from_record(again)
    assert a.to_dict() == b.to_dict()
    ct = category_table(a)
    assert ct["bytes"].sum() == a.peak_allocated_bytes
    ft = fits_table([a], budget_bytes=a.peak_reserved_bytes)
    assert bool(ft["fits"].iat[0]) and int(ft["headroom_bytes"].iat[0]) == 0
    assert a.by_category["workspace"] == 2 * (32 << 20)  # forward and backward cuBLAS workspaces


def test_cpu_autocast_is_restored_and_bad_arguments_raise():
    estimate(_stack, _inputs, adamw, batch_size=2, precision="bf16")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = nn.functional.linear(torch.randn(4, 8), torch.randn(8, 8))
        z = nn.functional.layer_norm(y, (8,))
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16  # CPU policy, not the CUDA one
    with pytest.raises(ValueError, match="precision"):
        estimate(_stack, _inputs, precision="int8", batch_size=2)
    with pytest.raises(ValueError, match="cuda"):
        estimate(_stack, _inputs, batch_size=2, device="cpu")
    with pytest.raises(TypeError, match="nn.Module"):
        estimate(lambda: 3, _inputs, batch_size=2)


def _python_autocast_kernels():
    return sorted(k for k in getattr(torch.library, "_impls", set()) if k.endswith("/AutocastCPU"))


def test_estimate_twice_in_one_process_registers_and_releases_the_autocast_kernels():
    # torch 2.4-2.12 refuse a second Python kernel for one op and key unless the first Library is
    # gone: every estimate must release what it registered, and register each op once.
    before = _python_autocast_kernels()
    first = estimate(_small_encoder, _tokens, adamw, batch_size=2, precision="bf16")
    assert _python_autocast_kernels() == before
    fp32 = estimate(_small_encoder, _tokens, adamw, batch_size=2, precision="fp32")
    again = estimate(_small_encoder, _tokens, adamw, batch_size=2, precision="bf16")
    assert _python_autocast_kernels() == before
    assert again.peak_allocated_bytes == first.peak_allocated_bytes
    assert again.by_category == first.by_category
    assert fp32.peak_allocated_bytes > first.peak_allocated_bytes  # bf16 activations are half the size


def test_a_python_autocast_kernel_of_the_user_survives_the_estimate():
    calls = []
    no_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def cumsum(x, dim, dtype=None):
        calls.append(x.dtype)
        with torch._C._ExcludeDispatchKeyGuard(no_autocast):
            return torch.ops.aten.cumsum.default(x, dim, dtype=dtype)

    lib = torch.library.Library("aten", "IMPL")
    try:
        lib.impl("cumsum", cumsum, "AutocastCPU")
        e = estimate(_small_encoder, _tokens, adamw, batch_size=2, precision="bf16")
        assert e.peak_allocated_bytes > 0
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.cumsum(torch.ones(4), 0)
        assert calls == [torch.float32]  # the user's kernel is the one that runs again
    finally:
        lib._destroy()
    calls.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.cumsum(torch.ones(4), 0)
    assert calls == []


def test_a_half_billion_parameter_model_costs_no_real_memory():
    def big():
        return nn.Sequential(nn.Linear(16384, 16384), nn.Linear(16384, 16384))  # 537M params, 2 GiB fp32

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    e = estimate(big, lambda bs: (torch.randn(bs, 16384),), adamw, batch_size=4)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert e.meta["parameters"] == 2 * (16384 * 16384 + 16384)
    assert e.peak_allocated_bytes > 5 * e.meta["parameter_bytes"]  # params, grads, 2 states, sqrt temps
    assert grown_mib < 200, f"estimate grew the process by {grown_mib:.0f} MiB"
    assert os.environ.get("OMP_NUM_THREADS") == "1"


def test_the_harness_workload_and_configuration_give_the_same_estimate_as_the_functions():
    import typing

    from workbench.analysis.experiment import Headroom
    from workbench.capture.configurations import Workload, amp_bf16, checkpointing, combine
    from workbench.capture.runner import find_max_batch_size

    def loss(model, batch):
        (x,) = batch
        out = model(x)
        return out.float().pow(2).mean(), out

    work = Workload(model=_small_encoder, batch=lambda n, device: _tokens(n), loss=loss, optimizer=adamw,
                    batch_size=8)
    plain = estimate(_small_encoder, _tokens, adamw, batch_size=8)
    assert estimate(work).to_dict()["peak_allocated_bytes"] == plain.peak_allocated_bytes
    # amp_bf16 + checkpointing of the encoder's layers == precision="bf16", checkpointing=True
    layer = type(_small_encoder().layers[0])
    via_config = estimate(work, combine(amp_bf16(), checkpointing(layer)))
    via_kwargs = estimate(_small_encoder, _tokens, adamw, batch_size=8, precision="bf16", checkpointing=True)
    assert via_config.peak_allocated_bytes == via_kwargs.peak_allocated_bytes
    assert via_config.by_category == via_kwargs.by_category
    assert via_config.meta["precision"] == "bf16" and via_config.meta["checkpointed_modules"] == 2
    # both batch-size searches answer with one type
    room = largest_batch_that_fits(work, amp_bf16(), budget_bytes=via_kwargs.peak_reserved_range[1], high=32)
    assert isinstance(room, Headroom) and room.estimate.meta["precision"] == "bf16"
    assert room.peak_reserved_bytes <= room.limit_bytes
    assert bool(room.tries.set_index("batch_size").loc[room.batch_size, "fits"])
    assert tuple(room) == (room.batch_size, room.estimate)
    assert typing.get_type_hints(find_max_batch_size)["return"] is Headroom  # the harness's search: the same type
