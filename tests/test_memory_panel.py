"""MemoryPanel without a browser: controls change the figures and tables; errors land in the panel."""

from __future__ import annotations

import pytest

from testdata import data_path

from workbench import samples

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from workbench.figures._downsample import MAX_POINTS  # noqa: E402
from workbench.io.snapshot import load_snapshot  # noqa: E402
from workbench.panels.memory import MemoryPanel  # noqa: E402

OOM = samples.path("h200_oom_snapshot")
TRAIN = samples.path("h200_train_snapshot")


def _points(fw):
    return sum(len(t.x) for t in fw.data)


@pytest.fixture(scope="module")
def train_panel():
    return MemoryPanel(TRAIN)


def test_opens_at_the_peak_with_tabs(train_panel):
    p = train_panel
    assert p.last_error is None
    assert [p.tabs.get_title(i) for i in range(len(p.tabs.children))] == ["Timeline", "Segments"]
    assert p.moment_index() == p.analysis.peak["index"]
    assert "1.14 GiB allocated" in p.live.value
    assert "probe/gpu_probe.py:66 forward" in p.live.value
    names = {t.name for t in p.timeline.data}
    assert {"activations", "optimizer_state", "parameters", "reserved"} <= names
    assert _points(p.timeline) <= MAX_POINTS


def test_range_filters_before_drawing(train_panel):
    p = train_panel
    full = _points(p.timeline)
    lo, hi = p.range.min, p.range.max
    p.range.value = (lo + (hi - lo) * 0.4, lo + (hi - lo) * 0.5)
    xs = [x for t in p.timeline.data for x in t.x]
    assert _points(p.timeline) < full / 3
    assert min(xs) >= p.range.value[0] - 1e-6 and max(xs) <= p.range.value[1] + 1e-6
    # the moment was pulled into the range
    assert p.range.value[0] <= p.moment.value <= p.range.value[1]
    p.range.value = (lo, hi)


def test_groupby_changes_the_stack(train_panel):
    p = train_panel
    p.groupby.value = "frame"
    names = [t.name for t in p.timeline.data]
    assert "probe/gpu_probe.py:66 forward" in names and "activations" not in names
    p.groupby.value = "category"


def test_moment_lists_what_was_live(train_panel):
    p = train_panel
    before = p.live.value
    p.moment.value = p.moment.min + (p.moment.max - p.moment.min) * 0.05
    k = p.moment_index()
    assert k < p.analysis.peak["index"]
    assert p.live.value != before
    table = p.live_table(k)
    assert table["bytes"].sum() <= p.analysis.timeline["allocated_bytes"].iloc[k]
    assert f"event {k:,}" in p.live.value
    assert "holes" in p.state.value and len(p.segments.data) >= 1
    p.peak_button.click()
    assert p.moment_index() == p.analysis.peak["index"]


def test_oom_tab_and_other_sources():
    snap = load_snapshot(OOM)
    p = MemoryPanel(snap)
    assert p.tabs.get_title(2) == "OOM" and p.tabs.selected_index == 2
    assert "Out of memory: capacity" in p.oom_html.value and "255.59 MiB" in p.oom_html.value
    assert len(p.oom_fig.data) >= 2
    p2 = MemoryPanel(p.analysis)  # an analysis works too
    assert p2.oom is not None


def test_bad_file_shows_an_error_not_a_traceback(tmp_path):
    f = tmp_path / "junk.pickle"
    f.write_bytes(b"not a pickle")
    p = MemoryPanel(f)
    assert p.analysis is None
    assert p.last_error and str(f) in p.last_error
    assert p.errors.outputs and "not a readable pickle" in p.errors.outputs[0]["text"]
    # controls do not raise either
    p.moment.value = 0.5
    assert p.last_error


def test_css_classes():
    p = MemoryPanel(OOM)
    for w, cls in ((p.range, "wb-memory-range"), (p.groupby, "wb-memory-groupby"), (p.moment, "wb-memory-moment"),
                   (p.tabs, "wb-memory-tabs"), (p.live, "wb-memory-live"), (p, "wb-memory"), (p.oom_html, "wb-memory-oom"),
                   (p.findings, "wb-memory-findings")):
        assert cls in w._dom_classes


def test_memory_findings_show_under_the_status_line(train_panel):
    # the capacity OOM recorded on the H200: 6 x 200 MiB kept live from one frame, then 1 GiB asked
    p = MemoryPanel(data_path("h200_memory", "oom_capacity.snapshot.pickle.gz"))
    assert p.last_error is None
    assert [f.id for f in p.analysis.findings] == ["oom_capacity", "growing_allocations"]
    text = p.findings.value
    assert "<b>oom_capacity</b> (critical)" in text and "<b>growing_allocations</b> (warning)" in text
    assert "wb-finding wb-finding-critical" in text and "wb-finding wb-finding-warning" in text
    assert "wb-evidence" in text and "requested <b>" in text  # evidence as numbers with units
    assert p.children.index(p.findings) < p.children.index(p.tabs)  # near the top, above the tabs
    assert train_panel.findings.value == ""  # the clean training snapshot has none


def test_state_over_time_follows_the_range(train_panel):
    p = train_panel
    x_full = [x for x in p.state_over_time.data[0].x]
    assert {t.name for t in p.state_over_time.data} >= {"external fragmentation", "cached-unused share", "largest free block",
                                                        "free in reserved"}
    lo, hi = p.range.min, p.range.max
    p.range.value = (lo + (hi - lo) * 0.5, hi)
    x_half = list(p.state_over_time.data[0].x)
    assert min(x_half) >= p.range.value[0] - 1e-6 and min(x_full) < p.range.value[0]
    p.range.value = (lo, hi)


def test_from_capture_handles(tmp_path):
    import shutil

    from workbench.capture.memory import MemoryRecording, OomCapture

    h = OomCapture(directory=tmp_path, max_dumps=1)
    p = MemoryPanel(h)
    assert p.analysis is None and "no snapshot yet" in p.last_error
    dump = tmp_path / "oom-1.pickle.gz"
    shutil.copy(OOM, dump)
    h.dumps.append(dump)
    assert MemoryPanel(h).oom is not None
    rec = MemoryRecording(path=dump)
    assert MemoryPanel(rec).analysis.peak["allocated_bytes"] > 0


def test_live_table_shows_a_readable_size_next_to_the_bytes():
    from workbench.panels.memory import MemoryPanel

    p = MemoryPanel(samples.path("h200_train_snapshot"))
    html_text = p.live.value
    assert "<th style='padding:2px 8px;text-align:left;white-space:nowrap'>size</th>" in html_text
    assert "32.00\u00a0MiB" in html_text and "33,554,432" in html_text  # the largest blocks, both ways


def test_a_kineto_trace_raises_naming_the_profiler_panel(capsys):
    # it used to say the pickle was incomplete and leave a tqdm bar at 0% above dead sliders
    from ipywidgets.widgets.widget import _instances

    from workbench.errors import WorkbenchError

    trace = samples.path("h200_train_step")
    before = set(_instances)
    with pytest.raises(WorkbenchError) as err:
        MemoryPanel(trace)
    msg = str(err.value)
    assert msg.startswith(f"{trace}: is a Kineto trace, not an allocator snapshot. Use ProfilerPanel(path) or "
                          "`workbench trace`")
    assert set(_instances) == before  # no widgets built
    captured = capsys.readouterr()
    assert "%" not in captured.err and "reading" not in captured.err  # no progress bar started


@pytest.mark.parametrize("sample, fits", [("h200_nvml_session", "LiveGpuPanel(path)"),
                                          ("h200_memory_timeline", "--profiler-timeline")])
def test_other_kinds_and_missing_files_raise(sample, fits, tmp_path):
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match=r"not what MemoryPanel shows") as err:
        MemoryPanel(samples.path(sample))
    assert fits in str(err.value)
    with pytest.raises(WorkbenchError, match=r"nope\.pickle\.gz: no such file\. MemoryPanel takes an allocator"):
        MemoryPanel(tmp_path / "nope.pickle.gz")
    with pytest.raises(WorkbenchError, match=r"this int: is not something a panel shows\. MemoryPanel takes"):
        MemoryPanel(42)


torch = pytest.importorskip("torch")


def _cpu_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return step, model


_FULL_PROFILE_CHECK = """
import sys, pytest, torch
sys.path.insert(0, {tests!r})
from test_memory_panel import _cpu_step
from workbench import profile_steps
from workbench.errors import WorkbenchError
from workbench.panels.memory import MemoryPanel

step, model = _cpu_step()
full = profile_steps(step, steps=1, detail="full", out_dir={out!r}, verbose=False, progress=False)
p = MemoryPanel(full)
assert p.last_error is None and p.analysis is not None
params = sum(t.numel() * t.element_size() for t in model.parameters())
# profile_steps ran steps before profiling, so parameters and AdamW's moments predate the events; in the
# profiled step zero_grad frees the gradients and backward allocates them again: the peak holds them
sizes = set(p.analysis.allocs["size_bytes"].astype(int))
assert {{256 * 64 * 4, 8 * 256 * 4}} <= sizes, sizes  # the two weight gradients, exact sizes
assert params <= p.analysis.peak["allocated_bytes"] < 10 * params, (params, p.analysis.peak)
assert "allocated in" in p.live.value
light = profile_steps(step, steps=1, detail="light", out_dir={out!r}, verbose=False, progress=False)
with pytest.raises(WorkbenchError, match=r"detail='light', which records no memory events.*ProfilerPanel"):
    MemoryPanel(light)
print("ok")
"""


def test_a_full_profile_result_shows_its_memory_events(tmp_path):
    """In a fresh interpreter: CPU [memory] events are process-wide, so what other tests' threads
    allocate while the step is profiled would be counted in the step's peak."""
    import subprocess
    import sys
    from pathlib import Path

    code = _FULL_PROFILE_CHECK.format(tests=str(Path(__file__).resolve().parent), out=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_from_step_without_cuda_profiles_the_memory_events(tmp_path):
    from workbench.capture.memory import cuda_available

    if cuda_available():
        pytest.skip("this checks the CPU path")
    step, model = _cpu_step()
    p = MemoryPanel.from_step(step, steps=2, out_dir=tmp_path)
    assert p.last_error is None and p.analysis.peak["allocated_bytes"] > 0
    assert str(tmp_path) in str(p.analysis.snap.source)


def test_full_stack_of_a_live_allocation_on_demand():
    """The live table's stacks are cut to four Python frames; the picker shows one allocation's whole
    stack (every frame of the snapshot's record, innermost first, the user's frames in bold)."""
    import re

    from workbench.io import load_snapshot

    p = MemoryPanel(samples.path("h200_train_snapshot"))
    p.go_to_peak()
    assert p.last_error is None and len(p.stack_pick.options) == min(25, len(p.analysis.live_at(p.moment_index())))
    p.stack_pick.value = 2
    live = p.analysis.live_at(p.moment_index()).head(25)
    sid = int(live["alloc_stack_id"].iloc[2])
    snap = load_snapshot(samples.path("h200_train_snapshot"))
    names = snap.frames["name"].astype(str).to_numpy()
    recorder = ("torch::unwind::", "torch::CapturedTraceback::")
    frames = [f for f in snap.stacks[sid] if not names[f].startswith(recorder) and "gather_with_cpp(" not in names[f]]
    assert len(frames) < len(snap.stacks[sid])  # the unwinder's own frames are left out
    shown = re.findall(r"<div class='wb-stack-(?:user|py|cpp)'[^>]*>(?:<b>)?([^<]*)", p.stack_view.value)
    assert len(shown) == len(frames) > 4
    user = re.findall(r"<div class='wb-stack-user'><b>([^<]*)</b>", p.stack_view.value)
    assert live["frame"].iloc[2] in user  # the frame the table names is among the bold ones
