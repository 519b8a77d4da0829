"""Safe snapshot loading: crafted malicious pickles never run, broken files give clear errors, real
snapshots load in every protocol and layout, without torch."""

from __future__ import annotations

import copyreg
import gzip
import io
import json
import os
import pickle
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from workbench import samples
from workbench.errors import BadArtifact, UnsafePickle
from workbench.io._unpickle import SnapshotUnpickler
from workbench.io.snapshot import (
    ACTIONS,
    load_snapshot,
    load_snapshot_dict,
    save_snapshot,
    snapshot_from_dict,
)

OOM = samples.path("h200_oom_snapshot")
TRAIN = samples.path("h200_train_snapshot")


def _raw(path):
    """Trusted shipped sample, read with plain pickle as the independent reference."""
    with gzip.open(path) as f:
        return pickle.load(f)


# ---------------------------------------------------------------------------------------------
# malicious pickles
# ---------------------------------------------------------------------------------------------

def _touch_cmd(sentinel: Path) -> str:
    return f"touch {sentinel}"


class _Reduce:
    """Pickles as ``func(*args)``: what an attacker's object looks like on the wire."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(sentinel: Path):
    """name -> object whose unpickling with plain pickle would create ``sentinel``."""
    import builtins
    import subprocess as sp

    cmd = _touch_cmd(sentinel)
    py = f"open({str(sentinel)!r}, 'w').close()"
    return {
        "os.system": _Reduce(os.system, (cmd,)),
        "eval": _Reduce(eval, (py,)),
        "exec": _Reduce(exec, (py,)),
        "subprocess.Popen": _Reduce(sp.Popen, (["touch", str(sentinel)],)),
        "builtins.__import__": _Reduce(getattr, (_Reduce(builtins.__import__, ("os",)), "system")),
        # the call at the outside: getattr(__import__('os'), 'system')(cmd)
        "getattr_chain": _Reduce(_Reduce(getattr, (_Reduce(builtins.__import__, ("os",)), "system")), (cmd,)),
        # a snapshot-looking dict with the payload nested deep inside a trace entry
        "nested_in_dict": {
            "segments": [],
            "device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "frames": [
                {"name": "f", "filename": "x.py", "line": 1, "evil": _Reduce(os.system, (cmd,))}]}]],
        },
    }


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("name", ["os.system", "eval", "exec", "subprocess.Popen", "builtins.__import__",
                                  "getattr_chain", "nested_in_dict"])
def test_malicious_pickles_are_refused_and_never_run(tmp_path, name, protocol):
    sentinel = tmp_path / "pwned"
    payload = _payloads(sentinel)[name]
    if name == "getattr_chain":
        # pickle cannot reduce to a callable that is itself a reduce; write the opcodes by hand:
        # builtins.getattr(builtins.__import__('os'), 'system')('touch ...')
        data = _getattr_chain_bytes(_touch_cmd(sentinel), protocol)
    else:
        data = pickle.dumps(payload, protocol=protocol)
    f = tmp_path / f"evil-{protocol}.pickle.gz"
    f.write_bytes(gzip.compress(data))
    with pytest.raises(UnsafePickle) as err:
        load_snapshot(f)
    msg = str(err.value)
    assert str(f) in msg
    assert "Nothing from the file was executed" in msg
    # the refused global is named (protocols < 3 spell builtins/subprocess the Python 2 way)
    assert any(f".{g}" in msg for g in ("system", "eval", "exec", "Popen", "getattr", "__import__"))
    assert not sentinel.exists()


def _getattr_chain_bytes(cmd: str, protocol: int) -> bytes:
    # protocol 0 text opcodes work in every protocol's reader; the header sets the protocol
    body = (
        b"c__builtin__\ngetattr\n"      # GLOBAL getattr  (protocol <3 name for builtins)
        b"(c__builtin__\n__import__\n(S'os'\ntRS'system'\ntR"  # getattr(__import__('os'), 'system')
        b"(S'" + cmd.encode() + b"'\ntR."                     # (...)(cmd)
    )
    return (b"\x80" + bytes([protocol]) if protocol >= 2 else b"") + body


def test_the_crafted_payloads_really_are_dangerous(tmp_path):
    """Control: plain pickle would have executed them (so the refusals above mean something)."""
    for name in ("os.system", "exec", "getattr_chain"):
        sentinel = tmp_path / f"ran-{name}"
        if name == "getattr_chain":
            data = _getattr_chain_bytes(_touch_cmd(sentinel), 2)
        else:
            data = pickle.dumps(_payloads(sentinel)[name], protocol=2)
        pickle.loads(data)
        assert sentinel.exists(), name


@pytest.mark.parametrize("opcodes", [
    # INST: MARK args 'i' module name -> instance built by calling the class
    b"(S'touch {s}'\nios\nsystem\n.",
    # OBJ: MARK class args 'o'
    b"(cos\nsystem\nS'touch {s}'\no.",
    # GLOBAL + REDUCE inside a dict (protocol 0)
    b"(dp0\nS'segments'\np1\ncos\nsystem\n(S'touch {s}'\ntRs.",
    # STACK_GLOBAL (protocol 4) + REDUCE
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x00X\x00\x00\x00\x00\x85R.",
])
def test_raw_opcode_forms_are_refused(tmp_path, opcodes):
    sentinel = tmp_path / "pwned"
    data = opcodes.replace(b"{s}", str(sentinel).encode())
    if data.startswith(b"\x80\x04"):
        cmd = f"touch {sentinel}".encode()
        data = (b"\x80\x04\x8c\x02os\x8c\x06system\x93X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R.")
    f = tmp_path / "evil.pickle"
    f.write_bytes(data)
    with pytest.raises(UnsafePickle):
        load_snapshot(f)
    assert not sentinel.exists()


def test_extension_registry_and_persistent_ids_are_refused(tmp_path):
    sentinel = tmp_path / "pwned"
    code = 0xF1
    copyreg.add_extension("os", "system", code)
    try:
        cmd = f"touch {sentinel}".encode()
        data = b"\x80\x02\x82" + bytes([code]) + b"X" + len(cmd).to_bytes(4, "little") + cmd + b"\x85R."
        f = tmp_path / "ext.pickle"
        f.write_bytes(data)
        with pytest.raises(UnsafePickle, match="os.system"):
            load_snapshot(f)
    finally:
        copyreg.remove_extension("os", "system", code)
    assert not sentinel.exists()
    f = tmp_path / "persid.pickle"
    f.write_bytes(b"\x80\x02X\x03\x00\x00\x00abcQ.")
    with pytest.raises(UnsafePickle, match="persistent id"):
        load_snapshot(f)


def test_plain_containers_spelled_with_globals_are_allowed():
    data = pickle.dumps(OrderedDict(segments=[], device_traces=[[{"action": "alloc", "addr": 4096, "size": 512,
                                                                   "time_us": 1, "frames": []}]]), protocol=2)
    obj = SnapshotUnpickler(io.BytesIO(data)).load()
    assert isinstance(obj, OrderedDict)
    data = pickle.dumps({"s": {1, 2}, "f": frozenset({3})}, protocol=2)
    assert SnapshotUnpickler(io.BytesIO(data)).load() == {"s": {1, 2}, "f": frozenset({3})}


# ---------------------------------------------------------------------------------------------
# broken files
# ---------------------------------------------------------------------------------------------

def test_truncated_gzip(tmp_path):
    data = OOM.read_bytes()
    f = tmp_path / "cut.pickle.gz"
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadArtifact) as err:
        load_snapshot(f)
    assert not isinstance(err.value, UnsafePickle)
    assert str(f) in str(err.value) and "truncated" in str(err.value) and "Copy the file again" in str(err.value)


def test_truncated_pickle(tmp_path):
    raw = gzip.decompress(OOM.read_bytes())
    f = tmp_path / "cut.pickle"
    f.write_bytes(raw[: len(raw) // 3])
    with pytest.raises(BadArtifact) as err:
        load_snapshot(f)
    assert str(f) in str(err.value) and "truncated" in str(err.value)


@pytest.mark.parametrize("content", [b"", b"# not a pickle\nhello\n", b"\x89PNG\r\n\x1a\n" + b"\0" * 64,
                                     b'{"traceEvents": []}'])
def test_non_pickle_files(tmp_path, content):
    f = tmp_path / "x.pickle"
    f.write_bytes(content)
    with pytest.raises(BadArtifact) as err:
        load_snapshot(f)
    assert str(f) in str(err.value)
    assert "snapshot" in str(err.value)  # says what is expected / how to make one


def test_pickle_of_something_else(tmp_path):
    f = tmp_path / "other.pickle"
    f.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(BadArtifact, match="not a CUDA allocator snapshot"):
        load_snapshot(f)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(BadArtifact, match="no such file"):
        load_snapshot(tmp_path / "nope.pickle.gz")
    with pytest.raises(BadArtifact, match="directory"):
        load_snapshot(tmp_path)


# ---------------------------------------------------------------------------------------------
# real snapshots: protocols, layouts, columns
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_real_snapshot_in_every_protocol(tmp_path, protocol):
    raw = _raw(OOM)
    f = tmp_path / f"p{protocol}.pickle"
    f.write_bytes(pickle.dumps(raw, protocol=protocol))
    snap = load_snapshot(f)
    assert len(snap.events) == len(raw["device_traces"][0]) == 150
    assert len(snap.segments) == len(raw["segments"]) == 36


def test_columns_match_the_raw_pickle():
    raw = _raw(TRAIN)
    snap = load_snapshot(TRAIN)
    trace = raw["device_traces"][0]
    assert len(snap.events) == len(trace)
    assert snap.events["action"].astype(str).tolist() == [e["action"] for e in trace]
    assert snap.events["addr"].tolist() == [e["addr"] for e in trace]
    assert snap.events["size_bytes"].tolist() == [e["size"] for e in trace]
    assert snap.events["time_us"].tolist() == [e["time_us"] for e in trace]
    # interned stacks give back each event's frames exactly
    for i in (0, 1000, len(trace) - 1):
        frames = snap.stack_frames(int(snap.events["stack_id"].iloc[i]))
        assert frames["name"].tolist() == [f["name"] for f in trace[i]["frames"]]
        assert frames["line"].tolist() == [f["line"] for f in trace[i]["frames"]]
    # far fewer distinct stacks than events
    assert len(snap.stacks) < len(trace) / 10
    assert snap.segments["total_size_bytes"].sum() == sum(s["total_size"] for s in raw["segments"])
    assert len(snap.blocks) == sum(len(s["blocks"]) for s in raw["segments"])
    assert set(snap.events["action"].cat.categories) == set(ACTIONS)


def test_oom_event_keeps_device_free():
    raw = _raw(OOM)
    snap = load_snapshot(OOM)
    last = snap.events.iloc[-1]
    assert last["action"] == "oom"
    assert last["size_bytes"] == raw["device_traces"][0][-1]["size"] == 1073741824
    assert last["device_free_bytes"] == raw["device_traces"][0][-1]["device_free"]


def test_older_layouts(tmp_path):
    """torch <= 2.0 wrote a bare list of segments whose blocks carry 'history' instead of 'frames'
    and no segment_type; rebuild that shape from the real OOM snapshot."""
    raw = _raw(OOM)
    old = []
    for s in raw["segments"]:
        s = dict(s)
        s.pop("segment_type")
        blocks = []
        for b in s["blocks"]:
            b = dict(b)
            frames = b.pop("frames")
            req = b.pop("requested_size")
            if b["state"] == "active_allocated":
                b["history"] = [{"addr": b["address"], "real_size": req, "frames": frames}]
            blocks.append(b)
        s["blocks"] = blocks
        old.append(s)
    f = tmp_path / "old.pickle"
    f.write_bytes(pickle.dumps(old, protocol=2))
    snap = load_snapshot(f)
    assert snap.layout == "segments_list" and not snap.has_history and len(snap.events) == 0
    new = load_snapshot(OOM)
    assert snap.segments["total_size_bytes"].tolist() == new.segments["total_size_bytes"].tolist()
    # the 2 MiB segments are recognised as the small pool
    assert (snap.segments["segment_type"] == new.segments["segment_type"]).all()
    # frames come from the history entries: the same blocks have stacks as in the current layout
    act = (snap.blocks["state"] == "active_allocated").to_numpy()
    assert act.sum() > 100
    assert ((snap.blocks["stack_id"].to_numpy() >= 0)[act] == (new.blocks["stack_id"].to_numpy() >= 0)[act]).all()
    assert snap.blocks["requested_size_bytes"].to_numpy()[act].tolist() == \
        new.blocks["requested_size_bytes"].to_numpy()[act].tolist()
    # and the analysis still answers from the state alone
    from workbench.analysis.memory.oom import memory_summary

    s = memory_summary(snap)
    assert s["allocated_bytes"] == new.segments["allocated_size_bytes"].sum()
    assert any(f["id"] == "no_history" for f in s["findings"])


def test_trace_entries_without_time_or_frames(tmp_path):
    d = {"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 1 << 30, "size": 2 << 20, "stream": 0},
        {"action": "alloc", "addr": 1 << 30, "size": 512, "stream": 0},
        {"action": "some_future_action", "addr": 0, "size": 0},
        {"action": "free_completed", "addr": 1 << 30, "size": 512, "stream": 0},
    ]]}
    snap = snapshot_from_dict(d, "made-up")
    assert snap.events["action"].astype(str).tolist() == ["segment_alloc", "alloc", "free_completed"]
    assert snap.events["time_us"].tolist() == [0, 1, 3]  # the index stands in for time
    assert (snap.events["stack_id"] == -1).all()
    assert snap.extra["skipped_actions"] == ["some_future_action"]


def test_save_snapshot_is_atomic_and_loads(tmp_path):
    raw = _raw(OOM)
    out = save_snapshot(raw, tmp_path / "sub" / "x.pickle.gz")
    assert out.exists() and not list(out.parent.glob(".*tmp"))
    assert len(load_snapshot(out).events) == 150

    class Boom:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    target = tmp_path / "y.pickle.gz"
    with pytest.raises(RuntimeError):
        save_snapshot({"segments": [Boom()]}, target)
    assert not target.exists() and not list(tmp_path.glob(".y*"))


def test_loads_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from workbench.io.snapshot import load_snapshot\n"
        "from workbench.analysis.memory.oom import memory_summary\n"
        "from workbench import samples\n"
        "s = memory_summary(load_snapshot(samples.path('h200_oom_snapshot')))\n"
        "print(s['oom']['cause'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "capacity"


def test_load_snapshot_dict_matches_pickle():
    assert load_snapshot_dict(OOM) == _raw(OOM)


# ---------------------------------------------------------------------------------------------
# torch.profiler memory timelines


@pytest.mark.parametrize("suffix", [".json", ".raw.json.gz"])
def test_empty_memory_timeline_names_the_file_and_the_device_fix(tmp_path, suffix):
    """A real export for a device nothing lived on (device='cuda' without an index, the mistake that
    emptied notebook 22's timeline on an H200: torch compares devices exactly). torch writes an empty
    timeline ([[], []], or [] in the raw form); the loader must say so and how to export it right, not
    fail reshaping."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    from workbench.io.profiler_memory import load_memory_timeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        a = torch.randn(64, 64, requires_grad=True)
        (a @ a).sum().backward()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        good, empty = tmp_path / f"cpu{suffix}", tmp_path / f"cuda{suffix}"
        prof.export_memory_timeline(str(good), device="cpu")
        prof.export_memory_timeline(str(empty), device="cuda")  # no tensor lived there
    raw = gzip.decompress(empty.read_bytes()) if suffix.endswith(".gz") else empty.read_bytes()
    assert json.loads(raw) in ([[], []], [])  # what torch really wrote
    assert load_memory_timeline(good)["temporaries_bytes"].max() > 0
    with pytest.raises(BadArtifact) as err:
        load_memory_timeline(empty)
    msg = str(err.value)
    assert empty.name in msg and "empty" in msg and "device='cuda:0'" in msg


def test_a_large_snapshot_load_shows_progress_for_both_stages(capsys):
    """progress=True (what a large file gets with progress=None: the 1.6M-event snapshot of the shared
    data is 12 MiB gzipped, above the 8 MiB-of-pickle threshold) shows the read and the conversion."""
    from workbench import samples
    from workbench.io.snapshot import _PROGRESS_BYTES, _progress_bar, load_snapshot

    load_snapshot(samples.path("h200_train_snapshot"), progress=True)
    err = capsys.readouterr().err
    assert "reading h200_train.snapshot.pickle.gz" in err and "columns" in err
    bar = _progress_bar(None, 12 * 2**20 * 20, 12 * 2**20, "reading big")  # a 12 MiB .gz, ~20x unpacked
    assert bar is not None and bar.total == 12 * 2**20
    bar.close()
    assert _progress_bar(None, _PROGRESS_BYTES - 1, 10, "small") is None
