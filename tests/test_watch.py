"""The flight recorder (workbench.capture.watch) on a real CPU training loop (a tiny MLP, in a subprocess
where signals are concerned): SIGUSR2 and the CAPTURE file each give a capture within capture_steps + 1
steps, an injected slowdown is inside the capture it triggers, a read-only output folder leaves training
running, and what it writes opens with `workbench watch`, `workbench trace` and `workbench diff`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from testdata import ROOT  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.io.kinds import sniff_path  # noqa: E402
from workbench.io.watch import INDEX_KEYS, load_watch_index  # noqa: E402

# The training script: a tiny MLP, SGD; the parent reads its stdout ("step N") and the index. SLOW_FROM
# (a step) makes six steps from there on sleep 65 ms instead of 5 (a slowdown at a known step; the slow
# trigger is on only then); SIGNAL_AT / FILE_AT
# send SIGUSR2 to itself / create DIR/CAPTURE at the end of that step (as an operator would, between two
# steps); FORM=callback uses on_step_end() instead of the context manager.
SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from workbench import watch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out, steps = sys.argv[1], int(sys.argv[2])
    env = lambda k: int(os.environ[k]) if os.environ.get(k) else None
    slow_from, signal_at, file_at = env("SLOW_FROM"), env("SIGNAL_AT"), env("FILE_AT")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)

    def train_step(i):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if slow_from is not None:  # a step of ~5 ms, then six of ~65 ms: no scheduling hiccup reads as 5x
            time.sleep(0.065 if slow_from <= i < slow_from + 6 else 0.005)

    w = watch(out, capture_steps=3, slow_factor=5.0 if slow_from is not None else None, warmup=8, baseline=False,
              poll_s=0, slow_cooldown=50)
    callback = os.environ.get("FORM") == "callback"
    for i in range(steps):
        if callback:
            train_step(i)
            w.on_step_end()
        else:
            with w.step():
                train_step(i)
        if i == signal_at:
            os.kill(os.getpid(), signal.SIGUSR2)
        if i == file_at:
            with open(os.path.join(out, "CAPTURE"), "w") as f:
                f.write("loss spike at step %d" % i)
    w.close()
    print("trained", steps, "steps;", len(w.captures), "captures;", len(w.problems), "problems")
    for p in w.problems:
        print("problem:", p)
""")


def _start(tmp_path, out, steps=40, prefix=(), **env) -> tuple[subprocess.Popen, int]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    e = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    e.update({k: str(v) for k, v in env.items()})
    p = subprocess.Popen([*prefix, sys.executable, str(script), str(out), str(steps)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e)
    return p, steps


def _finish(started, timeout=120) -> str:
    p, steps = started
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    assert f"trained {steps} steps" in out, out
    return out


def _read_only_prefix(out: Path) -> list[str] | None:
    """How to run the child with ``out`` read-only: a real read-only file system mounted there in a mount
    namespace of its own (unshare), else (not root) the folder's mode; None: neither is possible."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o ro tmpfs "{out}" && exec "$0" "$@"']
    if os.geteuid() != 0:
        out.chmod(0o555)
        return []
    return None


def _captures(out) -> list[dict]:
    return [c.as_dict() for c in load_watch_index(out).captures]


def _trace_steps(path) -> list[int]:
    from workbench.io.trace import load_trace

    t = load_trace(path)
    names = t.events["name"].astype(str)
    return sorted(int(n.split("#")[1]) for n in names[names.str.startswith("ProfilerStep#")].unique())


@pytest.fixture(scope="module")
def children(tmp_path_factory) -> dict:
    """Two training runs side by side (each a fresh process, 40-45 steps):

    - ``run``: SIGUSR2 at the end of step 12, DIR/CAPTURE created at the end of step 22, a slowdown from 32;
    - ``ro``: a read-only output folder, SIGUSR2 at step 12, a slowdown from 25 (stdout kept)."""
    tmp = tmp_path_factory.mktemp("watch")
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    ro = tmp / "ro"
    ro.mkdir()
    prefix = _read_only_prefix(ro)
    first = _start(tmp / "a", tmp / "run", steps=45, SIGNAL_AT=12, FILE_AT=22, SLOW_FROM=32)
    second = _start(tmp / "b", ro, steps=40, prefix=prefix, SIGNAL_AT=12, SLOW_FROM=25) if prefix is not None else None
    got = {"run": tmp / "run", "ro": ro, "ro_stdout": None}
    _finish(first)
    if second is not None:
        got["ro_stdout"] = _finish(second)
    ro.chmod(0o755)
    return got


@pytest.fixture(scope="module")
def signal_and_file_run(children) -> Path:
    return children["run"]


def test_sigusr2_gives_a_capture_within_capture_steps_plus_one(signal_and_file_run):
    out = signal_and_file_run
    cap = _captures(out)[0]
    assert set(INDEX_KEYS) <= set(cap)
    assert cap["reason"] == "signal" and cap["rank"] == 0 and cap["steps"] == 3 and cap["complete"]
    assert 12 < cap["first_step"] and cap["first_step"] + cap["steps"] - 1 <= 12 + 3 + 1
    trace = out / cap["trace"]
    assert trace.name.endswith(".pt.trace.json.gz") and "rank0" in trace.name
    assert _trace_steps(trace) == [cap["first_step"], cap["first_step"] + 1, cap["first_step"] + 2]
    assert len(cap["step_ms"]) == 3


def test_the_capture_file_gives_a_capture_and_is_removed(signal_and_file_run):
    out = signal_and_file_run
    assert [c["reason"] for c in _captures(out)] == ["signal", "file", "slow"], _captures(out)
    cap = _captures(out)[1]
    assert cap["note"] == "loss spike at step 22"
    assert 22 < cap["first_step"] and cap["first_step"] + cap["steps"] - 1 <= 22 + 3 + 1
    assert not (out / "CAPTURE").exists()
    assert (out / cap["trace"]).is_file()


def test_a_slowdown_is_inside_the_capture_it_triggers(signal_and_file_run):
    out = signal_and_file_run
    cap = _captures(out)[2]
    assert cap["reason"] == "slow" and cap["trigger_step"] == 32
    assert cap["trigger_ms"] > 5 * cap["median_ms"] and cap["trigger_ms"] >= 65
    captured = range(cap["first_step"], cap["first_step"] + cap["steps"])
    assert all(32 <= s < 32 + 6 for s in captured), captured  # every captured step is a slow one
    assert all(ms >= 65 for ms in cap["step_ms"]), cap["step_ms"]
    # the trace shows the slow steps, stamped with the slow step's unprofiled time (not the run's median)
    from workbench.analysis.trace.analysis import TraceAnalysis
    from workbench.io.trace import load_trace

    t = load_trace(out / cap["trace"])
    assert t.metadata["workbench_unprofiled_step_ms"] == cap["trigger_ms"]
    assert TraceAnalysis(t).summary(3)["per_step"]["step_ms"] >= 65


def test_the_cli_lists_the_captures_with_why(signal_and_file_run, capsys):
    out = signal_and_file_run
    caps = _captures(out)
    assert sniff_path(out) == "watch" and sniff_path(out / "index.jsonl") == "watch"
    assert main(["watch", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the process got SIGUSR2" in text and "loss spike at step 22" in text
    assert f"step 32 took {caps[2]['trigger_ms']:.1f} ms" in text
    assert f"workbench trace {out / caps[2]['trace']}" in text
    assert main(["watch", str(out / "index.jsonl"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["reason"] for c in doc["captures"]] == ["signal", "file", "slow"] and doc["ranks"] == [0]
    assert doc["captures"][2]["paths"]["trace"] == str(out / caps[2]["trace"])
    assert main(["watch", str(out), "--rank", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["captures"] == []


def test_the_callback_form(tmp_path):
    import time

    from workbench.capture.watch import watch

    model = torch.nn.Linear(8, 8)
    w = watch(tmp_path / "run", capture_steps=2, slow_factor=5.0, warmup=4, baseline=False, handle_signal=False)
    for i in range(16):
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.1 if i == 9 else 0.01)
        w.on_step_end("args", "state", control=None)  # as a trainer's callback calls it
        if i == 4:
            w.capture("from a callback")
    w.close()
    assert [(c["reason"], c["first_step"], c["steps"]) for c in w.captures] == [("request", 6, 2), ("slow", 10, 2)]
    assert w.captures[1]["trigger_step"] == 9 and w.captures[1]["trigger_ms"] >= 100
    assert [s for s, _ in w.recent_steps()][:3] == [1, 2, 3]  # step 0 ended at the first call, untimed


def test_a_read_only_output_folder_leaves_training_running(children):
    if children["ro_stdout"] is None:
        pytest.skip("neither unshare nor a non-root user to make a read-only folder")
    stdout = children["ro_stdout"]
    assert "trained 40 steps; 0 captures" in stdout
    problems = [ln for ln in stdout.splitlines() if ln.startswith("problem:")]
    assert problems and all("training goes on" in p or "not listed" in p for p in problems), stdout
    assert len(problems) == len(set(problems))  # each said once
    assert list(children["ro"].iterdir()) == []


def test_a_second_trigger_during_a_capture_is_said_once_and_dropped(tmp_path):
    from workbench.capture.watch import watch

    model = torch.nn.Linear(8, 8)
    w = watch(tmp_path / "run", capture_steps=3, slow_factor=None, baseline=False, handle_signal=False)
    for i in range(10):
        with w.step():
            model(torch.randn(4, 8)).sum().backward()
        if i in (2, 3, 4):  # the first starts a capture at step 3; the others land during it
            w.capture(f"ask {i}")
    w.close()
    assert [(c["reason"], c["first_step"], c["note"]) for c in w.captures] == [("request", 3, "ask 2")]
    assert len([p for p in w.problems if "dropped" in p]) == 1


def test_an_exception_inside_a_capture_keeps_the_partial_trace_and_propagates(tmp_path):
    from workbench.capture.watch import watch

    model = torch.nn.Linear(8, 8)
    w = watch(tmp_path / "run", capture_steps=3, slow_factor=None, baseline=False, handle_signal=False)
    w.capture()
    with pytest.raises(ValueError, match="bad batch"):
        for i in range(5):
            with w.step():
                model(torch.randn(4, 8)).sum().backward()
                if i == 1:
                    raise ValueError("bad batch")
    w.close()
    (cap,) = w.captures
    assert cap["complete"] is False and cap["note"] == "ValueError: bad batch" and cap["steps"] == 1
    assert (tmp_path / "run" / cap["trace"]).is_file()


def test_watch_traces_open_in_trace_and_diff_and_the_panel(tmp_path, capsys):
    from workbench.capture.watch import watch

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    import time

    w = watch(tmp_path / "run", capture_steps=2, slow_factor=4.0, warmup=5, handle_signal=False, slow_cooldown=100)
    for i in range(20):
        with w.step():
            model(torch.randn(8, 32)).sum().backward()
            time.sleep(0.08 if i >= 12 else 0.01)  # ~10 ms steps, then a slowdown to ~80 ms
    w.close()
    base, slow = w.captures  # the baseline at steps 5-6, the slowdown's steps 13-14
    assert (base["reason"], slow["reason"], slow["trigger_step"]) == ("baseline", "slow", 12)
    a, b = str(tmp_path / "run" / base["trace"]), str(tmp_path / "run" / slow["trace"])
    assert main(["trace", b, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in doc["steps"]] == [slow["first_step"], slow["first_step"] + 1]
    assert main(["diff", a, b, "--json"]) == 0
    (step,) = [c for c in json.loads(capsys.readouterr().out)["changes"] if c["key"] == "step"]
    assert step["test_us"] > step["base_us"] + 50_000
    assert main(["watch", str(tmp_path / "run")]) == 0
    assert f"workbench diff {a} {b}" in capsys.readouterr().out
    pytest.importorskip("ipywidgets")
    from workbench.panels.profiler import ProfilerPanel

    assert ProfilerPanel(b).analysis.summary(3)["per_step"]["steps"] == 2


def test_bad_arguments_raise_before_training():
    from workbench.capture.watch import watch
    from workbench.errors import BadArgument

    for kw in ({"capture_steps": 0}, {"slow_factor": 0.5}, {"every": 0}, {"detail": "everything"}):
        with pytest.raises(BadArgument):
            watch("unused", handle_signal=False, **kw)


def test_watch_json_keys_are_documented(tmp_path, capsys):
    from test_json_contract import _documented, _paths, _sections

    out = tmp_path / "run"
    out.mkdir()
    rec = {"time_ns": 1, "reason": "slow", "first_step": 5, "steps": 2, "trace": "t.pt.trace.json.gz",
           "snapshot": "s.snapshot.pickle.gz", "nvml": "n.nvml.jsonl.gz", "rank": 0, "trigger_step": 4,
           "trigger_ms": 9.0, "median_ms": 1.0, "step_ms": [9.0, 9.5], "device": "cuda:0", "complete": True,
           "note": None, "host": "h", "pid": 1,
           "history": {"mode": "sizes", "auto": True, "cost_pct": 13.2, "allocs_per_step": 1450.0, "step_ms": 21.0,
                       "stacks_us": 3.1, "sizes_us": 1.2, "budget_pct": 1.0, "frames": 33, "frames_from": "assumed"}}
    (out / "index.jsonl").write_text(json.dumps({**rec, "reason": "baseline", "first_step": 1}) + "\n"
                                     + json.dumps(rec) + "\n" + '{"cut short\n')
    assert main(["watch", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["problems"] == ["line 3: " + doc["problems"][0].split(": ", 1)[1]]
    assert doc["captures"][1]["compare_with"] == "t.pt.trace.json.gz"
    assert doc["captures"][1]["missing"] == ["t.pt.trace.json.gz", "s.snapshot.pickle.gz", "n.nvml.jsonl.gz"]
    section = _sections()["watch"]
    keys = {p for p in _paths(doc) if not p.startswith(("by_reason.", "captures[].paths."))}  # data keys
    undocumented = sorted(keys - _documented(section))
    assert undocumented == [], undocumented


def test_one_capture_file_reaches_every_rank_of_the_folder(tmp_path):
    """Two ranks of one job on one folder (in one process here, one after the other, so their profilers do
    not overlap): the CAPTURE file is taken by each, and removed once both have it."""
    from workbench.capture.watch import watch

    out = tmp_path / "run"
    model = torch.nn.Linear(8, 8)
    ranks = [watch(out, capture_steps=2, slow_factor=None, baseline=False, handle_signal=False, poll_s=0,
                   rank=r, world_size=2) for r in (0, 1)]

    def steps(w, n):
        for _ in range(n):
            with w.step():
                model(torch.randn(4, 8)).sum().backward()

    steps(ranks[0], 5)
    (out / "CAPTURE").write_text("both ranks, please")
    steps(ranks[0], 5)
    assert (out / "CAPTURE").exists()  # rank 1 has not taken it yet
    steps(ranks[1], 5)
    assert not (out / "CAPTURE").exists() and not list(out.glob(".CAPTURE*"))
    steps(ranks[0], 3)  # taken once per rank: no second capture
    for w in ranks:
        w.close()
    caps = _captures(out)
    assert [(c["rank"], c["reason"], c["first_step"], c["note"]) for c in caps] == [
        (0, "file", 5, "both ranks, please"), (1, "file", 0, "both ranks, please")]
    assert [c["trace"] for c in caps] == ["cap-0000005-rank0-file.pt.trace.json.gz",
                                          "cap-0000000-rank1-file.pt.trace.json.gz"]


def test_every_m_steps(tmp_path):
    from workbench.capture.watch import watch

    model = torch.nn.Linear(8, 8)
    w = watch(tmp_path / "run", capture_steps=2, every=10, slow_factor=None, baseline=False, handle_signal=False)
    for _ in range(35):
        with w.step():
            model(torch.randn(4, 8)).sum().backward()
    w.close()
    assert [(c["reason"], c["first_step"], c["steps"]) for c in w.captures] == [
        ("every", 10, 2), ("every", 20, 2), ("every", 30, 2)]


GOOD = {"time_ns": 1, "reason": "file", "first_step": 3, "steps": 3, "trace": "t.pt.trace.json.gz",
        "snapshot": None, "nvml": None, "rank": 0}


@pytest.mark.parametrize("second, problem", [
    ({**GOOD, "trace": "../../etc/passwd"}, "trace is not a file name in the folder"),
    ({**GOOD, "steps": "3"}, "steps is not a whole number"),
    ({k: v for k, v in GOOD.items() if k != "rank"}, "lacks rank"),
    ("[" * 100_000, None),
    ('{"time_ns": 1, "reason"', None),
], ids=["path", "type", "missing", "deep", "torn"])
def test_a_bad_index_line_is_skipped_and_named(second, problem, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    line = second if isinstance(second, str) else json.dumps(second)
    (out / "index.jsonl").write_text(json.dumps(GOOD) + "\n" + line + "\n")
    assert main(["watch", str(out), "--json"]) == 0
    got = capsys.readouterr()
    doc = json.loads(got.out)
    assert len(doc["captures"]) == 1 and len(doc["problems"]) == 1 and doc["problems"][0].startswith("line 2: ")
    if problem:
        assert problem in doc["problems"][0]
    assert "workbench watch: warning:" in got.err and "line 2" in got.err


@pytest.mark.parametrize("content, says", [
    (None, "holds no index.jsonl"),
    ("just text\n", "is not a flight recorder's index"),
    (json.dumps(GOOD) + "\n" + "x" * (2 << 20) + "\n", "line 2 is longer than"),
], ids=["no-index", "not-an-index", "huge-line"])
def test_a_folder_that_is_not_a_recorders_is_one_line(content, says, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    if content is not None:
        (out / "index.jsonl").write_text(content)
    target = out if content is None else out / "index.jsonl"
    assert main(["watch", str(target)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("workbench watch: error: ") and says in err[0], err


def test_the_shipped_folder_of_lesson_19_is_what_its_recorder_says(capsys):
    """samples.path('watch_cpu_slow_data'), recorded by benchmarks/record_watch_cpu.py: the captures its
    triggers asked for, the slowdown in the slow one and not in the others, no local path in any file, and
    `workbench watch NAME` reads it by its sample name."""
    import gzip

    from workbench import samples
    from workbench.analysis.trace.diff import trace_diff

    folder = samples.path("watch_cpu_slow_data")
    rec = json.loads((folder / "recording.json").read_text())
    inj, n = rec["injected"], rec["watch_options"]["capture_steps"]
    index = load_watch_index(folder)
    caps = {c.reason: c for c in index.captures}
    assert [c.reason for c in index.captures] == ["baseline", "file", "signal", "slow"] and index.problems == ()
    assert all(index.missing(c) == [] and c.steps == n and c.extra["complete"] for c in index.captures)
    assert caps["file"].first_step == inj["capture_file_after_step"] + 1
    assert caps["signal"].first_step == inj["sigusr2_after_step"] + 1
    assert caps["slow"].extra["trigger_step"] == inj["slow_from_step"] == caps["slow"].first_step - 1
    d = trace_diff(index.path(caps["baseline"].trace), index.path(caps["slow"].trace), normalize="per_step")
    assert d.ops.iloc[0]["name"].startswith("enumerate(DataLoader)")
    assert d.ops.iloc[0]["delta_cpu_us"] > 0.9 * d.step_delta_us > 0.9 * 5 * d.base_step_us
    for p in folder.iterdir():
        text = (gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()).decode("utf-8", "replace")
        assert not re.search(r"/(?:root|home|work|tmp|opt|Users)/", text), p.name
    assert main(["watch", "watch_cpu_slow_data", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by_reason"] == {"baseline": 1, "file": 1, "signal": 1, "slow": 1}


# ---------------------------------------------------------------------------------------------------------------
# the allocator history's budget (memory_history='auto'): the decision is a pure function of numbers; the CUDA
# calibration and the switch itself are in tests/gpu/test_watch_gpu.py


def test_the_history_budget_drops_stacks_only_where_they_cost_more_than_it():
    from workbench.capture.watch_history import history_cost

    # a host-bound step: 1500 allocations x 2.3 us of stacks = 3.45 ms, out of 22 ms timed with them on
    host = history_cost(1500, 22.0, 3.5, 1.2)
    assert host["mode"] == "sizes" and host["cost_ms"] == 3.45
    assert host["cost_pct"] == round(3.45 / (22.0 - 3.45) * 100, 2)  # against the step without the stacks
    # a GPU-bound step: 300 allocations in 186 ms
    gpu = history_cost(300, 186.0, 3.5, 1.2)
    assert gpu["mode"] == "python" and 0.3 < gpu["cost_pct"] < 0.4
    # the budget is the line: 1% exactly stays, just over goes; another budget moves it
    assert history_cost(1000, 101.0, 2.0, 1.0)["mode"] == "python"    # 1 ms of 100 ms: exactly 1%
    assert history_cost(1010, 101.0, 2.0, 1.0)["mode"] == "sizes"     # 1.01 ms of 99.99 ms
    assert history_cost(1500, 22.0, 3.5, 1.2, budget=0.25)["mode"] == "python"
    assert history_cost(1, 1000.0, 3.5, 1.2, budget=0.0)["mode"] == "sizes"
    # stacks measured no dearer than none: no cost
    assert history_cost(5000, 10.0, 1.0, 1.3)["cost_ms"] == 0 and history_cost(5000, 10.0, 1.0, 1.3)["mode"] == "python"
    # a model that says more than the whole step: no stacks, the share not given as a number
    over = history_cost(20000, 10.0, 3.0, 1.0)
    assert over["mode"] == "sizes" and over["cost_pct"] is None
    # no step time: the stacks stay, the share unknown
    none = history_cost(1500, 0.0, 3.5, 1.2)
    assert none["mode"] == "python" and none["cost_pct"] is None


def test_the_budget_takes_the_richest_history_it_allows_stacks_then_the_ring_then_none():
    from workbench.capture.watch_history import history_cost

    # the H100's host-bound step (benchmarks/results/watch_auto_hostbound_h100.json): 499 allocations a step,
    # stacks +2.2 us each, the ring without them +0.6 us, history off 4.27 us for an allocation and its free
    host = history_cost(499, 16.26 + 499 * 2.8 / 1e3, 7.06, 4.86, off_us=4.27)
    assert host["mode"] == "off" and host["sizes_cost_ms"] == round(499 * 0.59 / 1e3, 4)
    assert host["sizes_cost_pct"] == round(499 * 0.59 / 1e3 / 16.26 * 100, 2) > 1.0
    # the same step with a 2% budget: the ring without stacks fits, the stacks do not
    assert history_cost(499, 16.26 + 499 * 2.8 / 1e3, 7.06, 4.86, budget=0.02, off_us=4.27)["mode"] == "sizes"
    # the stacks' budget counts the whole history (ring + stacks) against the step without any
    assert history_cost(1000, 101.0, 1.5, 1.0, off_us=0.5)["mode"] == "python"   # 1 ms of 100 ms
    assert history_cost(1000, 101.0, 1.5, 1.0, off_us=0.49)["mode"] == "sizes"   # 1.01 ms of 99.99 ms
    # a GPU-bound step keeps the stacks; without off_us the ring is free, as before
    assert history_cost(300, 186.0, 3.5, 1.2, off_us=1.0)["mode"] == "python"
    assert history_cost(20000, 10.0, 3.0, 1.0)["sizes_cost_pct"] is None


def test_the_stacks_cost_is_taken_at_the_steps_depth_from_two_calibrated_depths():
    from workbench.capture.watch_history import stacks_us_at

    cal = {"depths": [10, 58], "python_us": [3.0, 4.2]}
    assert stacks_us_at(cal, 10) == 3.0 and stacks_us_at(cal, 58) == pytest.approx(4.2)
    assert stacks_us_at(cal, 34) == pytest.approx(3.6)              # between
    assert stacks_us_at(cal, 82) == pytest.approx(4.8)              # deeper than calibrated: extrapolated
    assert stacks_us_at(cal, 0) == pytest.approx(2.75)              # the autograd thread's empty stacks
    flat = {"depths": [10, 58], "python_us": [3.0, 2.9]}            # noise made it cheaper deeper: flat
    assert stacks_us_at(flat, 100) == 3.0 and stacks_us_at(flat, 0) == 3.0


def test_the_history_arguments(tmp_path):
    from workbench.capture.watch import HISTORY_MODES, watch
    from workbench.errors import BadArgument

    for kw in ({"memory_history": "sometimes"}, {"memory_history": 1.5}, {"history_budget": -0.01},
               {"history_budget": "a lot"}, {"history_budget": float("nan")}):
        with pytest.raises(BadArgument):
            watch(tmp_path / "bad", handle_signal=False, **kw)
    assert HISTORY_MODES[0] == "auto"
    for mode in HISTORY_MODES:
        watch(tmp_path / "ok", handle_signal=False, memory_history=mode, history_budget=0.05).close()


def test_on_the_cpu_there_is_no_history_and_the_lines_say_so(tmp_path):
    from workbench.capture.watch import watch

    model = torch.nn.Linear(8, 8)
    w = watch(tmp_path / "run", capture_steps=1, slow_factor=None, warmup=3, handle_signal=False)
    for _ in range(6):
        with w.step():
            model(torch.randn(4, 8)).sum().backward()
    w.close()
    assert w.history_mode is None and w.history_cost is None and w.problems == []
    (base,) = w.captures
    assert base["reason"] == "baseline" and base["history"] is None
    assert load_watch_index(tmp_path / "run").captures[0].extra["history"] is None


def test_the_cli_says_each_ranks_allocator_history(tmp_path, capsys):
    from workbench.analysis.watch import history_words

    out = tmp_path / "run"
    out.mkdir()
    line = {"time_ns": 1, "reason": "baseline", "first_step": 20, "steps": 3, "trace": None,
            "snapshot": "s.snapshot.pickle.gz", "nvml": None, "rank": 0}
    auto = {"mode": "sizes", "auto": True, "cost_pct": 13.2, "allocs_per_step": 1450.4, "budget_pct": 1.0}
    kept = {"mode": "python", "auto": True, "cost_pct": 0.21, "allocs_per_step": 310.0, "budget_pct": 1.0}
    (out / "index.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {**line, "history": {"mode": "python", "auto": True}},          # written before the warm-up's end
        {**line, "first_step": 90, "reason": "signal", "history": auto},
        {**line, "rank": 1, "history": kept},
        {**line, "rank": 2, "history": {"mode": "sizes", "auto": False}},
        {**line, "rank": 3})) + "\n")                                 # an older recorder: no history
    assert main(["watch", str(out)]) == 0
    text = capsys.readouterr().out
    assert ("allocator history, rank 0: without stacks: stacks would cost 13.2% of a step (1450 allocations a step; "
            "budget 1%)") in text
    assert "allocator history, rank 1: with Python stacks: they cost 0.21% of a step (310 allocations a step" in text
    assert "allocator history, rank 2: without stacks (as asked)" in text and "rank 3:" not in text
    assert main(["watch", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(h["rank"], h["mode"], h["auto"]) for h in doc["history"]] == [(0, "sizes", True), (1, "python", True),
                                                                           (2, "sizes", False)]
    assert doc["history"][0]["text"] == history_words(auto)
    early = history_words({"mode": "python", "auto": True})
    assert early.endswith("(the budget not checked yet: the warm-up was not over)")
