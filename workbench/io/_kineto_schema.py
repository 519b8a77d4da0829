"""msgspec types for Kineto trace JSON that declare only the fields gpu-workbench reads.

msgspec skips every key a Struct does not declare without building a Python object for it, so the
large per-event ``args`` of a full-detail trace (strides, python ids, occupancy...)
cost a scan and nothing more. Two sets of types:

* the *strict* ones give exact types (``int`` for correlation ids, ``float`` for times); they decode
  every trace torch, Kineto and HTA's test data have written that we have seen;
* the *lenient* ones take ``Any`` for the same fields and are used only when the strict decode raises
  a ``ValidationError`` (a field of an unexpected type in some other producer's trace); the loader
  then coerces values one by one.

A third, small set (``MemoryEvent``) serves ``io/profiler_memory.py``: the ``[memory]`` events'
allocator fields and the name/time/thread of the op and Python-function events that give them stacks.

Missing integers decode to :data:`NA_INT` (a sentinel, never a real id), so columns can be built with
``numpy.fromiter`` and masked afterwards instead of going through Python ``None``.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

__all__ = [
    "NA_INT", "NA_RAW", "Args", "Event", "TraceFile", "LenientEvent", "LenientTraceFile",
    "MemoryArgs", "MemoryEvent", "MemoryTraceFile",
]

NA_INT = -(2**63)  # sentinel for "absent" in int64 columns; masked to <NA> when the frame is built
NA_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, frozen=True, gc=False):
    external_id: int = msgspec.field(name="External id", default=NA_INT)
    correlation: int = NA_INT
    # int on NVIDIA; ROCm's runtime events carry a string ("0x...") which is not a stream id.
    stream: Union[int, str] = NA_INT
    device: int = NA_INT
    bytes: int = NA_INT
    registers: int = msgspec.field(name="registers per thread", default=NA_INT)
    # Kept as raw JSON text and interned later: decoding nested lists per cpu_op would be the single
    # most expensive thing in a record_shapes trace.
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=NA_RAW)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=NA_RAW)
    # scalar arguments as text (is_causal, stride, padding...): the roofline's FLOP formulas read them
    concrete_inputs: msgspec.Raw = msgspec.field(name="Concrete Inputs", default=NA_RAW)
    grid: msgspec.Raw = NA_RAW
    block: msgspec.Raw = NA_RAW
    # 'M' (metadata) events: process_name / thread_name carry args.name, process_labels args.labels
    name: Any = None
    labels: Any = None
    # collectives (record_param_comms ops, NCCL kernels of newer Kineto): taken as written, coerced by
    # the loader; absent on every other event, so they cost nothing there
    coll_name: Any = msgspec.field(name="Collective name", default=None)
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_id: Any = msgspec.field(name="Process Group ID", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)
    msg_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)


_NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = float("nan")
    dur: float = float("nan")
    pid: Union[int, str] = NA_INT
    tid: Union[int, str] = NA_INT
    args: Args = _NO_ARGS


class _TraceMetadata(msgspec.Struct, gc=False):
    """The file-level keys Kineto writes beside traceEvents (kept as they are, whatever their type)."""

    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    traceName: Any = None
    trace_id: Any = None
    record_shapes: Any = None
    profile_memory: Any = None
    with_stack: Any = None
    with_flops: Any = None
    with_modules: Any = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    hip_runtime_version: Any = None
    host_name: Any = None
    # written by workbench.capture.profiler.profile_steps (torch >= 2.4 preset_metadata_json)
    workbench_detail: Any = None
    workbench_unprofiled_step_ms: Any = None
    workbench_synchronized_steps: Any = None
    workbench_trailing_step: Any = None  # workbench.capture.profile(): the ProfilerStep#N after the last step()
    workbench_compile: Any = None  # workbench.capture.compile: what torch.compile did during the capture


class TraceFile(_TraceMetadata, gc=False):
    traceEvents: list[Event] = msgspec.field(default_factory=list)


class LenientEvent(msgspec.Struct, gc=False):
    ph: Any = ""
    name: Any = ""
    cat: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Any = None  # dict, or anything else a producer wrote


class LenientTraceFile(_TraceMetadata, gc=False):
    traceEvents: list[LenientEvent] = msgspec.field(default_factory=list)


# ------------------------------------------------------------------- torch.profiler's [memory] events


class MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    """The args of a ``[memory]`` instant event (``profile_memory=True``); values are taken as written
    and converted by the loader (other producers write numbers as strings)."""

    device_type: Any = msgspec.field(name="Device Type", default=None)
    bytes: Any = msgspec.field(name="Bytes", default=0)
    addr: Any = msgspec.field(name="Addr", default=0)
    total_allocated: Any = msgspec.field(name="Total Allocated", default=0)
    total_reserved: Any = msgspec.field(name="Total Reserved", default=0)


class MemoryEvent(msgspec.Struct, gc=False):
    """Any trace event, as the memory loader reads it (``args`` None when absent; ``ts`` None when absent)."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Union[MemoryArgs, None] = None


class MemoryTraceFile(msgspec.Struct, gc=False):
    traceEvents: Union[list[MemoryEvent], None] = None
