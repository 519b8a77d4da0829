"""Experiment harness on CPU with real small models (workbench.capture.configurations, runner, environment)."""

from __future__ import annotations

import math
import statistics

import pytest

torch = pytest.importorskip("torch")

from workbench.capture.configurations import (  # noqa: E402
    Configuration,
    Workload,
    amp_bf16,
    amp_fp16,
    batch_size_sweep,
    channels_last,
    checkpointing,
    combine,
    compiled,
    configuration,
    fp32,
    pure_bf16,
    pure_fp16,
    tf32,
)
from workbench.capture.environment import measure_cpu_peak_bytes  # noqa: E402
from workbench.capture.runner import find_max_batch_size, run_experiment  # noqa: E402
from workbench.errors import NoDevice, WorkbenchError  # noqa: E402

torch.set_num_threads(1)

D, SEQ, VOCAB = 32, 16, 50


class Block(torch.nn.Module):
    """A small pre-norm transformer block (attention + MLP)."""

    def __init__(self, d=D, heads=4):
        super().__init__()
        self.n1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.n2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.n2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, layers=2, d=D):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, d)
        self.blocks = torch.nn.Sequential(*[Block(d) for _ in range(layers)])
        self.head = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens):
        return self.head(self.blocks(self.emb(tokens)))


def lm_batch(n, device):
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), device=device)
    return tokens[:, :-1], tokens[:, 1:]


def lm_loss(model, batch):
    x, y = batch
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1)), logits


def lm_workload(**kw):
    args = dict(model=TinyLM, batch=lm_batch, loss=lm_loss, batch_size=4, tokens_per_sample=SEQ)
    args.update(kw)
    return Workload(**args)


# ---------------------------------------------------------------------------------------------------


def test_fp32_vs_bf16_autocast_small_nonzero_error_and_ledger_columns():
    work = lm_workload()
    exp = run_experiment(work, [fp32(), amp_bf16()], steps=3, warmup=1, check_steps=2,
                         progress=False, name="t-bf16")
    led = exp.ledger
    assert list(led["configuration"]) == ["fp32", "amp_bf16"]
    assert (led["status"] == "ok").all()
    # where and when on every row
    for col in ("machine", "device", "gpu", "torch_version", "date", "experiment"):
        assert led[col].notna().all(), col
    assert set(led["torch_version"]) == {torch.__version__}
    assert set(led["device"]) == {"cpu"} and set(led["gpu"]) == {"none"}
    assert set(led["timer"]) == {"wall_clock"}
    # timing and throughput are consistent with the raw step times
    for r in exp.results:
        med = statistics.median(r.step_ms)
        assert len(r.step_ms) == 3
        assert r.row["step_ms_median"] == pytest.approx(med)
        assert r.row["step_ms_q1"] <= med <= r.row["step_ms_q3"]
        assert r.row["samples_per_s"] == pytest.approx(4 / (med / 1e3))
        assert r.row["tokens_per_s"] == pytest.approx(4 * SEQ / (med / 1e3))
        assert r.row["peak_allocated_bytes"] > r.row["resident_bytes"] > 0
    ref, bf = exp.result("fp32").check, exp.result("amp_bf16").check
    assert ref.loss_rel_err == 0 and ref.grad_max_rel_err == 0 and ref.verdict == "ok"
    # bf16 autocast: a real, small difference (bf16 keeps 8 mantissa bits: ~4e-3 per rounding)
    assert 0 < bf.loss_rel_err < 0.02
    assert 1e-4 < bf.output_max_rel_err < 0.1
    assert 1e-4 < bf.grad_max_rel_err < 0.5
    assert bf.update_vanished_fraction == 0 and bf.param_dtype == "fp32"
    assert bf.verdict == "ok", bf.message

    # Independent computation of step 0: same seed, same batch, the loss with and without autocast.
    torch.manual_seed(0)
    model = TinyLM()
    torch.manual_seed(0 * 7919 + 1 + 0)
    batch = lm_batch(4, torch.device("cpu"))
    torch.manual_seed(0 * 104729 + 7 + 0)
    l32 = lm_loss(model, batch)[0].item()
    torch.manual_seed(0 * 104729 + 7 + 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        l16 = lm_loss(model, batch)[0].item()
    steps = exp.checks()
    s0 = steps[steps["step"] == 0].set_index("configuration")["loss"]
    assert s0["fp32"] == pytest.approx(l32, rel=1e-6)
    assert s0["amp_bf16"] == pytest.approx(l16, rel=1e-6)
    assert bf.per_step.loc[0, "loss_rel_err"] == pytest.approx(abs(l16 - l32) / abs(l32), rel=1e-4)


def _sgd_unit_workload(lr=1e-2):
    """Weights ~1.0 and lr*grad ~1e-5: the update is far below float16's resolution at 1.0 (~1e-3)."""

    def model():
        m = torch.nn.Linear(64, 1, bias=False)
        with torch.no_grad():
            m.weight.copy_(1.0 + 0.01 * torch.randn_like(m.weight))
        return m

    return Workload(
        model=model,
        batch=lambda n, dev: torch.rand(n, 64, device=dev) + 0.5,
        loss=lambda m, x: m(x).float().mean() * 1e-3,
        optimizer=lambda p: torch.optim.SGD(p, lr=lr),
        batch_size=8,
    )


def test_vanishing_updates_flagged_in_pure_fp16_only():
    exp = run_experiment(_sgd_unit_workload(), [fp32(), amp_fp16(), pure_fp16()],
                         steps=1, warmup=0, check_steps=2, progress=False)
    c32, amp, pure = (exp.result(n).check for n in ("fp32", "amp_fp16", "pure_fp16"))
    assert c32.verdict == "ok" and c32.update_underflow_fraction == 0
    assert amp.verdict == "ok" and amp.update_vanished_fraction == 0  # fp32 master weights keep the update
    assert pure.param_dtype == "fp16"
    assert pure.verdict == "vanishing_updates"
    assert pure.update_vanished_fraction == 1.0 and pure.update_underflow_fraction == 1.0
    assert "fp16" in pure.message
    assert exp.ledger.set_index("configuration").loc["pure_fp16", "check_verdict"] == "vanishing_updates"

    # Independently: the same SGD step on float16 weights leaves them bit-identical.
    w = (1.0 + 0.01 * torch.randn(64)).half()
    g = torch.full_like(w, 1e-3)
    assert torch.equal(w - 1e-2 * g, w)
    assert not torch.equal(w.float() - 1e-2 * g.float(), w.float())


def test_fp16_gradient_underflow_without_scaler():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)
            self.b = torch.nn.Linear(64, 1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    # A loss this small is what fp16 gradients meet without scaling: they flush to zero.
    work = Workload(M, lambda n, dev: torch.rand(n, 64, device=dev), lambda m, x: m(x).float().mean() * 1e-8,
                    batch_size=8)
    exp = run_experiment(work, [fp32(), amp_fp16(), amp_fp16(grad_scaler=False)],
                         steps=1, warmup=0, check_steps=1, progress=False)
    raw = exp.result("amp_fp16_noscaler").check
    scaled = exp.result("amp_fp16").check
    assert raw.verdict == "grad_underflow" and raw.grad_underflow_fraction > 0.5
    assert "GradScaler" in raw.message
    assert scaled.grad_underflow_fraction < 0.1 * raw.grad_underflow_fraction


def test_measure_cpu_peak_bytes_counts_real_allocations():
    mib = 1 << 20

    def two_then_free():
        a = torch.empty(mib, dtype=torch.float32)  # 4 MiB
        b = torch.empty(mib, dtype=torch.float32)  # 4 MiB
        del a
        c = torch.empty(mib // 2, dtype=torch.float32)  # 2 MiB, after a's 4 MiB came back
        del b, c

    peak = measure_cpu_peak_bytes(two_then_free)
    assert 8 * mib <= peak < 8 * mib + 64 * 1024


def test_checkpointing_lowers_cpu_peak_memory_in_profiler_accounting():
    work = lm_workload(model=lambda: TinyLM(layers=4, d=64), batch_size=8)
    exp = run_experiment(work, [fp32(), checkpointing(Block)], steps=2, warmup=1, check_steps=1,
                         progress=False)
    r32, ck = exp.result("fp32").row, exp.result("checkpoint(Block)").row
    assert r32["memory_source"] == ck["memory_source"] == "cpu_profiler"
    assert r32["resident_bytes"] == ck["resident_bytes"]  # same weights and optimizer state
    # activations of 4 blocks are recomputed instead of kept: the step's peak drops a lot
    assert ck["step_peak_bytes"] < 0.7 * r32["step_peak_bytes"]
    assert ck["peak_allocated_bytes"] < r32["peak_allocated_bytes"]
    # recomputation gives the same numbers
    assert exp.result("checkpoint(Block)").check.loss_rel_err == 0
    assert exp.result("checkpoint(Block)").check.grad_max_rel_err < 1e-5


def test_checkpointing_by_name_and_missing_type_is_a_clear_error():
    model = TinyLM()
    checkpointing("Block").transform(model, torch.device("cpu"))
    assert sum("forward" in vars(m) for m in model.modules()) == 2  # the two blocks only
    with pytest.raises(WorkbenchError, match="no module of type Conv2d.*Block"):
        checkpointing(torch.nn.Conv2d).transform(TinyLM(), torch.device("cpu"))
    with pytest.raises(WorkbenchError, match="needs the module type"):
        checkpointing()


def test_each_configuration_gets_a_fresh_model_and_identical_batches():
    built = []

    def model():
        built.append(1)
        return TinyLM()

    work = lm_workload(model=model)
    same = fp32().replace(name="fp32_again")
    exp = run_experiment(work, [fp32(), same], steps=2, warmup=1, check_steps=2, progress=False)
    assert len(built) == 2
    chk = exp.result("fp32_again").check
    # identical start and batches: bit-identical losses, outputs and gradients over 2 steps
    assert chk.loss_rel_err == 0 and chk.output_max_rel_err == 0 and chk.grad_max_rel_err == 0
    # without fp32 in the list, a check-only fp32 pass runs first and is the reference
    built.clear()
    exp = run_experiment(work, [amp_bf16()], steps=1, warmup=0, check_steps=1, progress=False)
    assert len(built) == 2 and exp.reference == "fp32"
    assert exp.result("amp_bf16").check.loss_rel_err > 0


def test_user_configuration_skipped_and_failing_rows():
    calls = []

    @configuration("my_bf16", precision="bf16")
    def my_bf16(device):
        calls.append(device.type)
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def broken(model, device):
        raise ValueError("this transform is broken")

    bad = Configuration("broken", transform=broken)
    work = lm_workload()
    with pytest.warns(UserWarning, match="broken"):
        exp = run_experiment(work, [fp32(), amp_bf16(), my_bf16, tf32(), bad],
                             steps=2, warmup=1, check_steps=1, progress=False)
    led = exp.ledger.set_index("configuration")
    assert led.loc["tf32", "status"] == "skipped" and "CUDA" in led.loc["tf32", "error"]
    assert led.loc["broken", "status"] == "error" and "this transform is broken" in led.loc["broken", "error"]
    assert led.loc["my_bf16", "status"] == "ok"
    # the hook ran around every forward: 1 check step + 2 timed + 1 memory-measuring step
    assert len(calls) == 4
    # the user's autocast hook computes exactly what the built-in one does
    assert exp.result("my_bf16").check.loss_rel_err == exp.result("amp_bf16").check.loss_rel_err


def test_combine_batch_size_sweep_and_compile_eager():
    combo = combine(amp_bf16(), checkpointing(Block))
    assert combo.name == "amp_bf16+checkpoint(Block)" and combo.precision == "bf16"
    sweep = batch_size_sweep([2, 8])
    assert [c.name for c in sweep] == ["bs=2", "bs=8"]
    work = lm_workload()
    exp = run_experiment(work, [fp32(), combo, *sweep, compiled(backend="eager")],
                         steps=2, warmup=1, check_steps=1, progress=False)
    led = exp.ledger.set_index("configuration")
    assert (led["status"] == "ok").all(), led["error"].to_dict()
    assert list(led.loc[["bs=2", "bs=8"], "batch_size"]) == [2, 8]
    # more samples per step: more memory
    assert led.loc["bs=8", "peak_allocated_bytes"] > led.loc["bs=2", "peak_allocated_bytes"]
    assert led.loc["bs=2", "check_verdict"] == "n/a"  # a different batch is not comparable
    assert led.loc["amp_bf16+checkpoint(Block)", "check_verdict"] == "ok"
    # dynamo with the eager backend computes the same thing; parameter names match through _orig_mod
    ck = exp.result("compile").check
    assert ck.loss_rel_err < 1e-6 and ck.grad_max_rel_err < 1e-5


def test_channels_last_on_a_small_cnn():
    def cnn():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))

    work = Workload(cnn, lambda n, dev: (torch.randn(n, 3, 16, 16, device=dev), torch.randint(0, 4, (n,), device=dev)),
                    lambda m, b: (torch.nn.functional.cross_entropy(m(b[0]), b[1]), m(b[0])), batch_size=4)
    exp = run_experiment(work, [fp32(), channels_last()], steps=2, warmup=1, check_steps=1, progress=False)
    chk = exp.result("channels_last").check
    assert chk.verdict == "ok" and chk.loss_rel_err < 1e-5
    assert channels_last().batch_transform(torch.randn(1, 3, 4, 4)).is_contiguous(memory_format=torch.channels_last)


def test_inference_workload_compares_loss_and_outputs():
    work = lm_workload(train=False)
    exp = run_experiment(work, [fp32(), amp_bf16()], steps=2, warmup=1, check_steps=1, progress=False)
    chk = exp.result("amp_bf16").check
    assert chk.output_max_rel_err > 0 and math.isnan(chk.grad_max_rel_err)
    assert chk.verdict == "ok"


def test_ctrl_c_returns_finished_configurations():
    def interrupting(device):
        raise KeyboardInterrupt

    stop = Configuration("stop", context=interrupting)
    exp = run_experiment(lm_workload(), [fp32(), stop, amp_bf16()], steps=1, warmup=0, check_steps=1,
                         progress=False)
    assert exp.interrupted
    assert [r.name for r in exp.results] == ["fp32"]


def test_bad_arguments_are_clear():
    with pytest.raises(WorkbenchError, match="unique"):
        run_experiment(lm_workload(), [fp32(), fp32()], progress=False)
    with pytest.raises(WorkbenchError, match="at least one"):
        run_experiment(lm_workload(), [], progress=False)
    with pytest.raises(WorkbenchError, match="reference 'nope'"):
        run_experiment(lm_workload(), [fp32()], reference="nope", progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(NoDevice, match="no CUDA device"):
            run_experiment(lm_workload(), [fp32()], device="cuda", progress=False)
    with pytest.warns(UserWarning, match="must return a tensor"):
        exp = run_experiment(Workload(TinyLM, lm_batch, lambda m, b: "x"), [fp32()], steps=1, warmup=0,
                             check_steps=0, progress=False)
    assert exp.result("fp32").status == "error"


def test_a_configuration_at_bf16_runs_autocast_unless_it_says_otherwise():
    # Configuration(precision="bf16") without autocast= used to run plain fp32; bf16 means autocast bf16,
    # as in the estimator (estimate(..., precision="bf16"))
    seen = []

    def loss(model, batch):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return lm_loss(model, batch)

    mine = Configuration("mine", precision="bf16")
    assert mine.autocast is True and Configuration("x", precision="fp16").autocast is True
    assert Configuration("x").autocast is False and pure_bf16().autocast is False
    exp = run_experiment(lm_workload(loss=loss), [mine], steps=1, warmup=0, check_steps=0, reference=None,
                           energy=False, memory=False, progress=False)
    assert exp.result("mine").status == "ok", exp.result("mine").error
    assert seen and all(s == (True, torch.bfloat16) for s in seen), seen
    # a new precision: autocast follows it where it followed the old one; pure_bf16 (casts by itself) keeps off
    assert fp32().replace(precision="bf16").autocast is True
    assert amp_bf16().replace(precision="fp32").autocast is False
    assert pure_bf16().replace(precision="fp16").autocast is False
    assert combine(fp32(), pure_bf16()).autocast is False and combine(fp32(), mine).autocast is True
    with pytest.raises(WorkbenchError, match="autocast needs precision"):
        Configuration("x", precision="fp32", autocast=True)


def test_the_estimator_runs_a_bf16_configuration_under_autocast():
    from workbench.capture.estimate import estimate

    work = lm_workload(model=lambda: TinyLM(layers=1), batch_size=64)

    def peak(config, **kw):  # activations only: no cuBLAS workspace (it would be the peak of so small a model)
        return estimate(work, config, cublas_workspace_bytes=0, **kw).peak_allocated_bytes

    plain = peak(Configuration("mine", precision="bf16"))
    assert plain == peak(amp_bf16()) != peak(fp32())
    assert peak(fp32(), precision="bf16") == plain


def test_headroom_on_cpu_against_a_budget():
    work = lm_workload(model=lambda: TinyLM(layers=1), batch_size=2)
    with pytest.raises(WorkbenchError, match="memory_budget_bytes"):
        find_max_batch_size(work, progress=False)
    # budget: what batch 12 needs, measured by the harness itself
    probe = find_max_batch_size(work, start=12, max_batch_size=12, memory_budget_bytes=1 << 40, progress=False)
    assert probe.batch_size == 12
    budget = probe.peak_allocated_bytes
    room = find_max_batch_size(work, start=8, memory_budget_bytes=budget, progress=False)
    tries = room.tries.set_index("batch_size")
    assert 8 <= room.batch_size <= 16  # memory grows ~linearly with the batch; 12 fits by construction
    assert room.peak_allocated_bytes <= budget
    assert bool(tries.loc[room.batch_size, "fits"])
    assert not bool(tries.loc[room.batch_size + 1, "fits"])  # bisection ends on a neighbour that did not fit
    assert tries.loc[room.batch_size + 1, "peak_allocated_bytes"] > budget
    assert room.limit_source == "budget" and "largest batch size that fits" in str(room)


def test_gradscaler_skipped_steps_are_not_compared():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)
            self.b = torch.nn.Linear(64, 1)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    # a large loss times the initial scale 65536 overflows float16: the scaler skips the step
    work = Workload(M, lambda n, dev: torch.rand(n, 64, device=dev), lambda m, x: m(x).float().mean() * 1e3,
                    batch_size=8)
    exp = run_experiment(work, [fp32(), amp_fp16()], steps=1, warmup=0, check_steps=2, progress=False)
    chk = exp.result("amp_fp16").check
    assert chk.skipped_steps >= 1 and "skipped by the GradScaler" in chk.message
    assert chk.verdict == "ok"  # inf gradients of a skipped step are the scaler working, not an error
    assert math.isnan(chk.per_step.loc[1, "loss_rel_err"])  # one update behind: not compared
    assert chk.per_step.loc[0, "loss_rel_err"] < 1e-3


def test_light_trace_per_configuration_feeds_the_compare_panel(tmp_path, monkeypatch):
    pytest.importorskip("ipywidgets")
    from workbench.io import load_ledger, load_trace
    from workbench.panels.compare import ComparePanel

    monkeypatch.setenv("WORKBENCH_TRACE_DIR", str(tmp_path / "traces"))
    exp = run_experiment(lm_workload(), [fp32(), amp_bf16()], steps=2, warmup=1, check_steps=1,
                         trace=True, progress=False, ledger=tmp_path / "ledger.json")
    paths = exp.ledger.set_index("configuration")["trace_path"]
    for p in paths:
        t = load_trace(p)
        assert (t.events["cat"] == "cpu_op").any()
    # the ledger file got the rows, traces included; the panel diffs the two rows
    panel = ComparePanel(load_ledger(tmp_path / "ledger.json"))
    assert panel.last_error is None
    assert panel.base.options == ("fp32", "amp_bf16")
    assert panel.diff is not None
    ops = panel.diff.ops.set_index("name")
    # autocast adds dtype casts: aten::to appears (or runs more often) in the bf16 step
    assert ops.loc["aten::to", "delta_count"] > 0
