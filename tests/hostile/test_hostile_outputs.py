"""Outputs (--csv, --html, saved sessions, ledgers, snapshots): checked before the work starts, never
written over an input, written atomically with the existing file's mode kept, never through a
symlink or into a FIFO, and the overwrite is said."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest

from hostile_harness import assert_clean, digest_tree, run_cli
from workbench import samples


def _replay(csv: str, src="h200_nvml_session") -> list:
    return ["monitor", "--replay", src, "--speed", "100000", "--interval", "0.01", "--quiet", "--csv", csv]


def test_csv_over_the_replayed_recording_is_refused(_in_empty_folder):
    rec = _in_empty_folder / "rec.jsonl.gz"
    rec.write_bytes(samples.path("h200_nvml_session").read_bytes())
    before = digest_tree(_in_empty_folder)
    for target in ("rec.jsonl.gz", "./rec.jsonl.gz", str(rec)):
        rc, out, err = run_cli(_replay(target, src="rec.jsonl.gz"))
        assert_clean(rc, err, ("rec.jsonl.gz",))
        assert rc == 2 and "input" in err, err
    os.link(rec, _in_empty_folder / "hardlink.jsonl.gz")  # the same file under another name
    rc, out, err = run_cli(_replay("hardlink.jsonl.gz", src="rec.jsonl.gz"))
    assert rc == 2 and "input" in err, err
    assert digest_tree(_in_empty_folder) == before | {"hardlink.jsonl.gz": before["rec.jsonl.gz"]}


def test_html_over_an_input_is_refused(_in_empty_folder):
    t = _in_empty_folder / "t.json.gz"
    t.write_bytes(samples.path("h200_streams_serial").read_bytes())
    before = digest_tree(_in_empty_folder)
    for argv in (["trace", "t.json.gz", "--html", "t.json.gz"], ["diff", "t.json.gz", "t.json.gz", "--html", "t.json.gz"]):
        rc, out, err = run_cli(argv)
        assert_clean(rc, err)
        assert rc == 2 and "input" in err and not out, err
    s = _in_empty_folder / "s.pickle.gz"
    s.write_bytes(samples.path("h200_oom_snapshot").read_bytes())
    (_in_empty_folder / "s.oom.json").write_text("{}")
    before = digest_tree(_in_empty_folder)
    for target in ("s.pickle.gz", "s.oom.json"):
        rc, out, err = run_cli(["memory", "s.pickle.gz", "--html", target])
        assert rc == 2 and "input" in err, err
    assert digest_tree(_in_empty_folder) == before


def test_unwritable_target_is_found_before_the_work(_in_empty_folder):
    # the old behaviour: sample for the whole replay, then a traceback at the end and every sample lost
    t0 = time.perf_counter()
    rc, out, err = run_cli(["monitor", "--replay", "h200_nvml_session", "--csv", "no/such/folder/out.csv"])
    assert_clean(rc, err, ("no/such/folder",))
    assert rc == 2 and time.perf_counter() - t0 < 10, err  # refused at once (a replay at speed 1 takes 40 s)
    rc, out, err = run_cli(["trace", str(samples.path("h200_streams_serial")), "--html", "no/such/out.html"])
    assert rc == 2 and not out and "no/such" in err, err
    if os.geteuid() != 0:  # root writes anywhere
        ro = _in_empty_folder / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        rc, out, err = run_cli(["trace", str(samples.path("h200_streams_serial")), "--html", str(ro / "x.html")])
        assert rc == 2 and "not writable" in err, err


def test_symlink_fifo_and_device_targets_are_refused(_in_empty_folder):
    victim = _in_empty_folder / "victim.txt"
    victim.write_text("keep me")
    os.symlink("victim.txt", _in_empty_folder / "link.html")
    os.mkfifo(_in_empty_folder / "fifo.html")
    (_in_empty_folder / "folder.html").mkdir()
    trace = str(samples.path("h200_streams_serial"))
    for target, word in (("link.html", "symbolic link"), ("fifo.html", "FIFO"), ("folder.html", "directory"),
                         ("/dev/null", "character device")):
        rc, out, err = run_cli(["trace", trace, "--html", target])
        assert_clean(rc, err, (target,))
        assert rc == 2 and word in err, err
    assert victim.read_text() == "keep me"


def test_overwrite_is_atomic_keeps_mode_and_is_said(_in_empty_folder):
    trace = str(samples.path("h200_streams_serial"))
    out = _in_empty_folder / "report.html"
    rc, _, err = run_cli(["trace", trace, "--html", "report.html"])
    assert rc == 0 and "replaced" not in err, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    out.chmod(0o640)
    rc, _, err = run_cli(["trace", trace, "--html", "report.html"])
    assert rc == 0 and "replaced the existing file" in err, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in _in_empty_folder.iterdir()) == ["report.html"]  # no temporary left behind
    csv = _in_empty_folder / "s.csv"
    rc, _, err = run_cli(_replay("s.csv"))
    assert rc == 0 and "samples to" in err and "replaced" not in err, err
    csv.chmod(0o600)
    rc, _, err = run_cli(_replay("s.csv"))
    assert rc == 0 and "replaced the existing file" in err, err
    assert stat.S_IMODE(csv.stat().st_mode) == 0o600


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_a_failing_writer_leaves_the_old_file(_in_empty_folder):
    from workbench.io._files import atomic_write

    f = _in_empty_folder / "keep.txt"
    f.write_text("old")

    def boom(fh):
        fh.write(b"half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError):
        atomic_write(f, boom)
    assert f.read_text() == "old"
    assert sorted(p.name for p in _in_empty_folder.iterdir()) == ["keep.txt"]


def test_savers_refuse_symlinks_and_keep_modes(_in_empty_folder):
    from workbench.errors import BadArgument
    from workbench.io import load_nvml_session, save_ledger, save_nvml_session, save_snapshot

    frame = load_nvml_session(samples.path("h200_nvml_session"))
    victim = _in_empty_folder / "victim"
    victim.write_text("keep")
    for name, save in (("s.jsonl", lambda p: save_nvml_session(frame, p)),
                       ("l.json", lambda p: save_ledger([{"configuration": "fp32"}], p)),
                       ("x.pickle.gz", lambda p: save_snapshot({"segments": [], "device_traces": []}, p))):
        link = _in_empty_folder / name
        os.symlink("victim", link)
        with pytest.raises(BadArgument, match="symbolic link"):
            save(link)
        link.unlink()
        save(link)
        link.chmod(0o604)
        save(link)
        assert stat.S_IMODE(link.stat().st_mode) == 0o604
    assert victim.read_text() == "keep"


def test_concurrent_reader_never_sees_half_a_report(_in_empty_folder):
    """While the report is rewritten, a reader sees the old or the new file, never a prefix of either."""
    trace = str(samples.path("h200_streams_serial"))
    rc, _, _ = run_cli(["trace", trace, "--html", "r.html"])
    assert rc == 0
    first = (_in_empty_folder / "r.html").read_bytes()
    seen, stop = set(), threading.Event()

    def read():
        while not stop.is_set():
            data = (_in_empty_folder / "r.html").read_bytes()
            seen.add(data.endswith(b"</html>") and len(data) > 1000)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        rc, _, _ = run_cli(["trace", trace, "--html", "r.html"])
    finally:
        stop.set()
        t.join(10)
    assert rc == 0 and seen == {True} and first
