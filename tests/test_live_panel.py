"""LiveGpuPanel without a browser: build it on a replay, move its controls, check the figure and files."""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.analysis.nvml import AlertThresholds
from workbench.capture.sampler import ReplaySampler
from workbench.io.nvml import load_nvml_session
from workbench.panels.nvml import LiveGpuPanel

SAMPLE = samples.path("h200_nvml_session")


def _nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def _finished_replay(frame_or_path=SAMPLE, **kw):
    s = ReplaySampler(frame_or_path, speed=1000, **kw)
    s.start()
    assert s.wait(timeout=20)
    return s


def _trace(panel, column, gpu=0):
    return next(t for t in panel.figure.data if t.meta["column"] == column and t.meta["gpu"] == gpu)


def _workbench_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("workbench") and t.is_alive()]


def test_panel_draws_the_window_of_a_recording():
    s = _finished_replay()
    p = LiveGpuPanel(s, window_s=10, autostart=False)
    try:
        ref = s.frame()
        t_end = ref.t_s.max()
        x = np.asarray(_trace(p, "util_gpu_pct").x)
        assert len(x) == int((ref.t_s >= t_end - 10).sum()) and x.max() == t_end
        np.testing.assert_allclose(_trace(p, "mem_used_bytes").y, ref.mem_used_bytes[ref.t_s >= t_end - 10] / 2**30)
        # a longer window brings back rows the panel had dropped, from the sampler's memory
        p.window.value = 60
        assert len(_trace(p, "util_gpu_pct").x) == 427
        p.window.value = 5
        assert len(_trace(p, "util_gpu_pct").x) == int((ref.t_s >= t_end - 5).sum())
        assert tuple(p.figure.fig.layout.xaxis4.range) == pytest.approx((t_end - 5, t_end))  # rows 1-3 match x4
        assert "replaying" in p.status.value and "gpu0" in p.status.value
    finally:
        p.close()
    s.stop()


def test_gpu_selection_hides_traces():
    one = load_nvml_session(SAMPLE)
    two = pd.concat([one, one.assign(gpu=1)]).sort_values("t_s", kind="stable")
    p = LiveGpuPanel(_finished_replay(two), autostart=False)
    try:
        assert [o[1] for o in p.gpu_select.options] == [0, 1]
        assert len(p.figure.data) == 14
        p.gpu_select.value = (1,)
        vis = {(t.meta["gpu"], t.visible) for t in p.figure.data}
        assert vis == {(0, False), (1, True)}
        p.gpu_select.value = (0, 1)
        assert all(t.visible for t in p.figure.data)
    finally:
        p.close()
        p.sampler.stop()


def test_pause_freezes_the_plot_and_resume_catches_up():
    # speed 5: the 25 s recording takes ~5 s, so the pause surely lands mid-replay on a loaded machine
    # (at speed 50 a slow refresh could see all 427 rows before pausing)
    s = ReplaySampler(SAMPLE, speed=5)
    p = LiveGpuPanel(s, window_s=60, autostart=False)
    try:
        s.start()
        time.sleep(0.15)
        p.refresh()
        p.pause()
        assert p.pause_button.description == "Resume" and "paused" in p.status.value
        frozen = len(_trace(p, "power_w").x)
        assert s.wait(timeout=60)
        assert p.refresh() == 0
        assert len(_trace(p, "power_w").x) == frozen < 427
        p.resume()
        assert len(_trace(p, "power_w").x) == 427
    finally:
        p.close()
        s.stop()


def test_mark_export_and_alerts(tmp_path):
    s = _finished_replay()
    p = LiveGpuPanel(s, autostart=False, export_dir=tmp_path, thresholds=AlertThresholds(low_util_s=3.0))
    try:
        p.mark_button.click()
        assert [m["label"] for m in s.marks()] == ["mark 1"]
        assert len(p.figure.fig.layout.shapes) == 1
        p.export_button.click()
        written = list(tmp_path.glob("nvml-session-*.csv"))
        assert len(written) == 1 and str(written[0].resolve()) in p.export_path.value
        back = load_nvml_session(written[0])
        assert len(back) == 427 and back.attrs["marks"][0]["label"] == "mark 1"
        a = p.alerts()
        assert isinstance(a, pd.DataFrame) and (a.kind == "low_utilization").sum() == 2
        assert "alerts (2)" in p.alerts_html.value and "below 60%" in p.alerts_html.value
        assert p.last_error is None
    finally:
        p.close()
    s.stop()


def test_control_error_is_shown_not_raised(tmp_path):
    s = _finished_replay()
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    p = LiveGpuPanel(s, autostart=False, export_dir=blocker)  # export into a file: fails
    try:
        p.export_button.click()
        assert p.last_error and "not_a_dir" in p.last_error
    finally:
        p.close()
    s.stop()


def test_css_classes_for_browser_tests():
    s = _finished_replay()
    p = LiveGpuPanel(s, autostart=False)
    try:
        classes = {
            "wb-live-window": p.window, "wb-live-pause": p.pause_button, "wb-live-gpus": p.gpu_select,
            "wb-live-mark": p.mark_button, "wb-live-export": p.export_button, "wb-live-status": p.status,
            "wb-live-alerts": p.alerts_html, "wb-live-figure": p.figure,
        }
        for cls, w in classes.items():
            assert cls in w._dom_classes, cls
        assert "wb-live" in p._dom_classes and "wb-panel" in p._dom_classes
    finally:
        p.close()
    s.stop()


@pytest.mark.skipif(_nvml_present(), reason="NVML is present here; the fallback is for machines without it")
def test_without_nvml_the_panel_replays_and_says_why():
    p = LiveGpuPanel(speed=100, autostart=False)
    try:
        assert isinstance(p.sampler, ReplaySampler) and p.sampler.loop
        assert p.status.value.startswith(
            "NVML not available: NVML Shared Library Not Found; replaying h200_nvml_session.jsonl.gz")
    finally:
        p.close()
    assert not p.sampler.running  # the panel created it, so it stopped it


def test_redraws_continue_while_the_cell_computes_and_close_ends_threads():
    p = LiveGpuPanel(replay=SAMPLE, speed=20, refresh_s=0.1)
    try:
        assert p.running and p.sampler.running
        before = p.redraws
        # a busy cell: pure Python holding the GIL in the main thread for ~1.5 s
        t_end = time.perf_counter() + 1.5
        x = 0
        while time.perf_counter() < t_end:
            x += 1
        during = p.redraws - before
        assert during >= 3, f"only {during} redraws while the cell ran"
        assert len(_trace(p, "util_gpu_pct").x) > 0
    finally:
        p.close()
    assert not p.running and not p.sampler.running
    assert _workbench_threads() == []


def test_closing_the_widget_elsewhere_ends_the_redraw_thread():
    s = ReplaySampler(SAMPLE, speed=20, loop=True)
    p = LiveGpuPanel(s, refresh_s=0.1)
    try:
        assert p.running
        import ipywidgets

        ipywidgets.Widget.close(p)  # what Widget.close_all() or a kernel shutdown does to the view
        deadline = time.time() + 5
        while p.running and time.time() < deadline:
            time.sleep(0.05)
        assert not p.running
    finally:
        p.close()
        s.stop()
    assert s.running is False


@pytest.mark.slow
def test_in_a_real_kernel_the_plot_updates_while_a_cell_runs():
    """A real ipykernel (no browser): while a busy cell runs, the panel's thread keeps sending
    figure updates over the widget comm, and they arrive on IOPub before the cell finishes."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def run(code, timeout=120):
            msgs = []
            msg_id = kc.execute(code)
            while True:
                m = kc.get_iopub_msg(timeout=timeout)
                msgs.append(m)
                if (m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
                        and m["parent_header"].get("msg_id") == msg_id):
                    break
            reply = kc.get_shell_msg(timeout=timeout)
            assert reply["content"]["status"] == "ok", reply["content"]
            return msgs

        run("import sys; from workbench.panels.nvml import LiveGpuPanel\n"
            f"p = LiveGpuPanel(replay={str(SAMPLE)!r}, speed=5, refresh_s=0.1)\np")
        # speed 5: rows keep arriving for ~5 s, longer than the busy cell (at speed 20 the replay ended
        # after ~1.2 s and a loaded machine drew only twice before that)
        busy = run("import time\nt0 = time.perf_counter(); x = 0\n"
                   "while time.perf_counter() - t0 < 3.0:\n    x += 1\nprint('cell done', p.redraws)")
        kinds = [m["msg_type"] for m in busy]
        done_at = next(i for i, m in enumerate(busy)
                       if m["msg_type"] == "stream" and "cell done" in m["content"]["text"])
        updates = [m for m in busy[:done_at]
                   if m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update"
                   and "figure" in m["content"]["data"].get("state", {})]
        assert len(updates) >= 3, (len(updates), kinds[:40])
        print(f"{len(updates)} figure updates while the busy cell ran")
        # the figure carries its x/y arrays as base64 typed arrays, not JSON lists of numbers
        assert all('"bdata"' in m["content"]["data"]["state"]["figure"] for m in updates)
        end = run("p.close(); import threading\n"
                  "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('workbench')))")
        text = "".join(m["content"].get("text", "") for m in end if m["msg_type"] == "stream")
        assert text.strip() == "[]"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_session_file_or_frame_is_replayed_and_other_kinds_raise(tmp_path):
    from workbench.errors import WorkbenchError

    for source in (SAMPLE, str(SAMPLE), load_nvml_session(SAMPLE), "h200_nvml_session"):
        p = LiveGpuPanel(source, speed=1000, autostart=False)
        try:
            assert isinstance(p.sampler, ReplaySampler) and p._owns_sampler
            assert p.sampler.duration_s == pytest.approx(ReplaySampler(SAMPLE).duration_s)
        finally:
            p.close()
    assert not p.sampler.running  # the panel stopped the replay it made
    trace = samples.path("h200_train_step")
    with pytest.raises(WorkbenchError) as err:
        LiveGpuPanel(trace, autostart=False)
    assert str(err.value).startswith(f"{trace}: is a Kineto trace, not what LiveGpuPanel shows")
    assert "Use ProfilerPanel(path) or `workbench trace`" in str(err.value)
    with pytest.raises(WorkbenchError, match=r"gone\.jsonl: no such file\. LiveGpuPanel takes an NVML sampler"):
        LiveGpuPanel(tmp_path / "gone.jsonl", autostart=False)


def test_from_step_marks_the_steps_it_ran():
    if _nvml_present():
        pytest.skip("checks the replay fallback")
    calls = []
    p = LiveGpuPanel.from_step(lambda: calls.append(1), steps=4, speed=50, autostart=False)
    try:
        assert len(calls) == 4
        assert [m[1] if isinstance(m, tuple) else m["label"] for m in p.sampler.marks()][-2:] == \
            ["steps start", "4 steps done"]
        assert "NVML not available" in p.source_line
    finally:
        p.close()
