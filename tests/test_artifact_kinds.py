"""The artifact registry (workbench/io/kinds.py): every kind recognises its own sample, the CLI and the
panels agree on what a file is, and every loader / panel / command the registry names exists."""

from __future__ import annotations

import importlib
import inspect
import shutil

import pytest

from testdata import DATA, ROOT
from workbench import samples
from workbench.errors import BadArtifact
from workbench.io import kinds
from workbench.io.kinds import KINDS, UNKNOWN, kind_of, sniff_file, sniff_path

LEDGER_JSON = ROOT / "tests" / "hostile" / "corpus" / "ledger" / "valid.json"


@pytest.fixture(scope="module")
def sample_files(tmp_path_factory) -> dict[str, list]:
    """kind -> files of that kind: the shipped samples and test data, plus the other formats of a kind
    written by its own io (NVML CSV, Parquet ledger)."""
    from workbench.io import load_ledger, load_nvml_session, save_ledger, save_nvml_session

    tmp = tmp_path_factory.mktemp("kinds")
    csv = save_nvml_session(load_nvml_session(samples.path("h200_nvml_session")), tmp / "session.csv")
    out = {
        "trace": [samples.path("h200_train_step"), samples.path("cpu_only"), samples.path("mi250_rocm")],
        "snapshot": [samples.path("h200_oom_snapshot"), samples.path("h200_train_snapshot")],
        "memory_timeline": [samples.path("h200_memory_timeline")],
        "nvml": [samples.path("h200_nvml_session"), samples.path("h200_gpm_session"), csv],
        "ledger": [LEDGER_JSON],
        "model_file": [ROOT / "examples" / "estimate_mlp.py"],
        "rank_folder": [samples.path("ranks_healthy")],
        "image": [ROOT / "docs" / "screenshots" / "panel_ranks.png"],
        "nvidia_smi": [DATA / "gpu_logs" / "nvidia_smi.csv", DATA / "gpu_logs" / "nvidia_smi_nounits.csv"],
        "dcgm": [DATA / "gpu_logs" / "dcgm_scrapes.txt", DATA / "gpu_logs" / "dcgm_timestamped.txt"],
        "metrics_table": [DATA / "gpu_logs" / "metrics.csv", DATA / "gpu_logs" / "metrics.jsonl"],
        "html": [tmp / "report.html"],
    }
    (tmp / "report.html").write_text("<!DOCTYPE html>\n<html><body>a --html report</body></html>\n")
    # a flight recorder's folder (workbench.capture.watch): its index, and the folder, which holds a trace too
    # (a watch folder, not a rank folder)
    (tmp / "watch").mkdir()
    shutil.copyfile(samples.path("h200_train_step"), tmp / "watch" / "cap-0000003-rank0-file.pt.trace.json.gz")
    (tmp / "watch" / "index.jsonl").write_text(
        '{"time_ns":1,"reason":"file","first_step":3,"steps":3,"trace":"cap-0000003-rank0-file.pt.trace.json.gz",'
        '"snapshot":null,"nvml":null,"rank":0,"note":"loss spike"}\n')
    out["watch"] = [tmp / "watch" / "index.jsonl", tmp / "watch"]
    try:
        out["ledger"].append(save_ledger(load_ledger(LEDGER_JSON), tmp / "ledger.parquet"))
    except Exception:  # pyarrow missing: the JSON ledger still covers the kind
        pass
    return out


def test_every_kind_with_a_file_form_sniffs_its_own_samples(sample_files):
    with_files = {k.name for k in KINDS.values() if k.sniff or k.suffixes or k.name == "rank_folder"}
    assert set(sample_files) == with_files  # a new file kind needs a sample here
    for kind, files in sample_files.items():
        for f in files:
            assert sniff_path(f) == kind, f
            assert kind_of(str(f)) == kind, f


def test_at_most_one_content_sniffer_claims_a_file(sample_files):
    for files in sample_files.values():
        for f in files:
            if f.is_dir():
                continue
            head = kinds.Head(f.name.lower(), kinds._head(f).lstrip(b"\xef\xbb\xbf \t\r\n"))
            claims = [k.name for k in KINDS.values() if k.sniff and k.sniff(head)]
            assert len(claims) <= 1, (f, claims)


def test_unknown_and_object_kinds(tmp_path, sample_files):
    from workbench.io import load_ledger, load_nvml_session, load_snapshot, load_trace

    junk = tmp_path / "notes.txt"
    junk.write_text("just some text\n")
    assert sniff_file(junk) == UNKNOWN
    assert sniff_path(tmp_path) == UNKNOWN  # a folder with no trace in it
    assert kind_of(load_trace(samples.path("h200_train_step"))) == "trace"
    assert kind_of(load_snapshot(samples.path("h200_oom_snapshot"))) == "snapshot"
    assert kind_of(load_nvml_session(samples.path("h200_nvml_session"))) == "nvml"
    assert kind_of(load_ledger(LEDGER_JSON)) == "ledger"
    assert kind_of(object()) == UNKNOWN


def test_cli_and_panels_resolve_the_same_kind(sample_files, tmp_path):
    pytest.importorskip("ipywidgets")
    from workbench.commands._checks import file_kind, input_kind
    from workbench.panels._base import classify

    for kind, files in sample_files.items():
        for f in files:
            if f.is_dir():
                continue
            cli = (file_kind(f), input_kind(f, "--flag", "a file"))
            assert cli == (kind, kind) and classify(f, "SomePanel", "a file")[0] == kind, f
    # a folder of traces: a file-taking panel says which panel shows it; a command names the folder
    folder = sample_files["rank_folder"][0]
    with pytest.raises(BadArtifact, match="RanksPanel"):
        classify(folder, "MemoryPanel", "an allocator snapshot")
    with pytest.raises(BadArtifact, match="is a folder"):
        input_kind(folder, "workbench timeline --trace", "a Kineto trace")
    assert file_kind(tmp_path / "missing.json") == "missing"


def test_every_registered_loader_panel_and_command_resolves():
    pytest.importorskip("ipywidgets")
    from workbench.cli import COMMANDS
    from workbench.panels._base import PanelBase, panel_class

    for k in KINDS.values():
        assert k.description and k.fits, k.name
        if k.loader:
            fn = k.loader_function()
            assert callable(fn) and fn.__module__.startswith("workbench.io."), k.name
        else:
            with pytest.raises(LookupError):
                k.loader_function()
        if k.panel:
            cls = panel_class(k.name)
            assert inspect.isclass(cls) and issubclass(cls, PanelBase), k.name
            assert cls.__name__ in k.fits, k.name  # the error message names the same panel
        else:
            assert panel_class(k.name) is None
        if k.command:
            assert k.command in COMMANDS, k.name
            assert callable(importlib.import_module(f"workbench.commands.{k.command}").run), k.name
    assert panel_class(UNKNOWN) is None


def test_a_panel_given_the_wrong_kind_names_the_one_that_fits(sample_files):
    pytest.importorskip("ipywidgets")
    from workbench.panels._base import wrong_kind

    err = wrong_kind(str(sample_files["nvml"][0]), "nvml", "MemoryPanel", "an allocator snapshot")
    assert "is an NVML session" in str(err) and "LiveGpuPanel" in str(err)


def test_the_cli_no_longer_reaches_into_panels():
    for path in (ROOT / "workbench" / "commands").glob("*.py"):
        assert "workbench.panels" not in path.read_text(), path
    assert not (ROOT / "workbench" / "panels" / "_source.py").exists()


def test_a_copied_sample_is_recognised_by_content_not_name(tmp_path):
    odd = tmp_path / "renamed.bin"
    shutil.copy(samples.path("h200_oom_snapshot"), odd)
    assert sniff_file(odd) == "snapshot"


@pytest.mark.parametrize("argv, kind, fix", [
    (["trace", "{snapshot}"], "a CUDA allocator snapshot", "`workbench memory {snapshot}`"),
    (["memory", "{trace}"], "a Kineto trace", "`workbench trace {trace}`"),
    (["monitor", "--replay", "{trace}", "--quiet"], "a Kineto trace", "`workbench trace {trace}`"),
    (["trace", "{nvml}"], "an NVML session", "`workbench monitor --replay {nvml}`"),
])
def test_a_command_given_another_kind_names_the_one_that_reads_it(argv, kind, fix, capsys):
    from workbench.cli import main

    files = {"snapshot": samples.path("h200_oom_snapshot"), "trace": samples.path("h200_train_step"),
             "nvml": samples.path("h200_nvml_session")}
    assert main([a.format(**files) for a in argv]) == 2
    err = capsys.readouterr().err
    names = {"snapshot": "h200_oom_snapshot", "trace": "h200_train_step", "nvml": "h200_nvml_session"}
    assert f"is {kind}, not" in err and fix.format(**names) in err, err


def test_deeply_nested_json_is_unknown_not_a_crash(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"a": ' + b"[" * 100_000)
    assert sniff_file(deep) == UNKNOWN
