"""workbench.units (one formatter per quantity), io/_files.py (one gzip sniff), the snapshot Action enum,
BadArgument, and the old import paths of what moved."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from workbench import samples
from workbench.errors import BadArgument, WorkbenchError
from workbench.units import format_bytes, format_change, format_ms, format_pct, format_us, short_name


def test_format_bytes_torch_style_and_short_labels():
    # two decimals, as torch's OOM messages write them ("255.59 MiB reserved but unallocated")
    assert format_bytes(int(255.59 * 2**20)) == "255.59 MiB"
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(512) == "512 B" and format_bytes(-2**30) == "-1.00 GiB"
    assert format_bytes(5 * 2**40) == "5.00 TiB" and format_bytes(None) == "unknown"
    assert format_bytes(3 * 2**20, significant=3) == "3 MiB"
    assert format_bytes(1536, significant=3) == "1.5 KiB"
    assert format_bytes(1000.4 * 2**20, significant=3) == "1,000 MiB"  # never '1e+03'


def test_durations_and_shares():
    assert format_us(812.0) == "812 µs" and format_us(12_900.0) == "12.9 ms" and format_us(None) == "n/a"
    assert format_ms(12_345.0) == "12.35 ms" and format_ms(12_345.0, unit="") == "12.35"
    assert format_ms(812.0, 1, small_in_us=True) == "812 us" and format_ms(95_050.0, 1, small_in_us=True) == "95.0 ms"
    assert format_ms(None) == "-" and format_ms(float("nan"), 3, missing="n/a") == "n/a"
    assert format_pct(0.1234) == "12.3%" and format_pct(0.535, 0) == "54%" and format_pct(None) == "-"
    assert format_change(100.0, 112.3) == "+12.3%" and format_change(0, 5) == "" and format_change(None, 1) == ""


def test_short_name_both_ways_on_real_kernel_names():
    from workbench.io import load_trace

    names = set(load_trace(samples.path("h200_train_step")).kernels["name"].astype(str))
    gamma = next(n for n in names if "GammaBetaBackwardCUDAKernelTemplate" in n)
    assert short_name(gamma) == "at::native::GammaBetaBackwardCUDAKernelTemplate"
    # the CLI's tables keep template arguments; the anonymous namespace no longer cuts the name short
    assert short_name(gamma, 200, templates=True).startswith("at::native::GammaBetaBackwardCUDAKernelTemplate<float")
    assert not short_name(gamma, 200, templates=True).endswith(")")
    sgemm = next(n for n in names if n.startswith("void cutlass::Kernel2<"))
    assert short_name(sgemm) == "cutlass::Kernel2"
    assert short_name(sgemm, 80, templates=True) == sgemm[len("void "):sgemm.index(">(") + 1]  # tile shape kept
    cut = short_name(gamma, 40, templates=True, ellipsis="~")
    assert len(cut) == 40 and cut.endswith("~")


def test_one_gzip_sniff_for_every_loader(tmp_path):
    from workbench.io._files import is_gzip, open_maybe_gzip, read_maybe_gzip

    gz = samples.path("h200_train_step")  # a .json.gz
    assert is_gzip(gz) and is_gzip(gz.read_bytes()[:2])
    plain = tmp_path / "t.json.gz"  # a plain file with a .gz name
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert not is_gzip(plain)
    assert read_maybe_gzip(plain) == read_maybe_gzip(gz)
    with open_maybe_gzip(gz, "rt") as a, open_maybe_gzip(plain, "rt") as b:
        assert a.read(4096) == b.read(4096)
    with pytest.raises(BadArgument):
        open_maybe_gzip(gz, "wb")


def test_action_enum_is_the_action_column():
    from workbench.io.snapshot import ACTIONS, Action, load_snapshot

    snap = load_snapshot(samples.path("h200_oom_snapshot"))
    assert list(snap.events["action"].cat.categories) == list(ACTIONS) == [a.name.lower() for a in Action]
    codes = snap.events["action"].cat.codes.to_numpy()
    assert np.array_equal(codes == Action.OOM, (snap.events["action"] == "oom").to_numpy())
    assert (codes == Action.OOM).sum() == 1


def test_bad_argument_is_both_families():
    with pytest.raises(BadArgument, match="no sample named") as err:
        samples.path("no-such-sample")
    assert isinstance(err.value, WorkbenchError) and isinstance(err.value, ValueError)
    from workbench.analysis.memory.allocator_model import round_size

    with pytest.raises(ValueError, match="negative request"):  # callers that caught ValueError still do
        round_size(-1)
