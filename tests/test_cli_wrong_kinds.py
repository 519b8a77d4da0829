"""Every command recognises its input by content, as the panels do (io/kinds.py): given another kind of
artifact it says in one line which file, what it is and the command that reads it, exit 2 (never a loader's
guess such as "load it with pickle directly" or "syntax error on line None"). And the shipped samples'
names work wherever a file does."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from testdata import ROOT
from workbench import samples
from workbench.cli import main
from workbench.commands._checks import use_instead
from workbench.io.kinds import KINDS, describe

# a 1x1 PNG
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """kind -> a file (or folder) of that kind, under a short name in one folder."""
    d = tmp_path_factory.mktemp("kinds")
    out = {}
    for kind, src, name in (("trace", samples.path("h200_train_step"), "t.json.gz"),
                            ("snapshot", samples.path("h200_oom_snapshot"), "s.pickle.gz"),
                            ("memory_timeline", samples.path("h200_memory_timeline"), "mt.json.gz"),
                            ("nvml", samples.path("h200_nvml_session"), "n.jsonl.gz"),
                            ("ledger", ROOT / "tests" / "hostile" / "corpus" / "ledger" / "valid.json", "l.json"),
                            ("model_file", ROOT / "examples" / "estimate_mlp.py", "m.py")):
        shutil.copyfile(src, d / name)
        out[kind] = str(d / name)
    (d / "watch").mkdir()
    (d / "watch" / "index.jsonl").write_text(json.dumps(
        {"time_ns": 1, "reason": "signal", "first_step": 3, "steps": 3, "trace": "cap.pt.trace.json.gz",
         "snapshot": None, "nvml": None, "rank": 0}) + "\n")
    out["watch"] = str(d / "watch" / "index.jsonl")
    shutil.copytree(samples.path("ranks_healthy"), d / "ranks")
    out["rank_folder"] = str(d / "ranks")
    (d / "shot.png").write_bytes(PNG)
    out["image"] = str(d / "shot.png")
    (d / "r.html").write_text("<!DOCTYPE html>\n<html><head><title>report</title></head><body></body></html>\n")
    out["html"] = str(d / "r.html")
    return out


# command -> (argv with {} for the file, the kinds it reads, what the message says it takes)
COMMANDS = {
    "trace": (["trace", "{}"], {"trace", "rank_folder"}, "a Kineto trace"),
    "memory": (["memory", "{}"], {"snapshot"}, "an allocator snapshot"),
    "estimate": (["estimate", "{}"], {"model_file"}, "a Python model file"),
    "ranks": (["ranks", "{}", "--no-cache", "--processes", "1"], {"trace", "rank_folder"}, "a per-rank Kineto trace"),
    "monitor": (["monitor", "--replay", "{}", "--quiet"], {"nvml"}, "an NVML session"),
    "timeline --trace": (["timeline", "--trace", "{}"], {"trace"}, "a Kineto trace"),
    "timeline --memory": (["timeline", "--memory", "{}"], {"snapshot", "trace"}, "an allocator snapshot"),
    "timeline --nvml": (["timeline", "--nvml", "{}"], {"nvml"}, "an NVML session"),
    "watch": (["watch", "{}"], {"watch"}, "a flight recorder's output folder (watch(...)) or its index.jsonl"),
}
FILE_KINDS = ["trace", "snapshot", "memory_timeline", "nvml", "ledger", "model_file", "rank_folder", "image", "html",
              "watch"]
CASES = [(c, k) for c, (_, reads, _) in COMMANDS.items() for k in FILE_KINDS if k not in reads]
TIMELINE_FLAG = {"trace": "--trace", "snapshot": "--memory", "nvml": "--nvml"}


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _run(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("command, kind", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_a_command_given_another_kind_says_what_it_is_and_what_reads_it(command, kind, files, capsys):
    argv, _, takes = COMMANDS[command]
    path = files[kind]
    rc, err = _run([a.replace("{}", path) for a in argv], capsys)
    line = _one_error_line(err)
    assert rc == 2, err
    head = command.split()[0]
    assert line.startswith(f"workbench {head}: error: {path}: is {describe(kind)}, not {takes}. "), line
    if command.startswith("timeline") and kind in TIMELINE_FLAG:
        assert line.endswith(f"Give it as `workbench timeline {TIMELINE_FLAG[kind]} {path}`"), line
    else:
        assert line.endswith(use_instead(kind, path)), line
        k = KINDS[kind]
        assert (f"`workbench {k.command}" in line) if k.command else (k.fits in line), line
    for guess in ("pickle directly", "line None", "Traceback", "please report"):
        assert guess not in line


@pytest.mark.parametrize("base_kind", ["trace", "snapshot"])
@pytest.mark.parametrize("kind", [k for k in FILE_KINDS])
def test_diff_given_another_kind(base_kind, kind, files, capsys):
    if kind == base_kind:
        pytest.skip("the same kind is a diff")
    for argv, other in (([files[base_kind], files[kind]], files[kind]), ([files[kind], files[base_kind]], files[kind])):
        rc, err = _run(["diff", *argv], capsys)
        line = _one_error_line(err)
        assert rc == 2 and line.startswith("workbench diff: error: "), err
        if {base_kind, kind} == {"trace", "snapshot"}:
            assert f"{files['trace']}: is a Kineto trace and {files['snapshot']} an allocator snapshot" in line
            assert "give two of one kind" in line
        elif kind == "rank_folder":
            assert f"{other}: is a folder of traces, not a file" in line and f"`workbench ranks {other}`" in line
        else:
            assert f"{other}: is {describe(kind)}, not a Kineto trace or an allocator snapshot" in line, line
            assert line.endswith(use_instead(kind, other)), line


def test_memory_on_what_no_sniffer_knows_never_advises_pickle(tmp_path, capsys):
    for name, data in (("notes.txt", b"hello\n"), ("blob.bin", bytes(range(1, 200))),
                       ("text.pickle.gz", gzip.compress(b"just text\n"))):
        (tmp_path / name).write_bytes(data)
        rc, err = _run(["memory", str(tmp_path / name)], capsys)
        line = _one_error_line(err)
        assert rc == 2 and f"{tmp_path / name}: is not an allocator snapshot" in line, line
        assert "torch.cuda.memory._dump_snapshot" in line and "pickle directly" not in line


def test_a_sample_name_in_a_suggestion_stays_a_sample_name(capsys):
    rc, err = _run(["memory", "h200_train_step"], capsys)
    assert rc == 2 and _one_error_line(err).endswith("Use `workbench trace h200_train_step`"), err


# --------------------------------------------------------------------------------------------- samples


@pytest.mark.parametrize("argv, expect", [
    (["trace", "h200_train_step", "--json", "--top", "3"], lambda d: len(d["top_kernels"]) == 3),
    (["memory", "h200_oom_snapshot", "--json", "--top", "3"], lambda d: d["oom"] is not None),
    (["diff", "h200_streams_serial", "h200_streams_overlap", "--json", "--top", "3"], lambda d: "kernels" in d),
    (["timeline", "--trace", "h200_timeline_trace", "--nvml", "h200_timeline_nvml", "--json"],
     lambda d: d["clock"] == "unix_ns"),
    (["ranks", "ranks_straggler", "--json", "--no-cache", "--processes", "1"], lambda d: d["straggler"]["rank"] == 2),
], ids=["trace", "memory", "diff", "timeline", "ranks"])
def test_sample_names_work_where_files_do(argv, expect, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file of that name here
    assert main(argv) == 0, capsys.readouterr().err
    assert expect(json.loads(capsys.readouterr().out))


def test_a_file_of_a_samples_name_wins(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h200_train_step").write_bytes(PNG)  # the user's own file of that name is what they meant
    rc, err = _run(["trace", "h200_train_step"], capsys)
    assert rc == 2 and "h200_train_step: is an image" in err
