"""Every file kind gpu-workbench reads, fed broken and hostile bytes through the CLI (in process) and
the loaders: the committed corpus (tests/hostile/corpus) and the generated field x value matrix.

For every case: no traceback, no "please report" line, exit 0 or 2, an error is one line naming the
file, the inputs are byte-for-byte unchanged, and no pickle ran code (the sentinel, conftest.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hostile_cases as hc
from hostile_harness import CORPUS, alarm, assert_clean, digest_tree, run_cli
from workbench import samples
from workbench.errors import WorkbenchError


def _files(kind: str) -> list[Path]:
    return sorted((CORPUS / kind).iterdir())


def _ids(paths):
    return [p.name for p in paths]


def _stage(src: Path | bytes, work: Path, name: str) -> Path:
    dst = work / name
    if isinstance(src, bytes):
        dst.write_bytes(src)
    else:
        shutil.copyfile(src, dst)
    return dst


def _check_case(work: Path, argv: list, names: tuple[str, ...], outputs: tuple[str, ...] = ()):
    before = digest_tree(work)
    rc, out, err = run_cli(argv)
    assert_clean(rc, err, names)
    after = digest_tree(work)
    for k in outputs:
        after.pop(k, None)
    assert after == before, "an input changed (data loss)"
    return rc, out, err


def test_corpus_is_there():
    counts = {k: len(_files(k)) for k in hc.KINDS}
    assert sum(counts.values()) >= 200 and all(n >= 10 for n in counts.values()), counts


# -------------------------------------------------------------------------------------------- traces

_HTML_TRACES = {"valid.json", "valid.json.gz", "ts_1e308.json", "zero_and_negative_dur.json", "only_metadata_events.json",
                "device_id_list.json", "ts_descending.json", "huge_exponent.json", "valid_list_form.json"}


@pytest.mark.parametrize("path", _files("trace"), ids=_ids(_files("trace")))
def test_trace_corpus(path, _in_empty_folder):
    work = _in_empty_folder
    f = _stage(path, work, path.name)
    rc, out, _ = _check_case(work, ["trace", f.name, "--json"], (f.name,))
    if rc == 0:
        json.loads(out)  # the document is JSON
    _check_case(work, ["trace", f.name], (f.name,))
    if path.name in _HTML_TRACES:
        _check_case(work, ["trace", f.name, "--html", "out.html"], (f.name, "out.html"), outputs=("out.html",))
        _check_case(work, ["diff", f.name, samples.path("h200_streams_serial"), "--json"], (f.name,))
        _check_case(work, ["memory", samples.path("h200_train_snapshot"), "--profiler-timeline", f.name],
                    (f.name,))
    with alarm():
        try:
            from workbench.io import load_profiler_memory

            load_profiler_memory(f)
        except WorkbenchError:
            pass


_TRACE_MATRIX = [(f, v) for f in hc.TRACE_FIELDS for v in hc.HOSTILE_VALUES]


@pytest.mark.parametrize("field,value", _TRACE_MATRIX, ids=[f"{f}={v}" for f, v in _TRACE_MATRIX])
def test_trace_field_matrix(field, value, _in_empty_folder):
    f = _stage(hc.trace_with(field, hc.HOSTILE_VALUES[value]), _in_empty_folder, "case.json")
    rc, out, _ = _check_case(_in_empty_folder, ["trace", f.name, "--json"], (f.name,))
    if rc == 0:
        json.loads(out)


# ----------------------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("path", _files("snapshot"), ids=_ids(_files("snapshot")))
def test_snapshot_corpus(path, _in_empty_folder):
    work = _in_empty_folder
    f = _stage(path, work, path.name)
    rc, out, err = _check_case(work, ["memory", f.name, "--json"], (f.name,))
    if "flipped" in path.name or "truncated" in path.name or "garbage_after" in path.name:
        assert rc == 2, "a damaged gzip stream loaded without a word"
    if path.name.startswith("valid"):
        assert rc == 0, err
    if path.name in hc.REFUSED_BY_THE_UNPICKLER:
        assert rc == 2 and "refused to load" in err, err
    if path.name.startswith("negative") or "beyond_int64" in path.name:
        assert rc == 2, f"an out-of-range value loaded quietly: {out[:300]}"
    _check_case(work, ["memory", f.name], (f.name,))
    if path.name in _HTML_SNAPSHOTS:
        _check_case(work, ["memory", f.name, "--html", "out.html"], (f.name,), outputs=("out.html",))


_HTML_SNAPSHOTS = {"valid.pickle", "valid_protocol0.pickle", "old_segment_list.pickle", "unknown_action.pickle",
                   "deep_tuple_action_50k.pickle", "set_of_frozensets.pickle", "frames_of_ints.pickle"}
_SNAPSHOT_MATRIX = [(f, v) for f in hc.SNAPSHOT_FIELDS for v in hc.HOSTILE_VALUES]


@pytest.mark.parametrize("field,value", _SNAPSHOT_MATRIX, ids=[f"{f}={v}" for f, v in _SNAPSHOT_MATRIX])
def test_snapshot_field_matrix(field, value, _in_empty_folder):
    f = _stage(hc.snapshot_with(field, hc.HOSTILE_VALUES[value]), _in_empty_folder, "case.pickle")
    _check_case(_in_empty_folder, ["memory", f.name, "--json"], (f.name,))


@pytest.mark.parametrize("path", _files("sidecar"), ids=_ids(_files("sidecar")))
def test_bad_sidecar_never_hides_the_post_mortem(path, _in_empty_folder):
    work = _in_empty_folder
    snap = _stage(samples.path("h200_oom_snapshot"), work, "case.pickle.gz")
    _stage(path, work, "case.oom.json")
    rc, out, err = _check_case(work, ["memory", snap.name, "--json"], (snap.name,))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["oom"] and doc["oom"]["requested_bytes"] > 0, "the OOM post-mortem is missing"


@pytest.mark.parametrize("path", _files("timeline"), ids=_ids(_files("timeline")))
def test_profiler_timeline_corpus(path, _in_empty_folder):
    f = _stage(path, _in_empty_folder, path.name)
    _check_case(_in_empty_folder, ["memory", samples.path("h200_train_snapshot"), "--profiler-timeline", f.name,
                                   "--json"], (f.name,))


def test_memory_device_without_segments_is_an_error(_in_empty_folder):
    rc, out, err = run_cli(["memory", samples.path("h200_train_snapshot"), "--device", "99"])
    assert_clean(rc, err)
    assert rc == 2 and "no segments" in err and "device 99" in err, err


# ---------------------------------------------------------------------------------------------- NVML


def _monitor(f: str) -> list:
    return ["monitor", "--replay", f, "--speed", "100000", "--interval", "0.01", "--quiet", "--duration", "5"]


@pytest.mark.parametrize("path", _files("nvml"), ids=_ids(_files("nvml")))
def test_nvml_corpus(path, _in_empty_folder):
    f = _stage(path, _in_empty_folder, path.name)
    rc, _, err = _check_case(_in_empty_folder, _monitor(f.name), (f.name,))
    if path.name.startswith("valid"):
        assert rc == 0, err


_NVML_MATRIX = [(f, v) for f in hc.NVML_FIELDS for v in hc.HOSTILE_VALUES]


@pytest.mark.parametrize("field,value", _NVML_MATRIX, ids=[f"{f}={v}" for f, v in _NVML_MATRIX])
def test_nvml_field_matrix(field, value, _in_empty_folder):
    f = _stage(hc.nvml_with(field, hc.HOSTILE_VALUES[value]), _in_empty_folder, "case.jsonl")
    _check_case(_in_empty_folder, _monitor(f.name), (f.name,))


# ----------------------------------------------------------------------------------- ledgers, estimate


@pytest.mark.parametrize("path", _files("ledger"), ids=_ids(_files("ledger")))
def test_ledger_corpus(path, _in_empty_folder):
    from workbench.io import load_ledger

    f = _stage(path, _in_empty_folder, path.name)
    before = digest_tree(_in_empty_folder)
    with alarm():
        try:
            frame = load_ledger(f)
        except WorkbenchError as exc:
            assert f.name in str(exc) and "\n" not in str(exc)
        else:
            assert len(frame) >= 0
    assert digest_tree(_in_empty_folder) == before


@pytest.mark.parametrize("path", _files("estimate"), ids=_ids(_files("estimate")))
def test_estimate_corpus(path, _in_empty_folder):
    f = _stage(path, _in_empty_folder, path.name.removesuffix(".case"))
    rc, _, err = _check_case(_in_empty_folder, ["estimate", f.name, "--json"], (f.name,))
    if f.name == "valid.py":
        assert rc == 0, err


# ------------------------------------------------------------------------------ what is not a file


def _non_regular(kind: str, work: Path) -> Path:
    import os

    if kind == "fifo":
        p = work / "pipe.json"
        os.mkfifo(p)
    elif kind == "directory":
        p = work / "folder.json"
        p.mkdir()
    elif kind == "symlink_loop":
        p = work / "loop.json"
        os.symlink(p.name, p)
    elif kind == "dangling_symlink":
        p = work / "dangling.json"
        os.symlink("nowhere.json", p)
    elif kind == "long_name":
        p = work / ("n" * 300 + ".json")
    elif kind == "not_a_directory":
        (work / "file").write_text("x")
        p = work / "file" / "child.json"
    elif kind == "missing":
        p = work / "missing.json"
    elif kind == "char_device":
        p = Path("/dev/zero")
    elif kind == "empty":
        p = work / "empty.json"
        p.write_bytes(b"")
    else:
        raise AssertionError(kind)
    return p


_NON_REGULAR = ("fifo", "directory", "symlink_loop", "dangling_symlink", "long_name", "not_a_directory", "missing",
                "char_device", "empty")


def _argv_for(cmd: str, p: str) -> list:
    return {
        "trace": ["trace", p],
        "diff": ["diff", p, samples.path("h200_streams_serial")],
        "memory": ["memory", p],
        "timeline": ["memory", samples.path("h200_train_snapshot"), "--profiler-timeline", p],
        "monitor": _monitor(p),
        "estimate": ["estimate", p],
        "watch": ["watch", p],
    }[cmd]


@pytest.mark.parametrize("cmd", ["trace", "diff", "memory", "timeline", "monitor", "estimate", "watch"])
@pytest.mark.parametrize("kind", _NON_REGULAR)
def test_non_regular_inputs_are_one_line(cmd, kind, _in_empty_folder):
    p = _non_regular(kind, _in_empty_folder)
    rc, _, err = run_cli(_argv_for(cmd, str(p)))
    assert_clean(rc, err, (p.name[:40],))
    assert rc == 2, err
    assert len(err.strip().splitlines()) <= 2, err  # monitor may print its start line first


@pytest.mark.parametrize("kind", _NON_REGULAR)
def test_non_regular_inputs_to_the_loaders(kind, _in_empty_folder):
    from workbench.io import (load_ledger, load_memory_timeline, load_nvml_session, load_profiler_memory,
                              load_snapshot, load_trace)

    p = _non_regular(kind, _in_empty_folder)
    for load in (load_trace, load_snapshot, load_nvml_session, load_ledger, load_memory_timeline, load_profiler_memory):
        with alarm(), pytest.raises(WorkbenchError):
            load(p)


@pytest.mark.parametrize("kind", ("fifo", "char_device", "long_name", "not_a_directory", "symlink_loop"))
def test_panels_refuse_non_regular_files(kind, _in_empty_folder):
    """A panel given a FIFO would block the notebook's kernel while sniffing the file's head."""
    from workbench import ComparePanel, EstimatePanel, LiveGpuPanel, MemoryPanel, ProfilerPanel

    p = _non_regular(kind, _in_empty_folder)
    for panel in (ProfilerPanel, MemoryPanel, LiveGpuPanel, ComparePanel, EstimatePanel):
        with alarm(), pytest.raises(WorkbenchError) as ei:
            panel(str(p))
        assert p.name[:40] in str(ei.value)


# --------------------------------------------------------------------------------------------- flags


_BAD_FLAGS = [
    ["monitor", "--replay", "h200_nvml_session", "--speed", v] for v in ("nan", "inf", "-inf", "0", "-1", "abc", "1e400")
] + [
    ["monitor", "--replay", "h200_nvml_session", "--interval", v] for v in ("nan", "inf", "0", "-1", "1e9", "0.001")
] + [
    ["monitor", "--replay", "h200_nvml_session", "--duration", v] for v in ("nan", "inf", "-1", "x")
] + [
    ["monitor", "--replay", "h200_nvml_session", "--prometheus", v] for v in ("0", "99999", "-1", "65536", "http")
] + [
    ["monitor", "--replay", "h200_nvml_session", "--gpus", v] for v in ("a,b", "1.5", "")
] + [
    ["monitor", "--replay", "h200_nvml_session", "--csv", v] for v in ("out.txt", "nodir/out.csv", ".", "/dev/null")
] + [
    ["trace", "TRACE", "--top", v] for v in ("0", "-1", "x", "1e9", "99999999999")
] + [
    ["diff", "TRACE", "TRACE", "--top", v] for v in ("0", "-5", "many")
] + [
    ["memory", "SNAP", "--device", v] for v in ("-1", "99999", "x", "99", "1.5")
] + [
    ["memory", "SNAP", "--top", v] for v in ("0", "-1")
] + [
    ["estimate", "MODEL", "--batch-size", v] for v in ("0", "-1", "x")
] + [
    ["estimate", "MODEL", "--precision", "fp8"],
    ["trace"], ["memory"], ["diff", "TRACE"], ["monitor", "--no-such-flag"], ["nosuchcommand"],
    ["trace", "TRACE", "--html", "nodir/x.html"], ["trace", "TRACE", "--html", "."],
    ["memory", "SNAP", "--html", "/dev/null"], ["diff", "TRACE", "TRACE", "--html", "nodir/x.html"],
]


@pytest.mark.parametrize("argv", _BAD_FLAGS, ids=[" ".join(a) for a in _BAD_FLAGS])
def test_bad_flags_are_refused_up_front(argv, _in_empty_folder):
    model = _stage(CORPUS / "estimate" / "valid.py.case", _in_empty_folder, "model.py")
    sub = {"TRACE": str(samples.path("h200_streams_serial")), "SNAP": str(samples.path("h200_train_snapshot")),
           "MODEL": str(model)}
    argv = [sub.get(a, a) for a in argv]
    rc, out, err = run_cli(argv)
    assert_clean(rc, err)
    assert rc == 2, (rc, err)
    assert len(err.strip().splitlines()) == 1, err
    assert not out.strip() or argv[0] == "monitor", "work was done before the flag was refused"


def test_decoded_limit_is_as_documented(monkeypatch):
    from workbench.errors import BadArgument
    from workbench.io._files import LIMIT_ENV, decoded_limit

    monkeypatch.delenv(LIMIT_ENV, raising=False)
    MiB, GiB = 2**20, 2**30
    assert decoded_limit(0) == 64 * MiB and decoded_limit(100 * 1024) == 64 * MiB  # the floor
    assert decoded_limit(1 * MiB) == 256 * MiB  # 256x the file
    assert decoded_limit(1 * GiB) == 64 * GiB  # the absolute cap
    for text, want in (("1G", GiB), ("200g", 200 * GiB), ("512M", 512 * MiB), ("12345", 12345), ("3GiB", 3 * GiB)):
        monkeypatch.setenv(LIMIT_ENV, text)
        assert decoded_limit(1) == want, text
    monkeypatch.setenv(LIMIT_ENV, "0")
    assert decoded_limit(1) >= 2**62
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(BadArgument, match=LIMIT_ENV):
        decoded_limit(1)


def test_bad_limit_setting_is_one_line(monkeypatch, _in_empty_folder):
    monkeypatch.setenv("WORKBENCH_MAX_DECODED_BYTES", "-5")
    rc, _, err = run_cli(["trace", str(samples.path("h200_streams_serial"))])
    assert_clean(rc, err, ("WORKBENCH_MAX_DECODED_BYTES",))
    assert rc == 2, err


def test_gzip_crc_is_verified_by_every_loader(_in_empty_folder):
    """A flipped CRC is an error for every kind (the snapshot's pickle ends before the gzip trailer)."""
    from workbench.io import load_memory_timeline, load_nvml_session, load_snapshot, load_trace

    for kind, name, load in (("snapshot", "flipped_crc.pickle.gz", load_snapshot),
                             ("trace", "flipped_crc.json.gz", load_trace),
                             ("nvml", "flipped_crc.jsonl.gz", load_nvml_session),
                             ("timeline", "flipped_crc.json.gz", load_memory_timeline)):
        f = _stage(CORPUS / kind / name, _in_empty_folder, f"{kind}_{name}")
        with alarm(), pytest.raises(WorkbenchError, match="corrupt|CRC"):
            load(f)
