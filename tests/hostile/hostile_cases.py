"""Hostile and broken inputs for every file kind gpu-workbench reads, built from plain bytes.

Two sources, as parsers that are trusted are tested:

* ``corpus/<kind>/...``: small files kept in the repository (written once by ``make_corpus.py`` from
  the builders below, then reviewed and committed: the exact bytes are the test);
* generated cases (:func:`generated`): every field of a valid base record replaced by every hostile
  value (``HOSTILE_VALUES``), built at test time; large inputs (GiBs of spaces, one 5 GiB line, 10^8
  memo references) are generated as compressed streams that are never materialised.

Pickles that would run code all try to create ``SENTINEL`` in the current folder; the tests run in
an empty folder and assert it never appears.
"""

from __future__ import annotations

import copy
import gzip
import io
import json
import pickle
import struct
import zlib

SENTINEL = "hostile_sentinel_executed"

KINDS = ("trace", "snapshot", "nvml", "ledger", "timeline", "sidecar", "estimate")


# ------------------------------------------------------------------------------------------ pickles


def deep_tuple_bytes(depth: int) -> bytes:
    """Pickle opcodes that push a tuple nested ``depth`` deep: EMPTY_TUPLE, then TUPLE1 ``depth`` times."""
    return b")" + b"\x85" * depth


def deep_list_bytes(depth: int) -> bytes:
    """``depth`` EMPTY_LISTs then ``depth - 1`` APPENDs: a list nested ``depth`` deep, built iteratively."""
    return b"]" * depth + b"a" * (depth - 1)


def pickle_with(obj, placeholder: str, replacement: bytes) -> bytes:
    """``obj`` pickled (protocol 2: no frames), with the string ``placeholder`` swapped for the opcodes
    ``replacement`` (which must push exactly one object; the BINPUT after the string then memoizes it
    instead, so memo indices hold)."""
    data = pickle.dumps(obj, protocol=2)
    enc = placeholder.encode()
    op = b"X" + struct.pack("<I", len(enc)) + enc  # BINUNICODE
    assert data.count(op) == 1, "the placeholder must appear once"
    return data.replace(op, replacement)


def event(action="alloc", addr=0x7F0000000000, size=512, frames=True, time_us=1, **kw) -> dict:
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us}
    if frames:
        e["frames"] = [{"filename": "train.py", "line": 12, "name": "forward"},
                       {"filename": "model.py", "line": 3, "name": "Linear.forward"}]
    e.update(kw)
    return e


def base_snapshot() -> dict:
    """A tiny valid snapshot: one 2 MiB segment with one live block, four trace entries."""
    seg_addr = 0x7F0000000000
    frames = [{"filename": "train.py", "line": 12, "name": "forward"}]
    return {
        "segments": [{
            "device": 0, "address": seg_addr, "total_size": 2 << 20, "allocated_size": 1024,
            "active_size": 1024, "requested_size": 1000, "stream": 0, "segment_type": "small",
            "is_expandable": False, "frames": frames,
            "blocks": [
                {"address": seg_addr, "size": 1024, "requested_size": 1000, "state": "active_allocated",
                 "frames": frames},
                {"address": seg_addr + 1024, "size": (2 << 20) - 1024, "requested_size": 0, "state": "inactive"},
            ],
        }],
        "device_traces": [[
            event("segment_alloc", seg_addr, 2 << 20, time_us=1),
            event("alloc", seg_addr, 1024, time_us=2),
            event("alloc", seg_addr + 1024, 512, time_us=3),
            event("free_completed", seg_addr + 1024, 512, time_us=4),
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    }


# Pickles that would run code if a plain pickle.load read them: each one's payload creates SENTINEL.
def _evil_pickles() -> dict[str, bytes]:
    cmd = f"touch {SENTINEL}".encode()
    py = f"open({SENTINEL!r}, 'w').write('x')".encode()
    return {
        "global_os_system.pickle": b"cos\nsystem\n(S'" + cmd + b"'\ntR.",
        "global_posix_system.pickle": b"cposix\nsystem\n(S'" + cmd + b"'\ntR.",
        "builtins_eval.pickle": b"cbuiltins\neval\n(S\"" + py + b"\"\ntR.",
        "builtins_exec_proto2.pickle": b"\x80\x02cbuiltins\nexec\nX" + struct.pack("<I", len(py)) + py + b"\x85R.",
        "stack_global_eval.pickle": (b"\x80\x04\x8c\x08builtins\x94\x8c\x04eval\x94\x93\x94\x8c" + bytes([len(py)])
                                     + py + b"\x94\x85\x94R\x94."),
        "inst_os_system.pickle": b"(S'" + cmd + b"'\nios\nsystem\n.",
        "obj_subprocess.pickle": b"(csubprocess\ncall\n(S'touch'\nS'" + SENTINEL.encode() + b"'\nlo.",
        "newobj_popen.pickle": (b"\x80\x02csubprocess\nPopen\n(S'touch'\nS'" + SENTINEL.encode()
                                + b"'\nl\x85\x81."),
        "import_chain.pickle": (b"cbuiltins\ngetattr\n(cbuiltins\n__import__\n(S'os'\ntRS'system'\ntR(S'" + cmd
                                + b"'\ntR."),
        "ordereddict_then_eval.pickle": (b"ccollections\nOrderedDict\n)R(cbuiltins\neval\n(S\"" + py
                                         + b"\"\ntRS'x'\ntb."),
        "reduce_in_device_traces.pickle": pickle_with(
            {"segments": [], "device_traces": [["__EVIL__"]]}, "__EVIL__",
            b"cos\nsystem\n(S'" + cmd + b"'\ntR"),
        "ext1.pickle": b"\x80\x02\x82\x01.",
        "ext2.pickle": b"\x80\x02\x83\x01\x00.",
        "ext4.pickle": b"\x80\x02\x84\x01\x00\x00\x00.",
        "persid.pickle": b"P" + SENTINEL.encode() + b"\n.",
        "binpersid.pickle": b"\x80\x02X\x04\x00\x00\x00evilQ.",
        "build_setstate.pickle": (b"\x80\x02ccollections\nOrderedDict\n)R}X\x0b\x00\x00\x00__setstate__"
                                  b"cbuiltins\neval\nsb."),
        "global_in_gzip.pickle.gz": gzip.compress(b"cos\nsystem\n(S'" + cmd + b"'\ntR.", mtime=0),
        "torch_load_style.pickle": b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n)R.",
        "numpy_reconstruct.pickle": b"\x80\x02cnumpy.core.multiarray\n_reconstruct\n)R.",
    }


# the corpus pickles whose payload really runs under a plain pickle.load (a test checks it in a
# throw-away process): the sentinel proof is only as good as these
CODE_RUNNING = ("global_os_system.pickle", "global_posix_system.pickle", "builtins_eval.pickle",
                "builtins_exec_proto2.pickle", "stack_global_eval.pickle", "inst_os_system.pickle",
                "obj_subprocess.pickle", "import_chain.pickle", "reduce_in_device_traces.pickle",
                "global_in_gzip.pickle.gz")
# ...and those that name a global or a persistent id: SnapshotUnpickler refuses them before any call
REFUSED_BY_THE_UNPICKLER = CODE_RUNNING + ("newobj_popen.pickle", "ordereddict_then_eval.pickle", "persid.pickle",
                                           "binpersid.pickle", "torch_load_style.pickle", "numpy_reconstruct.pickle")


def snapshot_corpus() -> dict[str, bytes]:
    snap = base_snapshot()
    out = dict(_evil_pickles())
    ok = pickle.dumps(snap, protocol=4)
    out.update({
        "valid.pickle": ok,
        "valid_protocol0.pickle": pickle.dumps(snap, protocol=0),
        "valid_protocol2.pickle": pickle.dumps(snap, protocol=2),
        "valid_protocol5.pickle": pickle.dumps(snap, protocol=5),
        "valid.pickle.gz": gzip.compress(ok, mtime=0),
        "empty.pickle": b"",
        "empty.pickle.gz": gzip.compress(b"", mtime=0),
        "one_byte.pickle": b"\x80",
        "truncated.pickle": ok[: len(ok) // 2],
        "truncated.pickle.gz": gzip.compress(ok, mtime=0)[:-20],
        "gzip_header_only.pickle.gz": gzip.compress(ok, mtime=0)[:10],
        "not_a_pickle.pickle": b"hello, this is text\n",
        "json_named_pickle.pickle": json.dumps(snap).encode(),
        "pickle_of_int.pickle": pickle.dumps(42),
        "pickle_of_str.pickle": pickle.dumps("segments"),
        "pickle_of_none.pickle": pickle.dumps(None),
        "dict_without_keys.pickle": pickle.dumps({"a": 1}),
        "segments_not_list.pickle": pickle.dumps({"segments": "x", "device_traces": []}),
        "segments_of_ints.pickle": pickle.dumps({"segments": [1, 2, 3], "device_traces": []}),
        "device_traces_dict.pickle": pickle.dumps({"segments": [], "device_traces": {"a": 1}}),
        "device_traces_of_ints.pickle": pickle.dumps({"segments": [], "device_traces": [1]}),
        "trace_entries_of_ints.pickle": pickle.dumps({"segments": [], "device_traces": [[1, 2]]}),
        "old_segment_list.pickle": pickle.dumps(snap["segments"]),
        "old_segment_list_bad.pickle": pickle.dumps([{"blocks": "x"}]),
        "bad_opcode.pickle": b"\x80\x04\xff.",
        "stop_only.pickle": b".",
        "mark_stack_underflow.pickle": b"\x80\x02t.",
        "memo_get_missing.pickle": b"\x80\x02h\x05.",
        "long_binget_missing.pickle": b"\x80\x02j\xff\xff\xff\x7f.",
        "huge_binunicode_len.pickle": b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"abc.",
        "huge_bytearray8_len.pickle": b"\x80\x05\x96" + struct.pack("<Q", 2**62) + b".",
        "huge_frame_len.pickle": b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"}.",
        "long4_huge.pickle": b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b"\x00" * 16 + b".",
        "deep_list_20k.pickle": b"\x80\x04" + deep_list_bytes(20000) + b".",
        "deep_tuple_action_50k.pickle": pickle_with(
            {"segments": [], "device_traces": [[dict(event(), action="__DEEP__")]]}, "__DEEP__",
            deep_tuple_bytes(50000)),
        "deep_tuple_filename_50k.pickle": pickle_with(
            {"segments": [], "device_traces": [[dict(event(frames=False), frames=[
                {"filename": "__DEEP__", "line": 1, "name": "f"}])]]}, "__DEEP__", deep_tuple_bytes(50000)),
        "flipped_crc.pickle.gz": _flip_crc(gzip.compress(ok, mtime=0)),
        "flipped_isize.pickle.gz": _flip_isize(gzip.compress(ok, mtime=0)),
        "garbage_after_gzip.pickle.gz": gzip.compress(ok, mtime=0) + b"garbage!",
        "double_gzip.pickle.gz": gzip.compress(gzip.compress(ok, mtime=0), mtime=0),
        "gzip_of_text.pickle.gz": gzip.compress(b"not a pickle", mtime=0),
        "negative_segment_size.pickle": pickle.dumps(_with(snap, ("segments", 0, "total_size"), -(2 << 20))),
        "negative_event_size.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "size"), -512)),
        "address_beyond_int64.pickle": pickle.dumps(_with(snap, ("segments", 0, "address"), 2**70)),
        "event_addr_beyond_int64.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "addr"), 2**64)),
        "frame_line_float.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "frames", 0, "line"), 1.5)),
        "frame_line_str.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "frames", 0, "line"), "12")),
        "frame_line_huge.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "frames", 0, "line"), 2**80)),
        "frames_not_list.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "frames"), "abc")),
        "frames_of_ints.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "frames"), [1, 2])),
        "unknown_action.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "action"), "explode")),
        "action_list.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "action"), ["alloc"])),
        "action_dict.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "action"), {"a": 1})),
        "time_us_str.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1, "time_us"), "noon")),
        "device_huge.pickle": pickle.dumps(_with(snap, ("segments", 0, "device"), 2**40)),
        "oom_device_free_str.pickle": pickle.dumps(_with(snap, ("device_traces", 0, 1), event("oom", device_free="x"))),
        "set_of_frozensets.pickle": pickle.dumps({"segments": [], "device_traces": [], "x": {frozenset({1})}}),
    })
    return out


def _flip_crc(gz: bytes) -> bytes:
    b = bytearray(gz)
    b[-8] ^= 0xFF
    return bytes(b)


def _flip_isize(gz: bytes) -> bytes:
    b = bytearray(gz)
    b[-1] ^= 0x01
    return bytes(b)


def _with(obj, path, value):
    obj = copy.deepcopy(obj)
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return obj


# ------------------------------------------------------------------------------------------- traces


def kernel(**kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": 1000.0, "dur": 20.0, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7, "correlation": 11, "registers per thread": 64,
                  "grid": [1, 1, 1], "block": [128, 1, 1]}}
    e.update(kw)
    return e


def base_trace() -> dict:
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150 << 30}],
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 900.0, "dur": 300.0, "pid": 1,
             "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 950.0, "dur": 40.0, "pid": 1, "tid": 1,
             "args": {"External id": 5, "Input Dims": [[8, 8], [8, 8]], "Input type": ["float", "float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 960.0, "dur": 5.0, "pid": 1,
             "tid": 1, "args": {"correlation": 11, "External id": 5}},
            kernel(),
            {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 1030.0, "dur": 3.0,
             "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": 12, "bytes": 4096}},
        ],
    }


def trace_corpus() -> dict[str, bytes]:
    t = base_trace()
    ok = json.dumps(t).encode()
    evs = t["traceEvents"]
    deep = b"[" * 5000 + b"]" * 5000
    return {
        "valid.json": ok,
        "valid.json.gz": gzip.compress(ok, mtime=0),
        "valid_list_form.json": json.dumps(evs).encode(),
        "empty.json": b"",
        "whitespace.json": b"   \n\t  ",
        "empty_object.json": b"{}",
        "empty_list.json": b"[]",
        "null.json": b"null",
        "number.json": b"42",
        "string.json": b'"traceEvents"',
        "not_json.json": b"this is not json",
        "binary.json": bytes(range(256)) * 4,
        "bom.json": b"\xef\xbb\xbf" + ok,
        "utf16.json": ok.decode().encode("utf-16"),
        "invalid_utf8_name.json": ok.replace(b'"sgemm"', b'"sg\xff\xfeemm"'),
        "nul_in_name.json": ok.replace(b'"sgemm"', b'"sg\\u0000emm"'),
        "lone_surrogate.json": ok.replace(b'"sgemm"', b'"\\ud800"'),
        "truncated.json": ok[: len(ok) // 2],
        "truncated.json.gz": gzip.compress(ok, mtime=0)[:-30],
        "flipped_crc.json.gz": _flip_crc(gzip.compress(ok, mtime=0)),
        "flipped_isize.json.gz": _flip_isize(gzip.compress(ok, mtime=0)),
        "garbage_after_gzip.json.gz": gzip.compress(ok, mtime=0) + b"\x00garbage",
        "double_gzip.json.gz": gzip.compress(gzip.compress(ok, mtime=0), mtime=0),
        "gzip_header_only.json.gz": gzip.compress(ok, mtime=0)[:10],
        "trace_events_object.json": b'{"traceEvents": {"a": 1}}',
        "trace_events_string.json": b'{"traceEvents": "x"}',
        "trace_events_of_ints.json": b'{"traceEvents": [1, 2, 3]}',
        "trace_events_of_lists.json": b'{"traceEvents": [[1], [2]]}',
        "events_without_ph.json": b'{"traceEvents": [{"name": "x"}]}',
        "deep_array.json": deep,
        "deep_in_trace_events.json": b'{"traceEvents": [' + deep + b"]}",
        "deep_in_args.json": ok.replace(b'"grid": [1, 1, 1]', b'"grid": ' + deep),
        "deep_in_unused_arg.json": ok.replace(b'"grid": [1, 1, 1]', b'"grid": [1,1,1], "junk": ' + deep),
        "deep_object.json": b"{\"a\":" * 5000 + b"1" + b"}" * 5000,
        "deep_device_properties.json": ok.replace(b'"deviceProperties": [', b'"deviceProperties": [' + deep + b", "),
        "huge_exponent.json": ok.replace(b'"ts": 1000.0', b'"ts": 1e400'),
        "ts_1e308.json": ok.replace(b'"ts": 1000.0', b'"ts": 1e308'),
        "ts_negative_1e308.json": ok.replace(b'"ts": 1000.0', b'"ts": -1e308'),
        "int_beyond_uint64.json": ok.replace(b'"correlation": 11,', b'"correlation": 123456789012345678901234567890,'),
        "pid_beyond_int64.json": ok.replace(b'"pid": 0', b'"pid": 9223372036854775808'),
        "negative_huge_tid.json": ok.replace(b'"tid": 7', b'"tid": -9223372036854775809'),
        "device_properties_not_list.json": ok.replace(b'"deviceProperties": [', b'"deviceProperties": 5, "x": ['),
        "device_id_list.json": ok.replace(b'{"id": 0,', b'{"id": [0],'),
        "device_id_dict.json": ok.replace(b'{"id": 0,', b'{"id": {"a": 0},'),
        "device_name_list.json": ok.replace(b'"name": "NVIDIA H200"', b'"name": ["NVIDIA H200"]'),
        "distributed_rank_str.json": ok.replace(b'"schemaVersion": 1', b'"distributedInfo": {"rank": "0"}'),
        "distributed_rank_huge.json": ok.replace(b'"schemaVersion": 1', b'"distributedInfo": {"rank": 99999999999999999999999}'),
        "distributed_not_dict.json": ok.replace(b'"schemaVersion": 1', b'"distributedInfo": [1, 2]'),
        "process_name_deep.json": ok.replace(b'"args": {"name": "python"}', b'"args": {"name": ' + deep + b"}"),
        "name_deep.json": ok.replace(b'"name": "sgemm"', b'"name": ' + deep),
        "ph_deep.json": ok.replace(b'"ph": "X", "cat": "kernel"', b'"ph": ' + deep + b', "cat": "kernel"'),
        "pid_deep.json": ok.replace(b'"pid": 0, "tid": 7', b'"pid": ' + deep + b', "tid": 7'),
        "ts_deep.json": ok.replace(b'"ts": 1000.0', b'"ts": ' + deep),
        "labels_deep.json": ok.replace(b'{"ph": "M", "name": "process_name"', b'{"ph": "M", "name": "process_labels", "args": {"labels": ' + deep + b'}, "x": {"ph": "M", "name": "process_name"') + b"",
        "duplicate_keys.json": ok.replace(b'"ts": 1000.0', b'"ts": 1000.0, "ts": "x"'),
        "only_metadata_events.json": json.dumps({"traceEvents": [evs[0]]}).encode(),
        "ten_thousand_steps_no_gpu.json.gz": gzip.compress(json.dumps({"traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "ts": i * 10.0, "dur": 5.0,
             "pid": 1, "tid": 1} for i in range(10000)]}).encode(), mtime=0),
        "ts_descending.json": json.dumps({"traceEvents": [kernel(ts=float(1000 - i)) for i in range(50)]}).encode(),
        "zero_and_negative_dur.json": json.dumps({"traceEvents": [kernel(dur=0.0), kernel(dur=-50.0)]}).encode(),
    }


HOSTILE_VALUES: dict[str, object] = {
    "null": None, "true": True, "neg1": -1, "int64max1": 2**63, "uint64max1": 2**64 + 1, "int64min1": -(2**63) - 1,
    "big1e308": 1e308, "negbig": -1e308, "half": 1.5, "text": "x", "empty": "", "list": [], "dict": {},
    "nested": [[[[1]]]], "deep200": json.loads("[" * 200 + "]" * 200), "nul": "\u0000",
}

TRACE_FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "args", "args.correlation", "args.stream",
                "args.device", "args.External id", "args.bytes", "args.registers per thread", "args.grid",
                "args.Input Dims")


def trace_with(field: str, value) -> bytes:
    t = base_trace()
    for e in t["traceEvents"][1:]:  # every X event, so kernels, ops and copies all meet it
        if field.startswith("args."):
            e.setdefault("args", {})[field[5:]] = value
        else:
            e[field] = value
    return json.dumps(t).encode()


SNAPSHOT_FIELDS = ("event.action", "event.addr", "event.size", "event.stream", "event.time_us", "event.frames",
                   "frame.filename", "frame.line", "frame.name", "segment.address", "segment.total_size",
                   "segment.allocated_size", "segment.device", "segment.stream", "segment.segment_type",
                   "segment.blocks", "block.size", "block.address", "block.state", "block.frames", "top.segments",
                   "top.device_traces", "top.allocator_settings")


def snapshot_with(field: str, value) -> bytes:
    s = base_snapshot()
    where, key = field.split(".", 1)
    if where == "event":
        for e in s["device_traces"][0]:
            e[key] = value
    elif where == "frame":
        for e in s["device_traces"][0]:
            for f in e["frames"]:
                f[key] = value
    elif where == "segment":
        s["segments"][0][key] = value
    elif where == "block":
        for b in s["segments"][0]["blocks"]:
            b[key] = value
    else:
        s[key] = value
    return pickle.dumps(s, protocol=4)


# --------------------------------------------------------------------------------------------- NVML


def nvml_row(t=0.0, gpu=0, **kw) -> dict:
    r = {"t_s": t, "gpu": gpu, "util_gpu_pct": 97.0, "util_mem_pct": 40.0, "mem_used_bytes": 34 << 30,
         "mem_total_bytes": 141 << 30, "power_w": 312.0, "temp_c": 61.0, "sm_clock_mhz": 1980.0,
         "mem_clock_mhz": 2619.0, "throttle_reasons": "sw_power_cap"}
    r.update(kw)
    return r


def jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def nvml_corpus() -> dict[str, bytes]:
    rows = [nvml_row(t=i * 0.1) for i in range(5)]
    ok = jsonl(rows)
    csv = (b"t_s,gpu,util_gpu_pct,mem_used_bytes,throttle_reasons\n"
           b"0.0,0,97,1000,sw_power_cap\n0.1,0,98,1000,\n")
    return {
        "valid.jsonl": ok,
        "valid.jsonl.gz": gzip.compress(ok, mtime=0),
        "valid.csv": csv,
        "valid.csv.gz": gzip.compress(csv, mtime=0),
        "empty.jsonl": b"",
        "blank_lines.jsonl": b"\n\n\n",
        "not_json_line.jsonl": ok + b"{not json}\n",
        "truncated_line.jsonl": ok[:-10],
        "array_line.jsonl": b"[1, 2, 3]\n",
        "nested_value.jsonl": jsonl([nvml_row(util_gpu_pct={"a": [1]})]),
        "deep_line.jsonl": b'{"t_s": 0, "gpu": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
        "gpu_inf.jsonl": ok + b'{"t_s": 1.0, "gpu": 1e999}\n',
        "gpu_negative.jsonl": jsonl([nvml_row(gpu=-1)]),
        "gpu_huge.jsonl": jsonl([nvml_row(gpu=2**70)]),
        "gpu_fraction.jsonl": jsonl([nvml_row(gpu=0.5)]),
        "gpu_str.jsonl": jsonl([nvml_row(gpu="zero")]),
        "t_s_inf.jsonl": ok + b'{"t_s": 1e999, "gpu": 0}\n',
        "t_s_missing.jsonl": jsonl([{"gpu": 0, "util_gpu_pct": 5}]),
        "t_s_str.jsonl": jsonl([nvml_row(t="noon")]),
        "mem_beyond_int64.jsonl": jsonl([nvml_row(mem_used_bytes=2**70)]),
        "marks_only.jsonl": jsonl([{"t_s": 0.0, "mark": "a"}]),
        "mark_without_t.jsonl": ok + jsonl([{"mark": "a"}]),
        "mark_t_inf.jsonl": ok + b'{"t_s": 1e999, "mark": "x"}\n',
        "mark_list.jsonl": ok + jsonl([{"t_s": 0.2, "mark": ["a"]}]),
        "mark_huge_label.jsonl": ok + jsonl([{"t_s": 0.2, "mark": "m" * 20000}]),
        "throttle_garbage.jsonl": jsonl([nvml_row(throttle_reasons="0xZZ,,nonsense")]),
        "throttle_number.jsonl": jsonl([nvml_row(throttle_reasons=12)]),
        "legacy_names.jsonl": jsonl([{"t": 0.0, "gpu": 0, "util_gpu": 5, "power_mw": "abc"}]),
        "csv_header_only.csv": b"t_s,gpu\n",
        "csv_no_gpu.csv": b"a,b\n1,2\n",
        "csv_ragged.csv": b"t_s,gpu\n0,0,1,2,3\n1\n",
        "csv_quotes.csv": b't_s,gpu\n"0,0\n',
        "csv_binary.csv": bytes(range(256)),
        "csv_gpu_inf.csv": b"t_s,gpu\n0,inf\n",
        "csv_gpu_huge.csv": b"t_s,gpu\n0,99999999999999999999999999\n",
        "csv_t_nan.csv": b"t_s,gpu\nnan,0\n",
        "csv_crlf.csv": b"t_s,gpu\r\n0,0\r\n0.1,0\r\n",
        "csv_bom.csv": b"\xef\xbb\xbft_s,gpu\n0,0\n",
        "flipped_crc.jsonl.gz": _flip_crc(gzip.compress(ok, mtime=0)),
        "truncated.jsonl.gz": gzip.compress(ok, mtime=0)[:-12],
        "utf16.jsonl": ok.decode().encode("utf-16"),
        "invalid_utf8.jsonl": ok.replace(b"sw_power_cap", b"sw_\xff\xfe"),
    }


NVML_FIELDS = ("t_s", "gpu", "util_gpu_pct", "mem_used_bytes", "power_w", "throttle_reasons", "mark")


def nvml_with(field: str, value) -> bytes:
    rows = [nvml_row(t=i * 0.1) for i in range(3)]
    rows[1][field] = value
    return jsonl(rows)


# ------------------------------------------------------------------------- ledgers, timelines, sidecars


def ledger_doc(rows=None) -> dict:
    rows = rows if rows is not None else [
        {"experiment": "e", "configuration": "fp32", "status": "ok", "batch_size": 8, "step_ms_median": 12.5},
        {"experiment": "e", "configuration": "amp_bf16", "status": "ok", "batch_size": 8, "step_ms_median": 7.5},
    ]
    return {"format": "gpu-workbench-ledger", "version": 1, "rows": rows}


def ledger_corpus() -> dict[str, bytes]:
    ok = json.dumps(ledger_doc()).encode()
    deep = b"[" * 5000 + b"]" * 5000
    return {
        "valid.json": ok,
        "empty.json": b"",
        "not_json.json": b"nope",
        "wrong_format.json": json.dumps({"format": "x", "rows": []}).encode(),
        "rows_not_list.json": json.dumps({"format": "gpu-workbench-ledger", "rows": {"a": 1}}).encode(),
        "rows_of_ints.json": json.dumps(ledger_doc([1, 2])).encode(),
        "deep.json": deep,
        "deep_in_rows.json": ok.replace(b'"rows": [', b'"rows": [' + deep + b", "),
        "deep_value.json": ok.replace(b'"batch_size": 8', b'"batch_size": ' + deep),
        "batch_beyond_int64.json": ok.replace(b'"batch_size": 8', b'"batch_size": 123456789012345678901234567890'),
        "step_str.json": ok.replace(b'"step_ms_median": 12.5', b'"step_ms_median": "fast"'),
        "step_huge.json": ok.replace(b'"step_ms_median": 12.5', b'"step_ms_median": 1e400'),
        "gzip.json": gzip.compress(ok, mtime=0),
        "invalid_utf8.json": ok.replace(b"fp32", b"fp\xff"),
        "list_top.json": b"[1, 2]",
    }


def timeline_corpus() -> dict[str, bytes]:
    ok = json.dumps([[0, 10, 20], [[0] * 9, [0, 1, 2, 3, 4, 5, 6, 7, 8], [0] * 9]]).encode()
    deep = b"[" * 5000 + b"]" * 5000
    return {
        "valid.json": ok,
        "valid_raw.json": json.dumps([[1000, 0, 512, 3], [2000, 1, -512, 3]]).encode(),
        "empty_pair.json": b"[[], []]",
        "empty.json": b"",
        "not_json.json": b"nope",
        "object.json": b'{"a": 1}',
        "ragged_sizes.json": json.dumps([[0, 10], [[0] * 9, [0] * 3]]).encode(),
        "wrong_width.json": json.dumps([[0], [[1, 2]]]).encode(),
        "sizes_str.json": json.dumps([[0], [["a"] * 9]]).encode(),
        "times_beyond_int64.json": json.dumps([[2**70], [[0] * 9]]).encode(),
        "raw_category_huge.json": json.dumps([[1000, 0, 512, 2**62]]).encode(),
        "raw_category_beyond_int64.json": json.dumps([[1000, 0, 512, 2**70]]).encode(),
        "raw_str.json": json.dumps([["a", "b", "c", "d"]]).encode(),
        "deep.json": deep,
        "deep_in_pair.json": b"[[0], [" + deep + b"]]",
        "flipped_crc.json.gz": _flip_crc(gzip.compress(ok, mtime=0)),
    }


def sidecar_corpus() -> dict[str, bytes]:
    ok = {"device": 0, "requested_bytes": 1 << 30, "limit_bytes": 8 << 30, "device_free_bytes": 1 << 20,
          "time_unix_s": 1.7e9, "torch_version": "2.11", "torch_message": None, "memory_stats": {"a": 1}}
    deep = b"[" * 5000 + b"]" * 5000
    return {
        "valid.oom.json": json.dumps(ok).encode(),
        "empty.oom.json": b"",
        "not_json.oom.json": b"nope",
        "list.oom.json": b"[1]",
        "deep.oom.json": deep,
        "deep_value.oom.json": json.dumps(ok).encode().replace(b'"device": 0', b'"device": ' + deep),
        "limit_str.oom.json": json.dumps(ok | {"limit_bytes": "8 GiB"}).encode(),
        "limit_negative.oom.json": json.dumps(ok | {"limit_bytes": -5}).encode(),
        "limit_beyond_int64.oom.json": json.dumps(ok | {"limit_bytes": 2**70}).encode(),
        "limit_list.oom.json": json.dumps(ok | {"limit_bytes": [1]}).encode(),
        "message_dict.oom.json": json.dumps(ok | {"limit_bytes": None, "torch_message": {"x": 1}}).encode(),
        "message_allowed.oom.json": json.dumps(ok | {"limit_bytes": None, "torch_message": "9e999 GiB allowed"}).encode(),
        "message_allowed_400_digits.oom.json": json.dumps(ok | {"limit_bytes": None, "torch_message":
                                                                "1" * 400 + " GiB allowed"}).encode(),
        "message_allowed_dots.oom.json": json.dumps(ok | {"limit_bytes": None, "torch_message": "1.2.3 GiB allowed"}).encode(),
        "stats_nested.oom.json": json.dumps(ok | {"memory_stats": {"a": {"b": [1]}}}).encode(),
        "invalid_utf8.oom.json": json.dumps(ok).encode().replace(b"2.11", b"2.\xff"),
        "gzip.oom.json": gzip.compress(json.dumps(ok).encode(), mtime=0),
    }


def estimate_corpus() -> dict[str, bytes]:
    good = (b"import torch\n"
            b"def model():\n    return torch.nn.Linear(8, 8)\n"
            b"def batch(n):\n    return (torch.randn(n, 8),)\n"
            b"def optimizer(params):\n    return torch.optim.SGD(params, lr=0.1)\n")
    return {
        "valid.py": good,
        "empty.py": b"",
        "syntax_error.py": b"def model(:\n",
        "nul_bytes.py": b"x = 1\x00\n",
        "missing_functions.py": b"x = 1\n",
        "raises_at_import.py": b"raise RuntimeError('boom at import')\n",
        "sys_exit_at_import.py": b"import sys\nsys.exit(3)\n",
        "model_keyerror.py": good.replace(b"return torch.nn.Linear(8, 8)", b"return {}['missing']"),
        "model_zerodivision.py": good.replace(b"return torch.nn.Linear(8, 8)", b"return 1 / 0"),
        "model_calls_cuda.py": good.replace(b"return torch.nn.Linear(8, 8)", b"return torch.nn.Linear(8, 8).cuda()"),
        "batch_returns_int.py": good.replace(b"return (torch.randn(n, 8),)", b"return 5"),
        "model_not_module.py": good.replace(b"return torch.nn.Linear(8, 8)", b"return 42"),
        "model_exits.py": good.replace(b"return torch.nn.Linear(8, 8)", b"raise SystemExit(4)"),
        "invalid_utf8.py": b"x = '\xff\xfe'\n",
    }


def corpus() -> dict[str, dict[str, bytes]]:
    return {"trace": trace_corpus(), "snapshot": snapshot_corpus(), "nvml": nvml_corpus(),
            "ledger": ledger_corpus(), "timeline": timeline_corpus(), "sidecar": sidecar_corpus(),
            "estimate": estimate_corpus()}


# ---------------------------------------------------------------------------- generated large inputs


def gzip_repeated(prefix: bytes, unit: bytes, repeats: int, suffix: bytes = b"") -> bytes:
    """A valid gzip file of ``prefix + unit * repeats + suffix`` built without materialising it: ``unit``
    is deflated once as a self-contained block (full flush) and that block repeated; the CRC is combined
    from the CRC of ``unit`` by running crc32 over ``unit`` ``repeats`` times (fast, nothing kept)."""
    def block(data: bytes) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)

    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    crc = zlib.crc32(prefix)
    for _ in range(repeats):
        crc = zlib.crc32(unit, crc)
    crc = zlib.crc32(suffix, crc)
    size = (len(prefix) + len(unit) * repeats + len(suffix)) & 0xFFFFFFFF
    ub = block(unit)
    end = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = end.compress(suffix) + end.flush(zlib.Z_FINISH)
    return b"".join([head, block(prefix), ub * repeats, tail, struct.pack("<II", crc & 0xFFFFFFFF, size)])


def memo_bomb(n_refs: int, unit_refs: int = 4096) -> bytes:
    """A snapshot pickle whose one trace list holds ``n_refs`` memo references to one event dict,
    gzipped: 10^8 references are 200 MB of pickle, ~740 KB on disk with 4096 references per deflate
    block (~275:1), ~190 KB with 2^19 (~1000:1, deflate's best)."""
    one = pickle.dumps(event(), protocol=2)[2:-1]  # the event dict's opcodes; BINPUT 0 memoizes the dict

    def ustr(t: str) -> bytes:
        return b"X" + struct.pack("<I", len(t)) + t.encode()

    # PROTO 2, {} 'segments' [] SETITEM, 'device_traces' [ [ MARK event refs... APPENDS ] APPEND ] SETITEM
    head = b"\x80\x02}" + ustr("segments") + b"]s" + ustr("device_traces") + b"]](" + one
    unit = b"h\x00" * unit_refs  # BINGET 0: the event dict again
    return gzip_repeated(head, unit, max(1, n_refs // unit_refs), b"eas.")


def deep_action_snapshot(depth: int) -> bytes:
    return pickle_with({"segments": [], "device_traces": [[dict(event(), action="__DEEP__")]]}, "__DEEP__",
                       deep_tuple_bytes(depth))


def deep_key_snapshot(depth: int) -> bytes:
    """A dict whose *key* is a deep tuple: the unpickler itself hashes it while building the dict."""
    return b"\x80\x04}" + deep_tuple_bytes(depth) + b"K\x01s."
