"""NVML session files: the shipped H200 recording, round trips, marks, and bad files."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest

from workbench import samples
from workbench.errors import BadArtifact
from workbench.io.nvml import (
    NVML_COLUMNS,
    decode_throttle_reasons,
    encode_throttle_reasons,
    load_nvml_session,
    save_nvml_session,
)

SAMPLE = samples.path("h200_nvml_session")


def _raw_rows():
    with gzip.open(SAMPLE, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_shipped_session_loads_with_units_in_names():
    df = load_nvml_session(SAMPLE)
    raw = _raw_rows()
    assert list(df.columns) == list(NVML_COLUMNS)
    assert len(df) == len(raw) == 427
    assert df["gpu"].dtype == np.int64
    assert df["t_s"].is_monotonic_increasing
    # independent reading of the same file: values carried over, power converted mW -> W
    by_t = {r["t"]: r for r in raw}
    for row in df.sample(20, random_state=0).itertuples():
        r = by_t[row.t_s]
        assert row.util_gpu_pct == r["util_gpu"]
        assert row.mem_used_bytes == r["mem_used"]
        assert row.power_w == pytest.approx(r["power_mw"] / 1000)
        assert row.sm_clock_mhz == r["sm_mhz"]
    assert df["util_gpu_pct"].max() == max(r["util_gpu"] for r in raw)
    # the recording has no throttle reasons, PCIe or energy: missing, not zero
    assert df["throttle_reasons"].isna().all()
    assert df["energy_j"].isna().all()
    assert df.attrs["marks"] == [] and df.attrs["source"] == str(SAMPLE)


def _constructed():
    base = load_nvml_session(SAMPLE).head(40).copy()
    base["throttle_reasons"] = [None] * 10 + [""] * 10 + ["sw_power_cap"] * 10 + ["sw_thermal,hw_slowdown"] * 10
    base["energy_j"] = np.linspace(100.0, 140.0, 40)
    base.loc[5, "temp_c"] = np.nan
    return base


@pytest.mark.parametrize("name", ["s.jsonl", "s.jsonl.gz", "s.csv", "s.csv.gz"])
def test_round_trip_keeps_values_reasons_and_marks(tmp_path, name):
    df = _constructed()
    marks = [{"t_s": 0.5, "label": "start, with comma"}, (1.25, "epoch 2")]
    out = save_nvml_session(df, tmp_path / name, marks=marks)
    assert out.exists() and not list(tmp_path.glob(".*tmp"))
    if name.endswith(".gz"):
        assert out.read_bytes()[:2] == b"\x1f\x8b"
    back = load_nvml_session(out)
    assert len(back) == len(df)
    pd.testing.assert_frame_equal(back.drop(columns="throttle_reasons"), df.drop(columns="throttle_reasons"),
                                  check_dtype=False)
    assert back["throttle_reasons"].tolist() == df["throttle_reasons"].tolist()
    assert back.attrs["marks"] == [{"t_s": 0.5, "label": "start, with comma"}, {"t_s": 1.25, "label": "epoch 2"}]
    assert math.isnan(back.loc[5, "temp_c"])


def test_marks_default_to_frame_attrs(tmp_path):
    df = _constructed()
    df.attrs["marks"] = [{"t_s": 2.0, "label": "x"}]
    back = load_nvml_session(save_nvml_session(df, tmp_path / "a.jsonl"))
    assert back.attrs["marks"] == [{"t_s": 2.0, "label": "x"}]


def test_throttle_reason_bits():
    assert decode_throttle_reasons(0x4 | 0x40) == "sw_power_cap,hw_thermal"
    assert decode_throttle_reasons(0x1) == "gpu_idle"
    assert decode_throttle_reasons(0) == ""
    assert decode_throttle_reasons(None) is None
    assert decode_throttle_reasons(0x8000) == "0x8000"  # a bit newer than this table is kept, not dropped
    for mask in (0, 0x4, 0x4 | 0x20 | 0x80, 0x1FF, 0x8004):
        assert encode_throttle_reasons(decode_throttle_reasons(mask)) == mask
    assert math.isnan(encode_throttle_reasons(None))


def test_missing_file(tmp_path):
    with pytest.raises(BadArtifact, match="no such file"):
        load_nvml_session(tmp_path / "nope.jsonl")


def test_truncated_gzip_names_file_and_fix(tmp_path):
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(SAMPLE.read_bytes()[:3000])
    with pytest.raises(BadArtifact) as ei:
        load_nvml_session(cut)
    msg = str(ei.value)
    assert str(cut) in msg and ("truncated" in msg or "re-copy" in msg)


def test_truncated_json_line_says_which_line(tmp_path):
    lines = gzip.decompress(SAMPLE.read_bytes()).decode().splitlines()
    bad = tmp_path / "half.jsonl"
    bad.write_text("\n".join(lines[:10]) + "\n" + lines[10][:25] + "\n")
    with pytest.raises(BadArtifact, match="line 11 is not JSON"):
        load_nvml_session(bad)


def test_unrelated_csv_and_empty_and_non_numbers(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("name,value\na,1\n")
    with pytest.raises(BadArtifact, match="not an NVML session: no column t_s, gpu"):
        load_nvml_session(other)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(BadArtifact, match="holds no samples"):
        load_nvml_session(empty)
    words = tmp_path / "words.csv"
    words.write_text("t_s,gpu,power_w\n0.0,0,high\n")
    with pytest.raises(BadArtifact, match="power_w holds a non-number"):
        load_nvml_session(words)


def test_save_refuses_unknown_extension(tmp_path):
    with pytest.raises(BadArtifact, match="unknown session format"):
        save_nvml_session(_constructed(), tmp_path / "x.parquet")
