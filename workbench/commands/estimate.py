"""``workbench estimate FILE.py``: predict a training step's peak GPU memory without a GPU.

FILE.py is *executed* (``runpy``), with your permissions: its module-level code runs for real, and
only the training step (model(), batch(), optimizer(), loss()) runs on fake tensors. Pass only files
you trust.
"""

from __future__ import annotations

import json
import sys


DESCRIPTION = (
    "Predict a training step's peak GPU memory without a GPU. FILE.py is executed as Python with your "
    "permissions: its module-level code runs for real (imports, file or network access, anything), and only "
    "the training step (model(), batch(), optimizer(), loss()) runs on fake tensors. Run only files you trust."
)


def add_arguments(p):
    p.description = DESCRIPTION
    p.add_argument("file", help="a .py file defining model(), batch(batch_size), optimizer(parameters) "
                                "and optionally loss(output); it is EXECUTED (module-level code runs for real)")
    p.add_argument("--batch-size", type=int, default=8, help="batch size passed to batch() (default: 8)")
    p.add_argument("--precision", metavar="{fp32,tf32,bf16,fp16}", default="fp32",
                   help="fp32/tf32, or CUDA autocast bf16/fp16 around forward and loss (default: fp32; "
                        "bfloat16/float16/float32 are read as bf16/fp16/fp32)")
    p.add_argument("--strict-fp32", action="store_true",
                   help="float32 convolutions and matmuls without TF32 (torch.backends.cudnn.allow_tf32 = False, "
                        "as the harness's fp32 reference); default: what the script's flags say, read after loading "
                        "it (untouched: cuDNN convolutions in TF32, matmuls in fp32)")
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing of each element of the model's nn.ModuleLists")
    p.add_argument("--workspaces", metavar="PATH", default=None,
                   help="cuDNN convolution workspaces measured on the GPU (a JSON table): the calls it holds use "
                        "the measured bytes instead of the rules; with --calibrate, the file the measurements go to "
                        "(extended when it exists)")
    p.add_argument("--calibrate", action="store_true",
                   help="on a CUDA machine: first measure the workspace of every distinct convolution of the step "
                        "(one forward and two backward calls per layer, seconds), then estimate with them")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")


def run(args) -> int:
    from workbench.capture.configurations import check_precision  # no torch: a bad flag is refused at once
    from workbench.errors import BadArtifact

    from workbench.commands._checks import expect_kind

    args.precision = check_precision(args.precision)  # the one check (and spelling) of a precision
    # a trace, a snapshot, a picture...: say what it is and what reads it, before running it as Python
    expect_kind(args.file, ("model_file",), "a Python model file")
    from workbench.capture.estimate import estimate, load_estimate_file

    if args.batch_size < 1:
        raise BadArtifact(args.file, f"--batch-size {args.batch_size} is not a batch size", "give 1 or more")
    table, target = _workspace_table(args)
    f = load_estimate_file(args.file)
    try:
        workload, config = f.step(precision=args.precision, batch_size=args.batch_size,
                                  checkpointing=args.checkpointing)
    except (Exception, SystemExit) as exc:
        raise user_failure(f.path, exc) from None
    strict = True if args.strict_fp32 else None
    if args.calibrate:
        table = _calibrate(f, workload, config, args.batch_size, table, target, strict)
    # a transient note on a terminal only: a refusal stays one line on stderr
    note = not args.json and sys.stderr.isatty()
    if note:
        print(f"workbench estimate: running one training step of {f.path.name} on fake tensors…", end="\r",
              file=sys.stderr, flush=True)
    try:
        e = estimate(workload, config, batch_size=args.batch_size, conv_workspaces=table, strict_fp32=strict)
    except (Exception, SystemExit) as exc:  # the user's code: KeyError, ZeroDivisionError, .cuda() on a CPU build...
        raise user_failure(f.path, exc) from None
    finally:
        if note:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(e.to_dict(), indent=1))
        return 0
    gib = 2**30
    m = e.meta
    print(f"{f.path.name}: {m['model']}, {m['parameters']:,} parameters, batch {args.batch_size}, {args.precision}"
          f"{', checkpointing' if args.checkpointing else ''}, optimizer {m['optimizer']}")
    fm = m.get("float32_math") or {}
    if fm:
        print(f"float32 math: convolutions {fm['convolutions'].upper()}, matmuls {fm['matmuls'].upper()} "
              f"({fm['source']}{'; --strict-fp32 turns TF32 off' if 'flags' in fm['source'] else ''})")
    print(f"peak allocated  {e.peak_allocated_bytes / gib:9.3f} GiB  (torch.cuda.max_memory_allocated; in {e.peak_phase})")
    low, high = e.peak_reserved_range
    rr = m.get("reserved_range") or {}
    print(f"peak reserved   {e.peak_reserved_bytes / gib:9.3f} GiB  (max_memory_reserved; + the CUDA context, "
          "which neither counts)")
    print(f"  between       {low / gib:9.3f} and {high / gib:.3f} GiB reserved ({rr.get('why', 'the rules')}"
          f"{'; WIDE' if rr.get('wide') else ''})")
    up = m.get("upper")
    if up:
        print(f"  up to         {up['peak_allocated_bytes'] / gib:9.3f} GiB allocated, {up['peak_reserved_bytes'] / gib:.3f} GiB "
              f"reserved where cuDNN's workspaces are not predictable ({up['bounded_allocations']} calls at their "
              f"most: {up.get('source') or 'cudnn_model'})")
    cw = m.get("conv_workspaces") or {}
    if cw.get("calls"):
        where = (f" on {cw['table'].get('device', 'the GPU')} (cuDNN {cw['table'].get('cudnn', '?')}"
                 + ("; the table shipped with the package for this GPU, torch and cuDNN" if cw["table"].get("shipped")
                    else "") + ")" if cw.get("table") else "")
        print(f"cuDNN convolution workspaces: {cw['measured']} of {cw['calls']} calls measured{where}"
              f", {cw['ruled']} from the rules" + ("" if cw.get("measured") else " (--calibrate on the GPU measures them)"))
    dd = m.get("data_dependent") or {}
    if dd:  # values fake tensors do not hold
        print("assumed (the data decides them; fake tensors hold none): " + ", ".join(
            {"packed_sequences": f"{dd.get('packed_sequences')} packing(s) of padded sequences taken at full length",
             "ctc_target_length": f"CTC targets of length {dd.get('ctc_target_length')}",
             "scalars": f"{dd.get('scalars')} .item() value(s) as False / 1"}.get(k, k) for k in dd))
    print("at the peak:")
    for cat, b in e.by_category.items():
        if b:
            print(f"  {cat:<20} {b / gib:9.3f} GiB")
    print("peak by phase: " + ", ".join(f"{k} {v / gib:.3f} GiB" for k, v in e.by_phase.items()))
    if e.model_flops_per_step:
        from workbench.analysis.trace.peaks import peak_for

        peak = peak_for("NVIDIA H200").compute("bf16" if args.precision in ("bf16", "fp16") else "fp32")
        floor_ms = e.model_flops_per_step / (peak * 1e12) * 1e3
        print(f"model FLOPs a step {e.model_flops_per_step / 1e12:,.4f} TFLOP (GEMMs, convolutions, attention); "
              f"at an H200's {peak:,.1f} TFLOP/s ({args.precision}) that is {floor_ms:,.3f} ms: MFU = "
              f"{floor_ms:,.3f} ms / your step time")
    return 0


_CUDA_WORDS = ("Torch not compiled with CUDA", "CUDA driver", "NVIDIA driver", "No CUDA GPUs", "CUDA error",
               "cuda:0", "CUDA is not available", "no CUDA")


def user_failure(path, exc: BaseException):
    """One :class:`BadArtifact` line for an exception of the user's model file: which function raised
    what, at which line of the file, and the fix. The exception itself rides along as
    ``.user_exception`` (``workbench --debug`` prints its traceback above the line)."""
    from pathlib import Path

    from workbench.errors import BadArtifact

    path = Path(path)
    text = " ".join(str(exc).split())
    msg = (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)
    where, line = None, None
    tb = exc.__traceback__
    mine = str(path.resolve())
    while tb is not None:  # the outermost frame in the file names the function, the innermost its line
        code = tb.tb_frame.f_code
        try:
            in_file = str(Path(code.co_filename).resolve()) == mine
        except (OSError, ValueError):
            in_file = False
        if in_file:
            where = where or code.co_name
            line = tb.tb_lineno
        tb = tb.tb_next
    who = f"{where}()" if where and where != "<module>" else "the training step"
    at = f" at line {line}" if line else ""
    if any(w.lower() in str(exc).lower() for w in _CUDA_WORDS):
        problem = f"{who} moves the model or a tensor to a CUDA device{at} ({type(exc).__name__}: {msg})"
        fix = ("Build everything on the default device, without .cuda() or .to('cuda'): the estimate puts the step "
               "on a fake CUDA device itself")
    elif isinstance(exc, TypeError) and "must return a torch.nn.Module" in str(exc):
        problem = f"model() returned {msg.rsplit('not ', 1)[-1]}, not a torch.nn.Module"
        fix = "Make model() return the torch.nn.Module to estimate"
    elif isinstance(exc, SystemExit):
        problem = f"{who} called sys.exit({exc.code!r}){at} while the training step ran on fake tensors"
        fix = "Do not exit from model(), batch(), optimizer() or loss()"
    else:
        problem = f"{who} raised {type(exc).__name__}: {msg}{at} (running the training step on fake tensors)"
        fix = ("Fix the file so that model(*batch(n)) runs on the CPU and builds on the default device "
               "(workbench --debug estimate ... shows the traceback)")
    err = BadArtifact(path, problem, fix)
    err.user_exception = exc
    return err


def _workspace_table(args):
    """(the table to estimate with or None, the checked output path for --calibrate or None)."""
    from pathlib import Path

    from workbench.analysis.memory.cudnn_model import ConvWorkspaces
    from workbench.errors import BadArgument
    from workbench.io._files import check_output

    if args.workspaces is None:
        return None, None
    if args.calibrate:
        target = check_output(args.workspaces, [args.file], what="workspace table")
        return (ConvWorkspaces.load(args.workspaces) if Path(args.workspaces).exists() else None), target
    if not Path(args.workspaces).exists():
        raise BadArgument(f"--workspaces {args.workspaces}: no such file; measure one on the GPU with "
                          f"--calibrate --workspaces {args.workspaces}")
    return ConvWorkspaces.load(args.workspaces), None


def _calibrate(f, workload, config, batch_size, table, target, strict_fp32=None):
    """Measure the step's convolution workspaces on this machine's GPU (workbench.capture.cudnn_calibration)."""
    import torch

    from workbench.analysis.memory.cudnn_model import ConvWorkspaces
    from workbench.capture.cudnn_calibration import calibrate
    from workbench.errors import BadArtifact, NoDevice

    if not torch.cuda.is_available():
        raise NoDevice("--calibrate needs a CUDA GPU (none here): run it on the GPU the estimate is for, "
                       "with --workspaces PATH, and bring PATH here")
    table = table if table is not None else ConvWorkspaces()
    try:
        calibrate(workload, config, batch_size=batch_size, table=table, progress=True, strict_fp32=strict_fp32)
    except KeyboardInterrupt:
        if target is not None and len(table):  # keep what was measured: a rerun measures only the rest
            table.save(target)
            print(f"workbench estimate: {len(table)} convolution workspaces kept in {target}", file=sys.stderr)
        raise
    except NoDevice:
        raise
    except (Exception, SystemExit) as exc:
        msg = " ".join(str(exc).split())[:300] or type(exc).__name__
        err = BadArtifact(f.path, f"measuring the convolutions failed: {type(exc).__name__}: {msg}",
                          "check that the step runs on the GPU")
        err.user_exception = exc
        raise err from None
    if target is not None:
        table.save(target)
        print(f"workbench estimate: {len(table)} convolution workspaces in {target}", file=sys.stderr)
    return table
