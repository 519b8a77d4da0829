"""What a GPU can do on paper: dense peak TFLOP/s per dtype and memory bandwidth, from vendor datasheets.

:func:`peak_for` matches a trace's device name (``deviceProperties[].name``, e.g. ``"NVIDIA H100 80GB
HBM3"``, ``"Tesla V100-SXM2-32GB"``, ``"NVIDIA A100-PG509-200"``) to a row of :data:`PEAKS`; where the
name says nothing (ROCm reports ``"AMD Radeon Graphics"``) the compute-unit count and warp size in the
device properties decide. Every figure can be overridden (``peak_for(name, override={"bf16": 900,
"gbps": 4000})`` or ``workbench trace --peak bf16=900``), and :func:`peak_from_ceilings` turns measured
ceilings (:mod:`workbench.capture.ceilings`) into the same record.

All TFLOP/s are **dense** (the datasheets' "with sparsity" figures halved where only those are printed);
``fp32`` is the non-tensor-core rate on NVIDIA and the matrix-core fp32 rate on AMD (what an fp32 GEMM
runs at). Bandwidth is HBM/GDDR GB/s (10^9 bytes/s). AMD MI250/MI250X appear to ROCm as two devices (one
per GCD) and the trace's times are per GCD, so their rows are per GCD (half the package datasheet).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from workbench.errors import BadArgument

__all__ = ["Peak", "PEAKS", "peak_for", "peak_from_ceilings", "parse_peak_overrides", "DTYPES", "CONV_SPEEDUPS",
           "conv_speedups"]

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class Peak:
    """One GPU's ceilings: ``tflops[dtype]`` dense TFLOP/s (missing: no such unit), ``gbps`` memory GB/s."""

    name: str
    tflops: Mapping[str, float]
    gbps: float
    source: str = "datasheet"
    matched: str = ""  # the device name it was matched on
    overridden: tuple = field(default=())  # keys the user set

    def compute(self, dtype: str | None) -> float | None:
        """Peak TFLOP/s for ``dtype`` (None / unknown: bf16, the tensor-core rate MFU is quoted against)."""
        if dtype in self.tflops:
            return float(self.tflops[dtype])
        if dtype == "fp16" and "bf16" in self.tflops:
            return float(self.tflops["bf16"])
        if dtype == "bf16" and "fp16" in self.tflops:  # V100: no bf16 unit, fp16 is its tensor-core rate
            return float(self.tflops["fp16"])
        return float(self.tflops["bf16"]) if "bf16" in self.tflops else None

    def as_dict(self) -> dict:
        return {"device": self.name, "peak_tflops": {k: self.tflops[k] for k in DTYPES if k in self.tflops},
                "peak_gbps": self.gbps, "source": self.source}


def _p(name, gbps, source, **tflops):
    return Peak(name, {k: float(v) for k, v in tflops.items()}, float(gbps), source)


# (pattern on the upper-cased name, Peak). First match wins, so the narrower rows come first.
# Sources: NVIDIA H200 / H100 / A100 / V100 / L4 / L40S / L40 product datasheets, AMD Instinct MI300X /
# MI250X / MI250 datasheets (all "dense" figures; sparse-only figures halved).
PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"\bH200\b.*\bNVL\b", _p("H200 NVL", 4800, "NVIDIA H200 NVL datasheet",
                              fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5)),
    (r"\bH200\b", _p("H200 SXM", 4800, "NVIDIA H200 SXM datasheet",
                     fp64=67, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9)),
    (r"\bH100\b.*\bNVL\b", _p("H100 NVL", 3900, "NVIDIA H100 NVL datasheet",
                              fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5)),
    (r"\bH100\b.*\bPCIE\b", _p("H100 PCIe", 2000, "NVIDIA H100 PCIe datasheet",
                               fp64=51, fp32=51.2, tf32=378, bf16=756, fp16=756, fp8=1513, int8=1513)),
    (r"\bH100\b", _p("H100 SXM", 3350, "NVIDIA H100 SXM datasheet",
                     fp64=67, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9)),
    (r"\bA100\b.*\b80\s?GB\b.*\bPCIE\b", _p("A100 80GB PCIe", 1935, "NVIDIA A100 datasheet",
                                            fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624)),
    (r"\bA100\b.*\b80\s?GB\b", _p("A100 80GB SXM", 2039, "NVIDIA A100 datasheet",
                                  fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624)),
    (r"\bA100\b", _p("A100 40GB", 1555, "NVIDIA A100 datasheet (40GB)",
                     fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624)),
    (r"\bV100S\b", _p("V100S PCIe", 1134, "NVIDIA V100S datasheet", fp64=8.2, fp32=16.4, fp16=130)),
    (r"\bV100\b.*\bPCIE\b", _p("V100 PCIe", 900, "NVIDIA V100 datasheet", fp64=7, fp32=14, fp16=112)),
    (r"\bV100\b", _p("V100 SXM2", 900, "NVIDIA V100 datasheet", fp64=7.8, fp32=15.7, fp16=125)),
    (r"\bL40S\b", _p("L40S", 864, "NVIDIA L40S datasheet",
                     fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733)),
    (r"\bL40\b", _p("L40", 864, "NVIDIA L40 datasheet",
                    fp32=90.5, tf32=90.5, bf16=181.05, fp16=181.05, fp8=362, int8=362)),
    (r"\bL4\b", _p("L4", 300, "NVIDIA L4 datasheet",
                   fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5)),
    (r"\bT4\b", _p("T4", 320, "NVIDIA T4 datasheet", fp32=8.1, fp16=65, int8=130)),
    (r"\bMI300X\b", _p("MI300X", 5300, "AMD Instinct MI300X datasheet",
                       fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9)),
    (r"\bMI250X\b", _p("MI250X (one GCD)", 1638.4, "AMD Instinct MI250X datasheet, per GCD",
                       fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5, int8=191.5)),
    (r"\bMI250\b", _p("MI250 (one GCD)", 1638.4, "AMD Instinct MI250 datasheet, per GCD",
                      fp64=45.25, fp32=45.25, bf16=181.05, fp16=181.05, int8=181.05)),
)

# AMD devices by (warp size, compute units) where ROCm reports only "AMD Radeon Graphics".
_AMD_BY_CUS = {304: "MI300X", 110: "MI250X", 104: "MI250"}


def _normalise(name: str) -> str:
    s = name.upper().replace("_", " ").replace("-", " ")
    return re.sub(r"\s+", " ", s).strip()


def peak_for(device: str | None, properties: Mapping | None = None,
             override: Mapping[str, float] | Peak | None = None) -> Peak | None:
    """The :class:`Peak` of ``device`` (a deviceProperties name), or None when no row matches.

    ``properties`` (one ``deviceProperties`` entry) settles names that say nothing (ROCm's "AMD Radeon
    Graphics": by compute units). ``override``: a Peak (used as is) or ``{dtype: TFLOP/s, "gbps": GB/s,
    "name": ...}`` applied on top of the matched row (or on an empty row when nothing matched).

    >>> peak_for("NVIDIA H100 80GB HBM3").name
    'H100 SXM'
    >>> peak_for("NVIDIA H200").tflops["bf16"], peak_for("NVIDIA H200").gbps
    (989.4, 4800.0)
    """
    if isinstance(override, Peak):
        return override
    found = None
    norm = _normalise(device or "")
    for pattern, peak in PEAKS:
        if re.search(pattern, norm):
            found = replace(peak, matched=device or "")
            break
    if found is None and properties and int(properties.get("warpSize", 0) or 0) == 64:
        key = _AMD_BY_CUS.get(int(properties.get("numSms", 0) or 0))
        if key:
            found = next(replace(p, matched=device or "") for pat, p in PEAKS if re.search(pat, key))
    if override:
        base = found or Peak(str(override.get("name", device or "unknown GPU")), {}, float("nan"), "user")
        tflops = dict(base.tflops)
        gbps = base.gbps
        for k, v in override.items():
            if k == "name":
                continue
            if k == "gbps":
                gbps = float(v)
            elif k in DTYPES:
                tflops[k] = float(v)
            else:
                raise BadArgument(f"peak override {k!r}: use one of {', '.join(DTYPES)}, gbps")
        src = base.source if found else "user"
        found = replace(base, tflops=tflops, gbps=gbps, source=f"{src} + user override" if found else src,
                        overridden=tuple(sorted(k for k in override if k != "name")))
    return found


def parse_peak_overrides(items: list[str] | None) -> dict[str, float]:
    """``["bf16=900", "gbps=4000"]`` (the CLI's ``--peak``) → ``{"bf16": 900.0, "gbps": 4000.0}``."""
    out: dict[str, float] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        try:
            if not sep or (key not in DTYPES and key != "gbps"):
                raise ValueError
            out[key] = float(value)
        except ValueError:
            raise BadArgument(f"--peak {item!r}: write DTYPE=TFLOPS or gbps=GB/s, DTYPE one of "
                              f"{', '.join(DTYPES)} (e.g. --peak bf16=989.4 --peak gbps=4800)") from None
    return out


def peak_from_ceilings(ceilings: Mapping, name: str | None = None) -> Peak:
    """A :class:`Peak` from the measured ceilings' JSON (:func:`workbench.capture.ceilings.measure_ceilings`)."""
    tflops = {k: float(v["tflops"]) for k, v in (ceilings.get("matmul") or {}).items()}
    gbps = float((ceilings.get("copy") or {}).get("gbps", float("nan")))
    return Peak(name or f"{ceilings.get('device', 'GPU')} (measured)", tflops, gbps, "measured")


# What cuDNN's convolutions gain over strict fp32 (fp32 NCHW, TF32 off; cudnn.benchmark off, as by default):
# the median over 26 common layer shapes (1x1, 3x3, strided, stems; 3-512 channels, 7-256 px, batch 32-128)
# of forward + both backward convolutions, timed with CUDA events by benchmarks/record_conv_ceilings_h200.py
# (tests/data/h100_pairs/conv_ceilings.json; tests/test_fix_pairs_hopper.py checks these against it).
# Convolutions gain less than GEMMs from tensor cores (the datasheet's fp32 -> tf32 ratio is 7.4x) and NCHW
# bf16 convolutions pay layout transposes that channels_last avoids. Measured on Hopper; used for Hopper GPUs.
CONV_SPEEDUPS: tuple[tuple[str, dict], ...] = (
    (r"\b(GH200|H200|H100)\b", {"tf32": 3.19, "bf16_nchw": 5.82, "bf16_nhwc": 7.72,
                                 "source": "measured on an H100 80GB HBM3 (cuDNN 9.19, torch 2.11), 26 layer shapes, "
                                           "2026-12-05"}),
)


def conv_speedups(device: str | None) -> dict | None:
    """The measured convolution speed-ups of :data:`CONV_SPEEDUPS` for ``device`` (None: not measured)."""
    norm = _normalise(device or "")
    return next((dict(v) for pat, v in CONV_SPEEDUPS if re.search(pat, norm)), None)

