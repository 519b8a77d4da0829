"""Findings' evidence as text a reader can use: numbers with units, lists as bullets, tables for records.

A finding's ``evidence`` is a plain JSON-able dict (``host_idle_us``, ``fp32_gemm_fraction``,
``top_kernels``, ``by_kind``...), made for machines. Every panel and HTML report shows findings through
:func:`findings_html` (one renderer for trace, memory and rank findings), and their evidence through
:func:`evidence_html`: the unit comes from the key's suffix (``_us`` -> µs/ms/s, ``_fraction`` -> %,
``bytes`` -> KiB/MiB/GiB, ``gb_per_s`` -> GB/s), lists become bullets with names cut to a line (the
full name on hover) and a dict of records becomes a small table.

>>> evidence_items({"idle_fraction": 0.503, "host_idle_us": 12_900.0, "host_idle_fraction": 0.437})
[('GPU idle', '50.3%'), ('host idle', '12.9 ms (43.7%)')]
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

from workbench.units import format_bytes, format_us

__all__ = ["evidence_items", "evidence_html", "format_value", "findings_html", "what_if_html", "diagnosis_html",
           "readable_header", "readable_frame"]

# keys whose generic label reads badly
_LABELS = {
    "kernel_us": "all kernels",
    "window_us": "profiled window",
    "fp32_gemm_us": "fp32 GEMM time",
    "fp32_gemm_kernels": "fp32 GEMM launches",
    "tensor_core_gemm_us": "tensor-core GEMM time",
    "idle_fraction": "GPU idle",
    "memory_us": "unhidden copy time",
    "memory_fraction": "unhidden copies",
    "heavy_profiling": "recorded with stacks/memory",
    "top_kernels": "fp32 GEMM kernels",
    "calls": "blocking calls",
    "callers": "called from",
    "by_kind": "copies by kind",
    "kernels_per_ms": "kernel rate",
    "short_kernel_fraction": "kernels under 10 µs",
    "dataloader_us": "DataLoader calls",
    "x_events": "events",
}
_SKIP = {"device"}  # already in the panel's header / report title


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    k = key
    for suffix in ("_us", "_bytes", "_pct"):
        if k.endswith(suffix):
            k = k[: -len(suffix)]
    k = k.replace("_fraction", "").replace("_per_", " per ").replace("gb_per_s", "throughput")
    return k.replace("_", " ").strip() or key


def format_value(key: str, value) -> str:
    """One evidence value as text, its unit taken from the key (``*_us``, ``*_fraction``, ``bytes``...)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        v = float(value)
        if math.isnan(v):
            return "n/a"
        if key.endswith("_us"):
            return format_us(v)
        if key.endswith("_fraction"):
            return f"{v * 100:.1f}%"
        if key.endswith("_pct"):
            return f"{v:.1f}%"
        if key == "bytes" or key.endswith("_bytes"):
            return format_bytes(v, significant=3)
        if key.endswith("gb_per_s"):
            return f"{v:,.1f} GB/s"
        if key.endswith("_per_ms"):
            return f"{v:,.3g} per ms"
        if isinstance(value, int) or v.is_integer():
            return f"{int(v):,}"
        return f"{v:,.3g}"
    return str(value)


def evidence_items(evidence: Mapping | None) -> list[tuple[str, str]]:
    """The scalar entries of an evidence dict as ``(label, value with unit)`` pairs, in their order.
    A share that has its time beside it (``host_idle_fraction`` next to ``host_idle_us``) goes in
    brackets after that time instead of on its own."""
    ev = dict(evidence or {})
    merged = {k for k in ev if k.endswith("_fraction") and k not in _LABELS
              and isinstance(ev.get(k[: -len("_fraction")] + "_us"), (int, float))}
    out = []
    for k, v in ev.items():
        if k in _SKIP or k in merged or isinstance(v, (list, tuple, Mapping)):
            continue
        text = format_value(str(k), v)
        share = str(k)[: -len("_us")] + "_fraction" if str(k).endswith("_us") else None
        if share in merged:
            text += f" ({format_value(share, ev[share])})"
        out.append((_label(str(k)), text))
    return out


def _name_html(name: str, width: int = 90) -> str:
    # kernel names: the template arguments carry the tile/precision, so cut the raw name, keep them
    s = str(name)[5:] if str(name).startswith("void ") else str(name)
    short = s if len(s) <= width else s[: width - 1] + "…"
    title = f" title='{html.escape(str(name), quote=True)}'" if short != str(name) else ""
    return f"<code{title}>{html.escape(short)}</code>"


def _records_table(records: Mapping) -> str:
    cols: list[str] = []
    for rec in records.values():
        for c in rec:
            if c not in cols:
                cols.append(c)
    head = "<th style='text-align:left;padding:0 8px 0 0'></th>" + "".join(
        f"<th style='text-align:right;padding:0 8px'>{html.escape(_label(c))}</th>" for c in cols)
    body = "".join(
        "<tr><td style='padding:0 8px 0 0'>" + html.escape(str(name)) + "</td>" + "".join(
            f"<td style='text-align:right;padding:0 8px'>{html.escape(format_value(c, rec.get(c)))}</td>"
            for c in cols) + "</tr>"
        for name, rec in records.items()
    )
    return f"<table class='wb-evidence-table' style='border-collapse:collapse'><tr>{head}</tr>{body}</table>"


def evidence_html(evidence: Mapping | None, *, max_list: int = 5) -> str:
    """HTML for an evidence dict: scalars as ``label value`` items separated by dots, lists as bullet
    lists (names shortened, the full name on hover), ``{name: count}`` dicts as ``name ×count`` bullets
    and ``{name: {field: value}}`` dicts as a small table. Empty string when there is nothing to show."""
    if not evidence:
        return ""
    items = " · ".join(
        f"<span class='wb-evidence-item'>{html.escape(lab)} <b>{html.escape(val)}</b></span>"
        for lab, val in evidence_items(evidence)
    )
    blocks = [f"<div>{items}</div>"] if items else []
    for k, v in evidence.items():
        if k in _SKIP or not isinstance(v, (list, tuple, Mapping)) or not v:
            continue
        label = html.escape(_label(str(k)))
        if isinstance(v, Mapping) and all(isinstance(r, Mapping) for r in v.values()):
            blocks.append(f"<div>{label}:</div>{_records_table(v)}")
            continue
        if isinstance(v, Mapping):
            lis = [f"<li>{_name_html(str(n))} ×{html.escape(format_value('count', c))}</li>"
                   for n, c in list(v.items())[:max_list]]
        else:
            lis = [f"<li>{_name_html(str(n))}</li>" for n in list(v)[:max_list]]
        more = f"<li>… {len(v) - max_list} more</li>" if len(v) > max_list else ""
        blocks.append(f"<div>{label}:</div><ul style='margin:0 0 0 1.2em;padding:0'>{''.join(lis)}{more}</ul>")
    if not blocks:
        return ""
    return f"<div class='wb-evidence' style='color:#555;font-size:11px;line-height:1.5'>{''.join(blocks)}</div>"


def what_if_html(w: dict | None) -> str:
    """A finding's what-if as one line: step time now and with the fix, and the saving."""
    if not w:
        return ""
    return (f"<div class='wb-whatif' style='margin:2px 0 0 0'><b>What if fixed:</b> "
            f"{w['step_ms']:,.2f} ms &rarr; {w['step_ms_if_fixed']:,.2f} ms a step "
            f"(saves <b>{100 * w['saved_fraction']:.0f}%</b>)"
            f"{' (measured)' if w.get('measured') else ''}: {html.escape(str(w.get('change', '')))}</div>")


_SEVERITY_COLORS = {"critical": "#d55e00", "warning": "#e69f00", "info": "#0072b2"}


def findings_html(findings, diagnosis=None, *, empty: str = "<p>No findings.</p>") -> str:
    """Findings (:class:`~workbench.analysis.findings.Finding` objects or their JSON dicts) as HTML:
    the diagnosis first when given, then one ``<div class='finding SEV wb-finding wb-finding-SEV'>`` a
    finding (id, severity, message, what-if, evidence as numbers with units), a border in the
    severity's colour. ``empty``: what to show when there are none (after the diagnosis). The panels
    and the HTML reports all render findings with this."""
    parts = [diagnosis_html(diagnosis)] if diagnosis else []
    for f in findings or []:
        get = f.get if isinstance(f, Mapping) else (lambda k, d=None, _f=f: getattr(_f, k, d))
        sev = str(get("severity", "info"))
        cls = html.escape(sev, quote=True)
        parts.append(
            f"<div class='finding {cls} wb-finding wb-finding-{cls}' "
            f"style='border-left:4px solid {_SEVERITY_COLORS.get(sev, '#888')};padding:2px 8px;margin:3px 0'>"
            f"<b>{html.escape(str(get('id', '')))}</b> ({html.escape(sev)}): "
            f"{html.escape(str(get('message', '')))}"
            f"{what_if_html(get('what_if'))}{evidence_html(get('evidence') or {})}</div>"
        )
    if not findings:
        parts.append(empty)
    return "".join(parts)


def diagnosis_html(d) -> str:
    """The diagnosis block shown above the findings (a Diagnosis or its dict)."""
    if not d:
        return ""
    from workbench.analysis.trace.diagnosis import summary_text

    return (f"<div class='wb-diagnosis' style='font-weight:600;margin:4px 0 6px 0'>"
            f"{html.escape(summary_text(d))}</div>")


# -- tables for reading ------------------------------------------------------------------------------

_WORDS = {"cpu": "CPU", "gpu": "GPU", "device": "GPU", "pct": "%", "id": "id", "mem": "memory", "dur": "length",
          "util": "utilisation", "sm": "SM", "hbm": "HBM", "pcie": "PCIe", "nccl": "NCCL", "oom": "OOM"}
# suffix -> (unit shown in the header, scale from the stored unit)
_UNITS = (("_us", "ms", 1e-3), ("_ms", "ms", 1.0), ("_bytes", "MiB", 1.0 / 2**20), ("_fraction", "%", 100.0),
          ("_pct", "%", 1.0), ("_w", "W", 1.0), ("_mhz", "MHz", 1.0), ("_c", "°C", 1.0), ("_s", "s", 1.0))
_UNIT_FORMATS = {"ms": "{:,.3f}", "MiB": "{:,.2f}", "%": "{:.1f}", "W": "{:,.0f}", "MHz": "{:,.0f}", "°C": "{:.0f}",
                 "s": "{:,.2f}"}


def readable_header(column: str) -> tuple[str, str | None, float]:
    """``(header, unit, scale)`` for a snake_case column: ``total_us`` -> ``("total (ms)", "ms", 1e-3)``,
    ``device_self_us`` -> ``GPU self (ms)``, ``kernel_count`` -> ``kernel count``; a column that already
    reads as words (spaces, no underscore) is kept."""
    if "_" not in column or " " in column:
        return column, None, 1.0
    unit, scale, stem = None, 1.0, column
    for suffix, u, sc in _UNITS:
        if column.endswith(suffix) and len(column) > len(suffix):
            unit, scale, stem = u, sc, column[: -len(suffix)]
            break
    words = " ".join(_WORDS.get(w, w) for w in stem.split("_") if w)
    if column == "percent":
        return "%", "%", 1.0
    return (f"{words} ({unit})" if unit else words), unit, scale


def readable_frame(df) -> tuple[object, dict[str, str]]:
    """A copy of ``df`` for reading (times in ms, bytes in MiB, fractions in %, headers in words with
    their unit) and the float format of each converted column. Non-numeric columns keep their values."""
    import pandas as pd

    out = pd.DataFrame(index=df.index)
    formats: dict[str, str] = {}
    for c in df.columns:
        header, unit, scale = readable_header(str(c))
        col = df[c]
        if unit is not None and pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
            col = col.astype("float64") * scale
            formats[header] = _UNIT_FORMATS.get(unit, "{:,.3f}")
        elif str(c) == "percent":
            header = "share (%)"
            formats[header] = "{:.1f}"
        if header in out.columns:  # two columns reading the same: keep the source name
            header = str(c)
        out[header] = col
    return out, formats
