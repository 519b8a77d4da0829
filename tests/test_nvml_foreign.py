"""GPU samples from other tools (io/nvml_foreign.py): nvidia-smi CSV logs, DCGM exporter scrapes and
home-made metrics tables load as NVML session frames, and wherever a session is taken: the replay sampler
(so monitor --replay and the live panel), workbench timeline --nvml, TimelinePanel."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from testdata import DATA, ROOT
from workbench.errors import BadArtifact
from workbench.io.kinds import GPU_SAMPLE_KINDS, sniff_file
from workbench.io.nvml import NVML_COLUMNS
from workbench.io.nvml_foreign import load_dcgm_scrape, load_gpu_samples, load_metrics_table, load_nvidia_smi_csv

LOGS = DATA / "gpu_logs"
MIB = 2**20


@pytest.mark.parametrize("name, kind", [
    ("nvidia_smi.csv", "nvidia_smi"), ("nvidia_smi_nounits.csv", "nvidia_smi"), ("dcgm_scrapes.txt", "dcgm"),
    ("dcgm_timestamped.txt", "dcgm"), ("metrics.csv", "metrics_table"), ("metrics.jsonl", "metrics_table"),
])
def test_each_log_is_recognised_by_content_and_loads_as_a_session(name, kind, tmp_path):
    assert sniff_file(LOGS / name) == kind and kind in GPU_SAMPLE_KINDS
    renamed = tmp_path / "log.bin.gz"  # by content, not name; gzip is fine
    renamed.write_bytes(gzip.compress((LOGS / name).read_bytes()))
    assert sniff_file(renamed) == kind
    df = load_gpu_samples(renamed)
    assert list(df.columns) == list(NVML_COLUMNS) and len(df) >= 2
    assert df["t_s"].is_monotonic_increasing and df["t_s"].iloc[0] == 0.0


def test_nvidia_smi_csv_units_missing_values_repeated_header_and_gpus(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    import time

    time.tzset()
    try:
        df = load_nvidia_smi_csv(LOGS / "nvidia_smi.csv")
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert len(df) == 4 and df["gpu"].tolist() == [0, 1, 0, 1]  # the repeated header is not a row
    assert df["t_s"].tolist() == pytest.approx([0.0, 0.0, 0.1, 0.1])
    g0 = df[df["gpu"] == 0]
    assert g0["util_gpu_pct"].tolist() == [95.0, 97.0]
    assert g0["mem_used_bytes"].tolist() == [7650 * MIB, 7750 * MIB]
    assert g0["mem_total_bytes"].iloc[0] == 81559 * MIB
    assert g0["power_w"].iloc[0] == 81.25 and np.isnan(g0["power_w"].iloc[1])  # [N/A]
    assert g0["temp_c"].tolist() == [73.0, 74.0] and g0["sm_clock_mhz"].iloc[0] == 1980.0
    assert g0["throttle_reasons"].tolist() == ["", "sw_power_cap"]  # the clocks-event mask, decoded
    assert df["time_ns"].iloc[0] == 1786960800 * 10**9  # 2026/08/17 10:00:00.000 read in the local zone (UTC)


def test_nvidia_smi_nounits_and_no_gpu_column():
    df = load_nvidia_smi_csv(LOGS / "nvidia_smi_nounits.csv")
    assert df["gpu"].tolist() == [0, 0, 0]
    assert df["util_gpu_pct"].iloc[:2].tolist() == [35.0, 40.0] and np.isnan(df["util_gpu_pct"].iloc[2])
    assert df["mem_used_bytes"].iloc[0] == 1024 * MIB and df["power_w"].iloc[1] == pytest.approx(80.11)


def test_dcgm_scrapes():
    df = load_dcgm_scrape(LOGS / "dcgm_scrapes.txt")
    assert df.attrs["notes"] and "scrape i is placed at i x 1 s" in df.attrs["notes"][0]
    assert df[["t_s", "gpu"]].values.tolist() == [[0.0, 0], [0.0, 1], [1.0, 0]]  # 2 scrapes, 2 GPUs then 1
    first = df.iloc[0]
    assert first["util_gpu_pct"] == 99.0 and first["sm_clock_mhz"] == 1980.0
    assert first["mem_used_bytes"] == 70123 * MIB and first["mem_total_bytes"] == (70123 + 11436) * MIB  # used + free
    assert first["gpm_sm_util_pct"] == pytest.approx(87.3)  # DCGM_FI_PROF_SM_ACTIVE 0.873
    assert df.iloc[2]["util_gpu_pct"] == 97.0 and df.iloc[2]["sm_clock_mhz"] == 1965.0
    assert df["time_ns"].isna().all()
    stamped = load_dcgm_scrape(LOGS / "dcgm_timestamped.txt")
    assert stamped["t_s"].tolist() == [0.0, 0.5] and stamped["time_ns"].iloc[0] == 1786960800000 * 10**6
    assert stamped["util_gpu_pct"].tolist() == [40.0, 60.0]
    assert stamped["energy_j"].tolist() == pytest.approx([123456.789, 123506.789])  # mJ -> J


def test_metrics_tables():
    df = load_metrics_table(LOGS / "metrics.csv")
    assert df["t_s"].tolist() == [0.0, 0.5, 1.0] and df["gpu"].tolist() == [0, 0, 0]
    assert df["util_gpu_pct"].tolist() == [10.0, 90.0, 95.0] and df["power_w"].tolist() == [100.0, 300.0, 310.0]
    assert df["mem_used_bytes"].tolist() == [1000 * MIB, 2000 * MIB, 2100 * MIB]
    js = load_metrics_table(LOGS / "metrics.jsonl")
    assert js["t_s"].tolist() == [0.0, 1.0] and js["time_ns"].iloc[0] == 1796450400 * 10**9  # ISO, UTC
    assert js["mem_used_bytes"].tolist() == [123456789.0, 223456789.0]  # no unit, large values: bytes


def test_what_is_not_a_metrics_table(tmp_path):
    no_metric = tmp_path / "a.csv"
    no_metric.write_text("time,loss,lr\n0,2.3,0.1\n1,2.1,0.1\n")
    assert sniff_file(no_metric) == "unknown"
    bad = tmp_path / "b.csv"
    bad.write_text("time,gpu_util\n0,12\n1,high\n")
    assert sniff_file(bad) == "metrics_table"
    with pytest.raises(BadArtifact, match=r"b\.csv: column gpu_util holds a non-number \('high'\)"):
        load_gpu_samples(bad)
    junk = tmp_path / "c.txt"
    junk.write_text("DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 1\nthis is not prometheus\n")
    with pytest.raises(BadArtifact, match="is not Prometheus text"):
        load_gpu_samples(junk)


def test_the_workbench_session_kinds_are_unchanged():
    from workbench import samples

    assert sniff_file(samples.path("h200_nvml_session")) == "nvml"
    assert len(load_gpu_samples(samples.path("h200_nvml_session"))) == 427


# ------------------------------------------------------------------------------- where sessions are taken


def test_replay_sampler_plays_them():
    from workbench.capture.sampler import ReplaySampler

    s = ReplaySampler(LOGS / "nvidia_smi.csv", speed=1000)
    assert s.duration_s == pytest.approx(0.1) and s.frame().empty
    s2 = ReplaySampler(LOGS / "dcgm_scrapes.txt")
    assert s2.duration_s == 1.0


@pytest.mark.parametrize("name", ["nvidia_smi.csv", "dcgm_scrapes.txt", "metrics.csv"])
def test_monitor_replay_and_timeline_take_them(name, tmp_path):
    shutil.copy(LOGS / name, tmp_path / name)
    r = subprocess.run([sys.executable, "-m", "workbench", "monitor", "--replay", name, "--speed", "1000",
                        "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "samples from" in r.stderr
    t = subprocess.run([sys.executable, "-m", "workbench", "timeline", "--nvml", name, "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert t.returncode == 0, t.stderr
    doc = json.loads(t.stdout)
    assert doc["nvml"]["rows"] >= 2


def test_the_live_panel_and_timeline_panel_take_them():
    pytest.importorskip("ipywidgets")
    from workbench.panels.nvml import LiveGpuPanel
    from workbench.panels.timeline import TimelinePanel

    p = LiveGpuPanel(LOGS / "nvidia_smi.csv", autostart=False)
    try:
        assert type(p.sampler).__name__ == "ReplaySampler" and p.sampler.path.name == "nvidia_smi.csv"
    finally:
        p.close()
    tp = TimelinePanel(nvml=LOGS / "metrics.csv")
    assert tp.summary is not None and tp.summary["nvml"]["rows"] == 3


def test_registry_rows_for_them():
    from workbench.io.kinds import KINDS

    for kind in ("nvidia_smi", "dcgm", "metrics_table"):
        k = KINDS[kind]
        assert k.loader.startswith("workbench.io.nvml_foreign:") and callable(k.loader_function())
        assert k.panel == KINDS["nvml"].panel and k.command == "monitor"
    assert (ROOT / "workbench" / "io" / "nvml_foreign.py").is_file()
